package kit

import (
	"encoding/binary"
	"fmt"
	"hash"
	"hash/fnv"
	"strconv"

	"github.com/davecgh/go-spew/spew"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/rand"
)

// printer renders objects deterministically (sorted map keys, no String
// methods), so the same object always hashes the same. Upstream controllers
// hash the same rendering, so tether names ReplicaSets and revisions as
// kube-controller-manager would for the same template and API version.
var printer = spew.ConfigState{Indent: " ", SortKeys: true, DisableMethods: true, SpewKeys: true}

// writeObject renders obj into h.
func writeObject(h hash.Hash, obj any) {
	h.Reset()
	printer.Fprintf(h, "%#v", obj)
}

// TemplateHash is the pod-template-hash of a Deployment's template: FNV-32a
// of its rendering, followed by the collision count when there is one,
// encoded with only consonants and digits so it never spells words.
func TemplateHash(template *corev1.PodTemplateSpec, collisionCount *int32) string {
	h := fnv.New32a()
	writeObject(h, *template)
	if collisionCount != nil {
		b := make([]byte, 8)
		binary.LittleEndian.PutUint32(b, uint32(*collisionCount))
		h.Write(b)
	}
	return rand.SafeEncodeString(fmt.Sprint(h.Sum32()))
}

// RevisionHash is the hash of a ControllerRevision's data, salted with the
// collision count when there is one; it names the revision and is the
// controller-revision-hash label of the pods made from it.
func RevisionHash(cr *appsv1.ControllerRevision, collisionCount *int32) string {
	h := fnv.New32()
	if len(cr.Data.Raw) > 0 {
		h.Write(cr.Data.Raw)
	}
	if cr.Data.Object != nil {
		printer.Fprintf(h, "%#v", cr.Data.Object)
	}
	if collisionCount != nil {
		h.Write([]byte(strconv.FormatInt(int64(*collisionCount), 10)))
	}
	return rand.SafeEncodeString(fmt.Sprint(h.Sum32()))
}
