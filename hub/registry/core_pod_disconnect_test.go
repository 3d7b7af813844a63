package registry

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tether-edge/tether/internal/disconnect"
)

// TestDisconnectPolicyValidation: a bad disconnect annotation on a pod or
// on the pod template of every workload kind is refused at the
// annotation's own field path, on create and on update.
func TestDisconnectPolicyValidation(t *testing.T) {
	template := func(o runtime.Object) *corev1.PodTemplateSpec {
		switch o := o.(type) {
		case *appsv1.Deployment:
			return &o.Spec.Template
		case *appsv1.ReplicaSet:
			return &o.Spec.Template
		case *appsv1.StatefulSet:
			return &o.Spec.Template
		case *appsv1.DaemonSet:
			return &o.Spec.Template
		case *corev1.ReplicationController:
			return o.Spec.Template
		case *batchv1.Job:
			return &o.Spec.Template
		case *batchv1.CronJob:
			return &o.Spec.JobTemplate.Spec.Template
		case *corev1.PodTemplate:
			return &o.Template
		}
		t.Fatalf("no template in %T", o)
		return nil
	}
	rcTemplate := grpTemplate()
	kinds := []struct {
		kind *Kind
		obj  func() runtime.Object
		path string
	}{
		{deploymentKind, func() runtime.Object { return grpDeployment() }, "spec.template.metadata.annotations"},
		{replicaSetKind, func() runtime.Object {
			return &appsv1.ReplicaSet{ObjectMeta: grpMeta("web"), Spec: appsv1.ReplicaSetSpec{Selector: grpSelector(), Template: grpTemplate()}}
		}, "spec.template.metadata.annotations"},
		{statefulSetKind, func() runtime.Object { return grpStatefulSet() }, "spec.template.metadata.annotations"},
		{daemonSetKind, func() runtime.Object {
			return &appsv1.DaemonSet{ObjectMeta: grpMeta("agent"), Spec: appsv1.DaemonSetSpec{Selector: grpSelector(), Template: grpTemplate()}}
		}, "spec.template.metadata.annotations"},
		{replicationControllerKind, func() runtime.Object {
			tm := rcTemplate.DeepCopy()
			return &corev1.ReplicationController{ObjectMeta: grpMeta("web"), Spec: corev1.ReplicationControllerSpec{Selector: map[string]string{"app": "web"}, Template: tm}}
		}, "spec.template.metadata.annotations"},
		{jobKind, func() runtime.Object { return grpJob() }, "spec.template.metadata.annotations"},
		{cronJobKind, func() runtime.Object { return grpCronJob("*/5 * * * *") }, "spec.jobTemplate.spec.template.metadata.annotations"},
		{podTemplateKind, func() runtime.Object {
			return &corev1.PodTemplate{ObjectMeta: grpMeta("web"), Template: grpTemplate()}
		}, "template.metadata.annotations"},
	}
	bad := []struct {
		key, value string
		typ        field.ErrorType
	}{
		{disconnect.ReconcileAnnotation, "keepBoth", field.ErrorTypeNotSupported},
		{disconnect.LostAfterAnnotation, "-60s", field.ErrorTypeInvalid},
		{disconnect.ReplaceAnnotation, "yes", field.ErrorTypeNotSupported},
		{disconnect.Prefix + "lostAfter", "60s", field.ErrorTypeNotSupported},
	}
	for _, k := range kinds {
		t.Run(k.kind.GVK.Kind, func(t *testing.T) {
			good := k.obj()
			template(good).Annotations = map[string]string{
				disconnect.LostAfterAnnotation: "60s", disconnect.ReplaceAnnotation: "true", disconnect.ReconcileAnnotation: "keepOriginal",
				disconnect.EffectiveAnnotation: "copied from a pod",
			}
			if errs := grpCreate(k.kind, good); len(errs) != 0 {
				t.Fatalf("good policy refused: %v", errs)
			}
			for _, b := range bad {
				want := k.path + "[" + b.key + "]"
				obj := k.obj()
				template(obj).Annotations = map[string]string{b.key: b.value}
				wantErr(t, grpCreate(k.kind, obj), b.typ, want)

				up := good.DeepCopyObject()
				template(up).Annotations[b.key] = b.value
				validate := k.kind.ValidateUpdate
				if validate == nil {
					validate = func(obj, _ runtime.Object) field.ErrorList { return k.kind.Validate(obj) }
				}
				wantErr(t, validate(up, good), b.typ, want)
			}
		})
	}

	t.Run("Pod", func(t *testing.T) {
		for _, b := range bad {
			want := "metadata.annotations[" + b.key + "]"
			p := validPod()
			p.Annotations = map[string]string{b.key: b.value}
			wantErr(t, podKind.Validate(p), b.typ, want)

			old := validPod()
			up := old.DeepCopy()
			up.Annotations = map[string]string{b.key: b.value}
			wantErr(t, podKind.ValidateUpdate(up, old), b.typ, want)
		}
		// A pod stored with a bad annotation before it was checked can
		// still be updated when the update leaves the annotation alone.
		old := validPod()
		old.Annotations = map[string]string{disconnect.ReconcileAnnotation: "keepBoth"}
		up := old.DeepCopy()
		up.Labels = map[string]string{"tier": "front"}
		if errs := podKind.ValidateUpdate(up, old); len(errs) != 0 {
			t.Errorf("update leaving a stored annotation alone: %v", errs)
		}
	})
}

// TestDisconnectPolicyAdmission: a new pod gets its effective policy
// annotation and the policy's toleration of the unreachable taint, which
// replaces upstream's 300 s default; the not-ready default stays; a pod's
// own toleration of the taint wins; updates keep what create gave.
// rawPod is a pod as a client sends it: defaulted, not yet admitted.
func rawPod() *corev1.Pod {
	p := &corev1.Pod{}
	p.Name, p.Namespace = "web", "default"
	p.Spec.Containers = []corev1.Container{{Name: "app", Image: "nginx:1.27"}}
	defaultPod(p)
	return p
}

func TestDisconnectPolicyAdmission(t *testing.T) {
	admit := func(p, old *corev1.Pod) *corev1.Pod {
		t.Helper()
		var o runtime.Object
		if old != nil {
			o = old
		}
		if err := podKind.Mutate(context.Background(), classLister(nil), p, o); err != nil {
			t.Fatal(err)
		}
		return p
	}
	unreachable := func(p *corev1.Pod) []corev1.Toleration {
		var ts []corev1.Toleration
		for _, tol := range p.Spec.Tolerations {
			if tol.Key == corev1.TaintNodeUnreachable {
				ts = append(ts, tol)
			}
		}
		return ts
	}

	p := admit(rawPod(), nil)
	if got, want := p.Annotations[disconnect.EffectiveAnnotation], disconnect.Default().String(); got != want {
		t.Errorf("default effective annotation %q, want %q", got, want)
	}
	if ts := unreachable(p); len(ts) != 1 || ts[0].TolerationSeconds != nil || ts[0].Effect != corev1.TaintEffectNoExecute || ts[0].Operator != corev1.TolerationOpExists {
		t.Errorf("default unreachable tolerations %+v, want one for ever", ts)
	}
	if nr := p.Spec.Tolerations[0]; nr.Key != corev1.TaintNodeNotReady || nr.TolerationSeconds == nil || *nr.TolerationSeconds != DefaultTolerationSeconds {
		t.Errorf("not-ready toleration %+v, want the 300 s default", nr)
	}

	p = rawPod()
	p.Annotations = map[string]string{disconnect.ReplaceAnnotation: "true", disconnect.LostAfterAnnotation: "60s",
		disconnect.EffectiveAnnotation: "replace=false (copied)"}
	p = admit(p, nil)
	if got := p.Annotations[disconnect.EffectiveAnnotation]; got != "lostAfter=1m0s replace=true reconcile=keepReplacement" {
		t.Errorf("effective annotation %q", got)
	}
	if ts := unreachable(p); len(ts) != 1 || ts[0].TolerationSeconds == nil || *ts[0].TolerationSeconds != 60 {
		t.Errorf("replace=true lost-after=60s tolerations %+v", ts)
	}
	stored := p

	// The pod's own toleration of the taint is kept, and no other added.
	p = rawPod()
	p.Annotations = map[string]string{disconnect.ReplaceAnnotation: "true"}
	p.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptrTo[int64](5)}}
	if ts := unreachable(admit(p, nil)); len(ts) != 1 || *ts[0].TolerationSeconds != 5 {
		t.Errorf("own toleration: %+v", ts)
	}
	p = rawPod()
	p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	if admit(p, nil); len(p.Spec.Tolerations) != 1 {
		t.Errorf("tolerate-everything pod got %+v", p.Spec.Tolerations)
	}

	// An update written from the manifest (no tolerations, a forged
	// effective annotation) keeps what the pod was admitted with.
	up := stored.DeepCopy()
	up.Spec.Tolerations = nil
	up.Annotations = map[string]string{disconnect.ReplaceAnnotation: "true", disconnect.LostAfterAnnotation: "60s", disconnect.EffectiveAnnotation: "forged"}
	up = admit(up, stored)
	if got, want := up.Annotations[disconnect.EffectiveAnnotation], stored.Annotations[disconnect.EffectiveAnnotation]; got != want {
		t.Errorf("update's effective annotation %q, want the stored %q", got, want)
	}
	if ts := unreachable(up); len(ts) != 1 || ts[0].TolerationSeconds == nil || *ts[0].TolerationSeconds != 60 {
		t.Errorf("update's tolerations %+v, want the stored 60 s one", ts)
	}
	if errs := podKind.ValidateUpdate(up, stored); len(errs) != 0 {
		t.Errorf("update refused: %v", errs)
	}
	// A pod stored before the policy existed gets no effective annotation
	// on update, and keeps its stored toleration.
	legacy := rawPod()
	legacy.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptrTo[int64](300)}}
	up = rawPod()
	up.Annotations = map[string]string{disconnect.EffectiveAnnotation: "forged"}
	up = admit(up, legacy)
	if _, ok := up.Annotations[disconnect.EffectiveAnnotation]; ok {
		t.Errorf("legacy pod's update kept a forged effective annotation")
	}
	if ts := unreachable(up); len(ts) != 1 || *ts[0].TolerationSeconds != 300 {
		t.Errorf("legacy pod's update tolerations %+v", ts)
	}
}
