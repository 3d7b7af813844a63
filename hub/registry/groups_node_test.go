package registry

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// runtimeClassLister serves stored runtime classes.
type runtimeClassLister []runtime.Object

func (l runtimeClassLister) List(_ context.Context, resource, _ string) ([]runtime.Object, error) {
	if resource != runtimeClassesResource {
		return nil, nil
	}
	return l, nil
}

func TestValidateRuntimeClass(t *testing.T) {
	tests := []struct {
		name  string
		rc    nodev1.RuntimeClass
		paths []string
	}{
		{"valid", nodev1.RuntimeClass{Handler: "kata-1",
			Overhead:   &nodev1.Overhead{PodFixed: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}},
			Scheduling: &nodev1.Scheduling{NodeSelector: map[string]string{"sandbox": "yes"}, Tolerations: []corev1.Toleration{{Key: "sandbox", Operator: corev1.TolerationOpExists}}}}, nil},
		{"no handler", nodev1.RuntimeClass{}, []string{"handler"}},
		{"handler not a label", nodev1.RuntimeClass{Handler: "Kata.v2"}, []string{"handler"}},
		{"negative overhead", nodev1.RuntimeClass{Handler: "h", Overhead: &nodev1.Overhead{PodFixed: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("-1")}}}, []string{"overhead.limits[memory]"}},
		{"bad selector", nodev1.RuntimeClass{Handler: "h", Scheduling: &nodev1.Scheduling{NodeSelector: map[string]string{"a b": "c"}}}, []string{"scheduling.nodeSelector"}},
		{"bad and duplicate tolerations", nodev1.RuntimeClass{Handler: "h", Scheduling: &nodev1.Scheduling{Tolerations: []corev1.Toleration{
			{Key: "k", Operator: "Sometimes"}, {Key: "a", Value: "b"}, {Key: "a", Value: "b"}}}},
			[]string{"scheduling.tolerations[0].operator", "scheduling.tolerations[2]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := runtimeClassKind.Validate(&tt.rc)
			var got []string
			for _, e := range errs {
				got = append(got, e.Field)
			}
			if strings.Join(got, ",") != strings.Join(tt.paths, ",") {
				t.Errorf("fields %v, want %v (%v)", got, tt.paths, errs)
			}
		})
	}
	old := &nodev1.RuntimeClass{Handler: "a"}
	if errs := runtimeClassKind.ValidateUpdate(&nodev1.RuntimeClass{Handler: "b"}, old); len(errs) != 1 || errs[0].Field != "handler" {
		t.Errorf("handler change: %v", errs)
	}
}

func TestAdmitRuntimeClass(t *testing.T) {
	fixed := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("120Mi")}
	classes := runtimeClassLister{
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "kata"}, Handler: "kata",
			Overhead: &nodev1.Overhead{PodFixed: fixed},
			Scheduling: &nodev1.Scheduling{NodeSelector: map[string]string{"sandbox": "kata"},
				Tolerations: []corev1.Toleration{{Key: "sandbox", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}}},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Handler: "runc"},
	}
	pod := func(class string, overhead corev1.ResourceList, sel map[string]string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}}
		if class != "" {
			p.Spec.RuntimeClassName = ptr.To(class)
		}
		p.Spec.Overhead, p.Spec.NodeSelector = overhead, sel
		return p
	}
	forbidden := []struct {
		name string
		pod  *corev1.Pod
		msg  string
	}{
		{"unknown", pod("gvisor", nil, nil), `pods "p" is forbidden: pod rejected: RuntimeClass "gvisor" not found`},
		{"other overhead", pod("kata", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}, nil), "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"},
		{"overhead, class without", pod("plain", fixed, nil), "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"},
		{"overhead, no class", pod("", fixed, nil), "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"},
		{"selector conflict", pod("kata", nil, map[string]string{"sandbox": "gvisor"}), "conflict: runtimeClass.scheduling.nodeSelector[sandbox] = kata; pod.spec.nodeSelector[sandbox] = gvisor"},
	}
	for _, tt := range forbidden {
		err := admitRuntimeClass(context.Background(), classes, tt.pod)
		if !apierrors.IsForbidden(err) || !strings.HasSuffix(err.Error(), tt.msg) {
			t.Errorf("%s: err = %v, want Forbidden %q", tt.name, err, tt.msg)
		}
	}
	p := pod("kata", fixed.DeepCopy(), map[string]string{"zone": "a"})
	p.Spec.Tolerations = []corev1.Toleration{{Key: "sandbox", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	if err := admitRuntimeClass(context.Background(), classes, p); err != nil {
		t.Fatal(err)
	}
	if p.Spec.Overhead.Cpu().String() != "250m" || p.Spec.NodeSelector["sandbox"] != "kata" || p.Spec.NodeSelector["zone"] != "a" || len(p.Spec.Tolerations) != 1 {
		t.Errorf("admitted spec: overhead %v selector %v tolerations %v", p.Spec.Overhead, p.Spec.NodeSelector, p.Spec.Tolerations)
	}
	p = pod("kata", nil, nil)
	if err := admitRuntimeClass(context.Background(), classes, p); err != nil || len(p.Spec.Overhead) != 2 || len(p.Spec.Tolerations) != 1 {
		t.Errorf("bare pod: %v %v %v", err, p.Spec.Overhead, p.Spec.Tolerations)
	}
	p = pod("plain", nil, nil)
	if err := admitRuntimeClass(context.Background(), classes, p); err != nil || p.Spec.Overhead != nil || p.Spec.NodeSelector != nil {
		t.Errorf("plain class: %v %+v", err, p.Spec)
	}
}
