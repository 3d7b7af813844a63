package storage

import (
	"reflect"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// A custom resource is defaulted on every read (Kind.DefaultOnRead), but
// its objects are defaulted on write as well, so that reading them almost
// never changes anything. readDefaults remembers the stored states that
// decoding, watches and writes found unchanged by the defaults on read,
// so that ListJSON can send those as stored instead of decoding and
// encoding every item of every list again.

// readDefaultsMax bounds how many states are remembered; beyond it the
// memory starts afresh (a miss only costs a decode).
const readDefaultsMax = 1 << 20

// rdKey names an object as one kind reads it.
type rdKey struct {
	kind *registry.Kind
	key  store.Key
}

// readDefaults maps objects to the revision of theirs that DefaultOnRead
// leaves as stored.
type readDefaults struct {
	mu sync.RWMutex
	// guards the following field
	m map[rdKey]int64
}

// note remembers that the kind's DefaultOnRead leaves key at rev as stored.
func (r *readDefaults) note(k *registry.Kind, key store.Key, rev int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil || len(r.m) >= readDefaultsMax {
		r.m = map[rdKey]int64{}
	}
	r.m[rdKey{k, key}] = rev
}

// unchanged reports, for each object, whether it is known that the
// kind's DefaultOnRead leaves it as stored.
func (r *readDefaults) unchanged(k *registry.Kind, objs []store.Object) []bool {
	out := make([]bool, len(objs))
	r.mu.RLock()
	defer r.mu.RUnlock()
	for i, o := range objs {
		rev, ok := r.m[rdKey{k, o.Key}]
		out[i] = ok && rev == o.Revision
	}
	return out
}

// forget drops what is remembered of kinds v no longer serves.
func (r *readDefaults) forget(v *kindView) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for key := range r.m {
		if v.byGVK[key.kind.GVK] != key.kind {
			delete(r.m, key)
		}
	}
}

// defaultOnRead applies k's DefaultOnRead to obj, decoded as sk, and
// reports whether it left an unstructured object of the stored kind as it
// was.
func defaultOnRead(k, sk *registry.Kind, obj runtime.Object) bool {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || sk != k {
		k.DefaultOnRead(obj)
		return false
	}
	before := u.DeepCopy()
	k.DefaultOnRead(obj)
	return jsonEqual(before.Object, u.Object)
}

// jsonEqual is reflect.DeepEqual for the values of unstructured objects
// (maps, slices, strings, numbers, booleans, nil), without reflection,
// which on every decoded custom object cost as much as copying it. Values
// of other types are compared with reflect.DeepEqual.
func jsonEqual(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) || (a == nil) != (b == nil) {
			return false
		}
		for k, av := range a {
			bv, ok := b[k]
			if !ok || !jsonEqual(av, bv) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) || (a == nil) != (b == nil) {
			return false
		}
		for i := range a {
			if !jsonEqual(a[i], b[i]) {
				return false
			}
		}
		return true
	case string:
		b, ok := b.(string)
		return ok && a == b
	case int64:
		b, ok := b.(int64)
		return ok && a == b
	case bool:
		b, ok := b.(bool)
		return ok && a == b
	case nil:
		return b == nil
	}
	return reflect.DeepEqual(a, b)
}

// decodeState decodes a state the store holds (never a dry run's result,
// whose revision is not its own) and remembers whether the defaults on
// read left it as stored.
func (s *Storage) decodeState(k *registry.Kind, o store.Object) (runtime.Object, error) {
	obj, same, err := s.decodeReporting(k, o)
	if same {
		s.rdefaults.note(k, o.Key, o.Revision)
	}
	return obj, err
}
