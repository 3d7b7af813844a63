package fleet

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// Staging is an ImageStaging as the page shows it.
type Staging struct {
	Name, Phase   string
	Images        string // the images, comma separated
	Nodes, Staged int32
	Created       time.Time
}

// Stagings lists the ImageStagings, those whose nodes do not all hold
// their images first, then the latest staged ones.
func Stagings(ss []*fleetapi.ImageStaging) []Staging {
	var open, done []Staging
	for _, s := range ss {
		st := Staging{Name: s.Name, Phase: cmp.Or(s.Status.Phase, fleetapi.StagingPending), Images: strings.Join(s.Spec.Images, ", "),
			Nodes: s.Status.Nodes, Staged: s.Status.Staged, Created: s.CreationTimestamp.Time}
		if st.Phase == fleetapi.StagingStaged {
			done = append(done, st)
		} else {
			open = append(open, st)
		}
	}
	newest := func(a, b Staging) int { return cmp.Or(b.Created.Compare(a.Created), cmp.Compare(a.Name, b.Name)) }
	slices.SortFunc(open, newest)
	slices.SortFunc(done, newest)
	return append(open, done[:min(len(done), shownDone)]...)
}

// imageStagingOf reads an ImageStaging the dynamic informer holds.
func imageStagingOf(o any) (*fleetapi.ImageStaging, bool) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, false
	}
	var s fleetapi.ImageStaging
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s); err != nil {
		return nil, false
	}
	return &s, true
}
