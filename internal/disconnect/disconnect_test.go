package disconnect

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestParse(t *testing.T) {
	path := field.NewPath("metadata", "annotations")
	p, errs := Parse(map[string]string{"other": "x"}, path)
	if len(errs) != 0 || p != Default() {
		t.Fatalf("no annotations: %+v %v", p, errs)
	}
	if p.Toleration().TolerationSeconds != nil {
		t.Fatal("default policy tolerates an unreachable node for a bounded time")
	}
	p, errs = Parse(map[string]string{LostAfterAnnotation: "60s", ReplaceAnnotation: "true", ReconcileAnnotation: "longestRunning"}, path)
	if len(errs) != 0 || p != (Policy{LostAfter: time.Minute, Replace: true, Reconcile: LongestRunning}) {
		t.Fatalf("full policy: %+v %v", p, errs)
	}
	if s := p.Toleration().TolerationSeconds; s == nil || *s != 60 {
		t.Fatalf("toleration seconds = %v", s)
	}
	for name, ann := range map[string]map[string]string{
		"negative":  {LostAfterAnnotation: "-1s"},
		"garbage":   {LostAfterAnnotation: "soon"},
		"fraction":  {LostAfterAnnotation: "1500ms"},
		"replace":   {ReplaceAnnotation: "yes"},
		"reconcile": {ReconcileAnnotation: "bestScore"},
		"unknown":   {Prefix + "lostafter": "60s"},
	} {
		_, errs := Parse(ann, path)
		if len(errs) != 1 {
			t.Errorf("%s: errors %v, want one", name, errs)
			continue
		}
		for k := range ann {
			if want := path.Key(k).String(); errs[0].Field != want {
				t.Errorf("%s: error at %s, want %s", name, errs[0].Field, want)
			}
		}
	}
}
