package registry

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/disconnect"
)

// validateDisconnectPolicy checks the disconnect policy annotations of a
// pod or of a workload's pod template (internal/disconnect); path is the
// annotations' field path, so that each error names its annotation, e.g.
// spec.template.metadata.annotations[disconnect.tether.io/reconcile].
func validateDisconnectPolicy(annotations map[string]string, path *field.Path) field.ErrorList {
	_, errs := disconnect.Parse(annotations, path)
	return errs
}

// DefaultTolerationSeconds is how long pods stay bound to a node that went
// not-ready before the node lifecycle controller evicts them, unless they
// say otherwise. Upstream's DefaultTolerationSeconds admission adds 300 s
// tolerations of the not-ready and the unreachable taints to every pod at
// creation and to every update that lacks them; tether keeps the
// not-ready one and replaces the unreachable one by the pod's disconnect
// policy (admitDisconnectPolicy).
const DefaultTolerationSeconds = 300

// admitTolerations gives a pod the tolerations admission adds: the 300 s
// toleration of node.kubernetes.io/not-ready:NoExecute and, for
// node.kubernetes.io/unreachable:NoExecute, the one that carries its
// disconnect policy, each unless the pod tolerates that taint itself.
// old is the stored pod on update, nil on create.
func admitTolerations(pod, old *corev1.Pod) {
	if !toleratesNoExecute(pod.Spec.Tolerations, corev1.TaintNodeNotReady) {
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{
			Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute,
			TolerationSeconds: ptr.To(int64(DefaultTolerationSeconds)),
		})
	}
	admitDisconnectPolicy(pod, old)
}

// admitDisconnectPolicy writes a new pod's disconnect policy, defaults
// applied, in its effective annotation (replacing any copied from a
// manifest) and gives the pod the policy's toleration of the unreachable
// taint unless it tolerates that taint itself. Bad annotations are left
// for validation to refuse.
//
// On update the effective annotation is the hub's and stays as stored;
// an update that drops the toleration gets the stored pod's back, as
// tolerations may only be added to.
func admitDisconnectPolicy(pod, old *corev1.Pod) {
	if old != nil {
		if v, ok := old.Annotations[disconnect.EffectiveAnnotation]; ok {
			setAnnotation(pod, disconnect.EffectiveAnnotation, v)
		} else {
			delete(pod.Annotations, disconnect.EffectiveAnnotation)
		}
		if toleratesNoExecute(pod.Spec.Tolerations, corev1.TaintNodeUnreachable) {
			return
		}
		for _, t := range old.Spec.Tolerations {
			if tolerationCovers(t, corev1.TaintNodeUnreachable) {
				pod.Spec.Tolerations = append(pod.Spec.Tolerations, t)
				return
			}
		}
	}
	policy, _ := disconnect.Parse(pod.Annotations, field.NewPath("metadata", "annotations"))
	if old == nil {
		setAnnotation(pod, disconnect.EffectiveAnnotation, policy.String())
	}
	if !toleratesNoExecute(pod.Spec.Tolerations, corev1.TaintNodeUnreachable) {
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, policy.Toleration())
	}
}

// toleratesNoExecute reports whether a toleration covers the NoExecute
// taint key: one naming the key, or an Exists one naming no key, with
// the NoExecute effect or none.
func toleratesNoExecute(ts []corev1.Toleration, key string) bool {
	for _, t := range ts {
		if tolerationCovers(t, key) {
			return true
		}
	}
	return false
}

func tolerationCovers(t corev1.Toleration, key string) bool {
	return (t.Key == key || t.Key == "" && t.Operator == corev1.TolerationOpExists) &&
		(t.Effect == corev1.TaintEffectNoExecute || t.Effect == "")
}

func setAnnotation(pod *corev1.Pod, key, value string) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[key] = value
}

// disconnectPolicyChanged reports whether an update changes a disconnect
// policy annotation, so that a pod stored before its annotations were
// checked can still be updated (its finalizers, owners, labels) as long
// as the update leaves them alone.
func disconnectPolicyChanged(cur, old map[string]string) bool {
	for _, k := range []string{disconnect.LostAfterAnnotation, disconnect.ReplaceAnnotation, disconnect.ReconcileAnnotation} {
		v, ok := cur[k]
		ov, ook := old[k]
		if v != ov || ok != ook {
			return true
		}
	}
	for k := range cur {
		if _, ok := old[k]; !ok && strings.HasPrefix(k, disconnect.Prefix) {
			return true
		}
	}
	return false
}
