package kit

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Event reasons recorded by PodControl, as kubectl describe shows them.
const (
	ReasonSuccessfulCreate = "SuccessfulCreate"
	ReasonFailedCreate     = "FailedCreate"
	ReasonSuccessfulDelete = "SuccessfulDelete"
	ReasonFailedDelete     = "FailedDelete"
)

// maxGeneratedPrefix keeps generateName prefixes short enough that the
// hub's five random characters still give a valid 63-character label.
const maxGeneratedPrefix = 58

// ControllerRef returns the owner reference a controller puts on what it
// creates: controller true and blockOwnerDeletion true, so foreground
// deletion of the owner waits for its dependents.
func ControllerRef(owner metav1.Object, gvk schema.GroupVersionKind) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         gvk.GroupVersion().String(),
		Kind:               gvk.Kind,
		Name:               owner.GetName(),
		UID:                owner.GetUID(),
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}

// PodFromTemplate builds the pod a controller creates from template: the
// template's labels, annotations, finalizers and spec (deep-copied), the
// controller reference, and generateName "<owner>-". Callers may set a
// fixed Name, a hostname or node affinity on the result before creating it.
func PodFromTemplate(template *corev1.PodTemplateSpec, owner metav1.Object, gvk schema.GroupVersionKind) *corev1.Pod {
	t := template.DeepCopy()
	prefix := owner.GetName() + "-"
	if len(prefix) > maxGeneratedPrefix {
		prefix = prefix[:maxGeneratedPrefix]
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    prefix,
			Namespace:       owner.GetNamespace(),
			Labels:          t.Labels,
			Annotations:     t.Annotations,
			Finalizers:      t.Finalizers,
			OwnerReferences: []metav1.OwnerReference{ControllerRef(owner, gvk)},
		},
		Spec: t.Spec,
	}
}

// Object is what owns pods and what events are about: a typed API
// object.
type Object interface {
	metav1.Object
	runtime.Object
}

// PodControl creates and deletes a controller's pods and records events
// about them on the owner.
type PodControl struct {
	Client   kubernetes.Interface
	Recorder *Recorder // nil records nothing
}

// CreatePod creates pod (built by PodFromTemplate) on behalf of owner and
// records SuccessfulCreate or FailedCreate. It returns the created pod.
func (pc PodControl) CreatePod(ctx context.Context, owner Object, pod *corev1.Pod) (*corev1.Pod, error) {
	if len(pod.Labels) == 0 {
		return nil, fmt.Errorf("create pod for %s: template has no labels, the pod could never be matched", owner.GetName())
	}
	created, err := pc.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		// A namespace being deleted refuses new pods; that is not worth a
		// warning on the owner, which is about to go too.
		if !apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
			pc.Recorder.Eventf(owner, corev1.EventTypeWarning, ReasonFailedCreate, "Error creating: %v", err)
		}
		return nil, fmt.Errorf("create pod: %w", err)
	}
	pc.Recorder.Eventf(owner, corev1.EventTypeNormal, ReasonSuccessfulCreate, "Created pod: %s", created.Name)
	return created, nil
}

// DeletePod deletes a pod of owner, checking its UID, and records
// SuccessfulDelete or FailedDelete. A pod already gone is not an error.
func (pc PodControl) DeletePod(ctx context.Context, owner Object, pod *corev1.Pod) error {
	err := pc.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &pod.UID},
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		if apierrors.IsConflict(err) {
			return nil // replaced by another pod of the same name: not ours to delete
		}
		pc.Recorder.Eventf(owner, corev1.EventTypeWarning, ReasonFailedDelete, "Error deleting: %v", err)
		return fmt.Errorf("delete pod %s: %w", pod.Name, err)
	}
	pc.Recorder.Eventf(owner, corev1.EventTypeNormal, ReasonSuccessfulDelete, "Deleted pod: %s", pod.Name)
	return nil
}
