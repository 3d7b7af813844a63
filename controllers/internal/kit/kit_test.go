package kit

import (
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func TestExpectations(t *testing.T) {
	now := time.Unix(1000, 0)
	e := NewExpectations(time.Minute, func() time.Time { return now })
	if !e.Satisfied("a") {
		t.Fatal("no record should be satisfied")
	}
	e.Expect("a", 2, []types.UID{"x"})
	e.CreationObserved("a")
	e.DeletionObserved("a", "x")
	e.DeletionObserved("a", "x") // seen twice (deletionTimestamp, then gone): once
	if e.Satisfied("a") {
		t.Fatal("one creation still expected")
	}
	e.DeletionObserved("a", "y") // not ours: no effect
	e.CreationObserved("a")
	if !e.Satisfied("a") {
		t.Fatal("all observed")
	}
	e.ExpectCreations("b", 5)
	now = now.Add(2 * time.Minute)
	if !e.Satisfied("b") {
		t.Fatal("expired expectations should not hold the controller back")
	}
}

func TestTemplateHash(t *testing.T) {
	tmpl := &corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "nginx"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "nginx", Image: "nginx:1.14.2"}}}}
	a, b := TemplateHash(tmpl, nil), TemplateHash(tmpl.DeepCopy(), nil)
	if a != b || a == "" {
		t.Fatalf("hash not stable: %q %q", a, b)
	}
	if c := TemplateHash(tmpl, ptr.To[int32](1)); c == a {
		t.Error("collision count does not change the hash")
	}
	other := tmpl.DeepCopy()
	other.Spec.Containers[0].Image = "nginx:1.16.1"
	if TemplateHash(other, nil) == a {
		t.Error("different templates hash the same")
	}
	for _, r := range a {
		if r == 'a' || r == 'e' || r == 'i' || r == 'o' || r == 'u' {
			t.Errorf("hash %q has vowels", a)
		}
	}
}

func TestRevisionRoundTrip(t *testing.T) {
	tmpl := &corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i:1"}}}}
	data, err := TemplatePatch(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	cr := &appsv1.ControllerRevision{Data: runtime.RawExtension{Raw: data}}
	got, err := TemplateFromRevision(cr)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Containers[0].Image != "i:1" || got.Labels["app"] != "web" {
		t.Errorf("round trip: %+v", got)
	}
	// Re-encoded JSON with another key order is still equal.
	reordered := &appsv1.ControllerRevision{Data: runtime.RawExtension{Raw: []byte(
		`{"spec":{"template":{"spec":{"containers":[{"resources":{},"image":"i:1","name":"c"}]},"metadata":{"labels":{"app":"web"}},"$patch":"replace"}}}`)}}
	if !EqualRevisions(cr, reordered) {
		t.Errorf("equal data not equal:\n%s\n%s", data, reordered.Data.Raw)
	}
}

func TestIsPodAvailable(t *testing.T) {
	now := time.Unix(1000, 0)
	p := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{
		Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(now.Add(-5 * time.Second)),
	}}}}
	if !IsPodReady(p) || !IsPodAvailable(p, 0, now) || !IsPodAvailable(p, 5, now) || IsPodAvailable(p, 10, now) {
		t.Error("availability around minReadySeconds is wrong")
	}
	if d := AvailableIn(p, 10, now); d != 5*time.Second {
		t.Errorf("available in %v, want 5s", d)
	}
}
