package imagestaging

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/fleetapi"
)

func node(name, site string, images ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"topology.kubernetes.io/zone": site}}}
	for _, im := range images {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: []string{im}, SizeBytes: 1})
	}
	return n
}

func TestAggregate(t *testing.T) {
	now := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC) // a Monday
	st := &fleetapi.ImageStaging{
		ObjectMeta: metav1.ObjectMeta{Name: "s", Generation: 3},
		Spec: fleetapi.ImageStagingSpec{
			Images:       []string{"registry.local:5000/app:v1", "nginx"},
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"topology.kubernetes.io/zone": "shop"}},
		},
	}
	nodes := []*corev1.Node{
		node("a", "shop", "registry.local:5000/app:v1", "docker.io/library/nginx:latest"),
		node("b", "shop", "registry.local:5000/app:v1"),
		node("c", "shop"),
		node("d", "factory", "registry.local:5000/app:v1", "docker.io/library/nginx:latest"),
	}
	got := Aggregate(st, nodes, now)
	if got.Nodes != 3 || got.Staged != 1 || got.Phase != fleetapi.StagingPending || got.ObservedGeneration != 3 {
		t.Errorf("status %+v: want 3 nodes, 1 staged, Pending, generation 3", got)
	}
	if len(got.Images) != 2 || got.Images[0].Nodes != 2 || got.Images[1].Nodes != 1 || got.Images[1].Image != "nginx" {
		t.Errorf("images %+v: want app on 2 nodes, nginx on 1", got.Images)
	}
	if c := meta.FindStatusCondition(got.Conditions, fleetapi.ConditionStaged); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Staged condition %+v, want False", c)
	}

	// A closed window: Waiting.
	st.Spec.Window = &fleetapi.MaintenanceWindow{Start: "02:00", Duration: metav1.Duration{Duration: 2 * time.Hour}}
	if got := Aggregate(st, nodes, now); got.Phase != fleetapi.StagingWaiting {
		t.Errorf("phase %q with the window shut, want Waiting", got.Phase)
	}

	// Every selected node holds both: Staged, whatever the window.
	nodes[1] = node("b", "shop", "registry.local:5000/app:v1", "docker.io/library/nginx:latest")
	nodes[2] = node("c", "shop", "docker.io/library/nginx:latest", "registry.local:5000/app:v1")
	st.Status = got
	got = Aggregate(st, nodes, now.Add(time.Minute))
	if got.Nodes != 3 || got.Staged != 3 || got.Phase != fleetapi.StagingStaged {
		t.Errorf("status %+v: want 3/3 Staged", got)
	}
	if c := meta.FindStatusCondition(got.Conditions, fleetapi.ConditionStaged); c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonAllStaged {
		t.Errorf("Staged condition %+v, want True", c)
	}
	if sameStatus(st.Status, got) {
		t.Error("sameStatus: a new count compares equal")
	}
	if !sameStatus(got, Aggregate(st, nodes, now.Add(time.Hour))) {
		t.Error("sameStatus: the same counts compare unequal")
	}

	// A selector that does not parse selects nothing and says so.
	st.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Bad"}}}
	if got := Aggregate(st, nodes, now); got.Nodes != 0 || meta.FindStatusCondition(got.Conditions, fleetapi.ConditionStaged).Reason != ReasonBadSelector {
		t.Errorf("bad selector: %+v", got)
	}
}
