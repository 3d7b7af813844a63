package localstate

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestTrimForCache(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Labels: map[string]string{"app": "web"}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	applied, _ := json.Marshal(svc)
	svc.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: string(applied), "team": "shop"}
	svc.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}},"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:selector":{}}}`)}}
	before := svc.Size()
	trimForCache(svc)
	t.Logf("applied Service: %d → %d bytes of protobuf", before, svc.Size())
	if svc.ManagedFields != nil || len(svc.Annotations) != 1 || svc.Annotations["team"] != "shop" {
		t.Errorf("trimmed Service: managedFields %v, annotations %v", svc.ManagedFields, svc.Annotations)
	}

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c", Annotations: map[string]string{corev1.LastAppliedConfigAnnotation: "{}"}}}
	trimForCache(cm)
	if cm.Annotations != nil {
		t.Errorf("trimmed ConfigMap annotations: %v", cm.Annotations)
	}

	// The downward API exposes a pod's annotations: all are kept.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{corev1.LastAppliedConfigAnnotation: "{}"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	trimForCache(pod)
	if pod.ManagedFields != nil || pod.Annotations[corev1.LastAppliedConfigAnnotation] != "{}" {
		t.Errorf("trimmed pod: managedFields %v, annotations %v", pod.ManagedFields, pod.Annotations)
	}
}
