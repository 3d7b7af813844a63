package endpoints

//lint:file-ignore SA1019 Kubernetes still serves v1 Endpoints, deprecated for EndpointSlices, and the endpoints controller keeps them as upstream does

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// syncLegacy writes the Service's Endpoints object when its content
// differs from the desired one.
func (c *Controller) syncLegacy(ctx context.Context, svc *corev1.Service, pods []*corev1.Pod, trigger string) error {
	subsets, truncated := desiredSubsets(svc, pods, MaxEndpointsPerObject)
	labels := legacyLabels(svc)
	cur, err := c.endpoints.Endpoints(svc.Namespace).Get(svc.Name)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get endpoints: %w", err)
	}
	api := c.cfg.Client.CoreV1().Endpoints(svc.Namespace)
	if cur == nil {
		ep := &corev1.Endpoints{
			ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Namespace: svc.Namespace, Labels: labels},
			Subsets:    subsets,
		}
		setAnnotations(&ep.ObjectMeta, trigger, truncated)
		if _, err := api.Create(ctx, ep, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create endpoints: %w", err)
		}
		return nil
	}
	_, wasTruncated := cur.Annotations[AnnotationOverCap]
	if apiequality.Semantic.DeepEqual(normSubsets(cur.Subsets), normSubsets(subsets)) &&
		maps.Equal(cur.Labels, labels) && wasTruncated == truncated {
		return nil
	}
	ep := cur.DeepCopy()
	ep.Labels = labels
	ep.Subsets = subsets
	setAnnotations(&ep.ObjectMeta, trigger, truncated)
	if _, err := api.Update(ctx, ep, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update endpoints: %w", err)
	}
	return nil
}

// normSubsets treats a nil and an empty subset list alike.
func normSubsets(s []corev1.EndpointSubset) []corev1.EndpointSubset {
	if len(s) == 0 {
		return nil
	}
	return s
}

func setAnnotations(m *metav1.ObjectMeta, trigger string, truncated bool) {
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	if trigger != "" {
		m.Annotations[AnnotationTriggerTime] = trigger
	}
	if truncated {
		m.Annotations[AnnotationOverCap] = "truncated"
	} else {
		delete(m.Annotations, AnnotationOverCap)
	}
	if len(m.Annotations) == 0 {
		m.Annotations = nil
	}
}
