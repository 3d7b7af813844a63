package admission

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
)

func list(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

func message(errs []error) string {
	if len(errs) == 0 {
		return ""
	}
	return utilerrors.NewAggregate(errs).Error()
}

func TestValidateClaimMessages(t *testing.T) {
	lr := &corev1.LimitRange{Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{
		{Type: corev1.LimitTypeContainer, Max: list("cpu", "1")},
		{Type: corev1.LimitTypePersistentVolumeClaim, Min: list("storage", "1Gi"), Max: list("storage", "2Gi")},
	}}}
	for _, c := range []struct {
		name     string
		req, lim corev1.ResourceList
		want     string
	}{
		{"within", list("storage", "1536Mi"), nil, ""},
		{"at the bounds", list("storage", "2Gi"), nil, ""},
		{"below", list("storage", "500Mi"), nil, "minimum storage usage per PersistentVolumeClaim is 1Gi, but request is 500Mi"},
		{"above", list("storage", "10Gi"), nil, "maximum storage usage per PersistentVolumeClaim is 2Gi, but request is 10Gi"},
		// A claim's limits are not what it asks for.
		{"limit ignored", list("storage", "1Gi"), list("storage", "10Gi"), ""},
		{"no request", nil, nil, "[minimum storage usage per PersistentVolumeClaim is 1Gi.  No request is specified, maximum storage usage per PersistentVolumeClaim is 2Gi.  No request is specified]"},
	} {
		pvc := &corev1.PersistentVolumeClaim{Spec: corev1.PersistentVolumeClaimSpec{
			Resources: corev1.VolumeResourceRequirements{Requests: c.req, Limits: c.lim},
		}}
		if got := message(validateClaim(pvc, lr)); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

func TestCheckItemMessages(t *testing.T) {
	item := corev1.LimitRangeItem{
		Type:                 corev1.LimitTypeContainer,
		Min:                  list("cpu", "100m"),
		Max:                  list("cpu", "1"),
		MaxLimitRequestRatio: list("memory", "2"),
	}
	for _, c := range []struct {
		name     string
		req, lim corev1.ResourceList
		want     string
	}{
		{"fits", list("cpu", "200m", "memory", "100Mi"), list("cpu", "500m", "memory", "200Mi"), ""},
		{"limit below min", list("cpu", "100m", "memory", "1"), list("cpu", "50m", "memory", "1"),
			"minimum cpu usage per Container is 100m, but limit is 50m"},
		{"request above max", list("cpu", "2", "memory", "1"), list("cpu", "1", "memory", "1"),
			"maximum cpu usage per Container is 1, but request is 2"},
		{"no limit", list("cpu", "200m", "memory", "1"), list("memory", "1"),
			"maximum cpu usage per Container is 1.  No limit is specified"},
		{"no request", nil, list("cpu", "1", "memory", "1"),
			"[minimum cpu usage per Container is 100m.  No request is specified, memory max limit to request ratio per Container is 2, but no request is specified or request is 0]"},
		{"no memory limit", list("cpu", "200m", "memory", "1Mi"), list("cpu", "1"),
			"memory max limit to request ratio per Container is 2, but no limit is specified or limit is 0"},
		{"ratio", list("cpu", "200m", "memory", "100Mi"), list("cpu", "1", "memory", "300Mi"),
			"memory max limit to request ratio per Container is 2, but provided ratio is 3.000000"},
	} {
		if got := message(checkItem(item, c.req, c.lim)); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// TestRepeatedMessagesOnce shows two containers breaking a limit alike are
// reported once, as upstream's aggregate prints them.
func TestRepeatedMessagesOnce(t *testing.T) {
	lr := &corev1.LimitRange{Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{
		{Type: corev1.LimitTypeContainer, Max: list("cpu", "1")},
	}}}
	c := corev1.Container{Resources: corev1.ResourceRequirements{Limits: list("cpu", "2")}}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{c, c}}}
	if got, want := message(validatePod(pod, lr)), "maximum cpu usage per Container is 1, but limit is 2"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
