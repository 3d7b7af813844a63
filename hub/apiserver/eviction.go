package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// maxDisruptedPods bounds a budget's status.disruptedPods, as upstream,
// so that evictions whose deletions never show up cannot grow it forever.
const maxDisruptedPods = 2000

var pdbKind = registry.Lookup(schema.GroupVersionResource{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets"})

// evict serves pods/eviction: the pod is deleted unless a
// PodDisruptionBudget covering it allows no disruption now, which answers
// 429 so that kubectl drain waits and retries.
func (s *Server) evict(w http.ResponseWriter, r *http.Request, t target) {
	obj, warnings, opts, ok := s.postBody(w, r, func(body []byte, validation string) (runtime.Object, []string, error) {
		return s.decodeEviction(r, body, validation)
	})
	if !ok {
		return
	}
	ev := obj.(*policyv1.Eviction)
	if err := checkTargetName(ev, t, "Eviction"); err != nil {
		s.writeError(w, err)
		return
	}
	del := ev.DeleteOptions
	if del == nil {
		del = &metav1.DeleteOptions{}
	}
	if opts.dryRun {
		del.DryRun = []string{metav1.DryRunAll}
	}
	if err := s.evictPod(r.Context(), t, del); err != nil {
		s.writeError(w, err)
		return
	}
	s.writeCreated(w, r, warnings, nil, schema.GroupVersion{})
}

// decodeEviction accepts policy/v1 and the older policy/v1beta1 Eviction,
// which has the same fields.
func (s *Server) decodeEviction(r *http.Request, body []byte, validation string) (runtime.Object, []string, error) {
	var probe struct {
		APIVersion string `json:"apiVersion"`
	}
	gvk := policyv1.SchemeGroupVersion.WithKind("Eviction")
	if json.Unmarshal(body, &probe) == nil && probe.APIVersion == "policy/v1beta1" {
		gvk.Version = "v1beta1"
	}
	obj, warnings, err := s.decodeBody(r, body, gvk, validation)
	if err != nil {
		return nil, nil, err
	}
	if ev, ok := obj.(*policyv1.Eviction); ok {
		return ev, warnings, nil
	}
	// Same fields in v1beta1: move them over.
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, nil, apierrors.NewInternalError(err)
	}
	ev := &policyv1.Eviction{}
	if err := json.Unmarshal(data, ev); err != nil {
		return nil, nil, apierrors.NewBadRequest(err.Error())
	}
	return ev, warnings, nil
}

func (s *Server) evictPod(ctx context.Context, t target, del *metav1.DeleteOptions) error {
	dryRun := len(del.DryRun) > 0
	obj, err := s.cfg.Storage.Get(ctx, t.kind, t.namespace, t.name)
	if err != nil {
		return err
	}
	pod := obj.(*corev1.Pod)
	if del.Preconditions != nil && del.Preconditions.UID != nil && *del.Preconditions.UID != pod.UID {
		return apierrors.NewConflict(t.kind.GroupResource(), t.name,
			fmt.Errorf("the UID in the precondition (%s) does not match the UID in record (%s); the object might have been deleted and then recreated", *del.Preconditions.UID, pod.UID))
	}
	// Pods that are done, or already going, disrupt nothing.
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil {
		_, _, err := s.cfg.Storage.Delete(ctx, t.kind, t.namespace, t.name, del, dryRun)
		return err
	}
	pdbs, err := s.matchingBudgets(ctx, pod)
	if err != nil {
		return err
	}
	switch {
	case len(pdbs) > 1:
		return apierrors.NewInternalError(fmt.Errorf("this pod has more than one PodDisruptionBudget, which the eviction subresource does not support"))
	case len(pdbs) == 1 && !(pod.Status.Phase == corev1.PodPending) && !unhealthyMayGo(pdbs[0], pod):
		if err := s.takeDisruption(ctx, pdbs[0], pod, dryRun); err != nil {
			return err
		}
	}
	_, _, err = s.cfg.Storage.Delete(ctx, t.kind, t.namespace, t.name, del, dryRun)
	return err
}

// unhealthyMayGo reports whether a not-ready pod may be evicted without
// counting against the budget (unhealthyPodEvictionPolicy AlwaysAllow).
func unhealthyMayGo(pdb *policyv1.PodDisruptionBudget, pod *corev1.Pod) bool {
	if pdb.Spec.UnhealthyPodEvictionPolicy == nil || *pdb.Spec.UnhealthyPodEvictionPolicy != policyv1.AlwaysAllow {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status != corev1.ConditionTrue
		}
	}
	return true
}

func (s *Server) matchingBudgets(ctx context.Context, pod *corev1.Pod) ([]*policyv1.PodDisruptionBudget, error) {
	if pdbKind == nil {
		return nil, nil
	}
	obj, err := s.cfg.Storage.List(ctx, pdbKind, pod.Namespace, storage.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []*policyv1.PodDisruptionBudget
	for i := range obj.(*policyv1.PodDisruptionBudgetList).Items {
		pdb := &obj.(*policyv1.PodDisruptionBudgetList).Items[i]
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		out = append(out, pdb)
	}
	return out, nil
}

// takeDisruption uses up one allowed disruption of pdb for pod, recording
// it in status.disruptedPods until the disruption controller sees the pod
// go; it fails with 429 when none is allowed now.
func (s *Server) takeDisruption(ctx context.Context, pdb *policyv1.PodDisruptionBudget, pod *corev1.Pod, dryRun bool) error {
	tooMany := func(msg string) error {
		// No Retry-After: client-go would wait and retry by itself, while
		// kubectl drain wants the answer now to report and retry its way.
		err := apierrors.NewTooManyRequests(msg, 0)
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{
			Type: policyv1.DisruptionBudgetCause, Message: fmt.Sprintf("The disruption budget %s needs %d healthy pods and has %d currently",
				pdb.Name, pdb.Status.DesiredHealthy, pdb.Status.CurrentHealthy)})
		return err
	}
	_, err := s.cfg.Storage.GuaranteedUpdate(ctx, pdbKind, pdb.Namespace, pdb.Name,
		storage.Options{Subresource: "status", DryRun: dryRun, FieldManager: "kube-apiserver"},
		func(cur runtime.Object) (runtime.Object, error) {
			p := cur.(*policyv1.PodDisruptionBudget)
			if p.Status.ObservedGeneration < p.Generation {
				return nil, tooMany("Cannot evict pod as it would violate the pod's disruption budget. The disruption budget " + p.Name + " is still being processed by the server.")
			}
			if p.Status.DisruptionsAllowed <= 0 {
				return nil, tooMany("Cannot evict pod as it would violate the pod's disruption budget.")
			}
			if len(p.Status.DisruptedPods) >= maxDisruptedPods {
				return nil, apierrors.NewForbidden(pdbKind.GroupResource(), p.Name, fmt.Errorf("DisruptedPods map too big - too many evictions not confirmed by PDB controller"))
			}
			p.Status.DisruptionsAllowed--
			if p.Status.DisruptedPods == nil {
				p.Status.DisruptedPods = map[string]metav1.Time{}
			}
			p.Status.DisruptedPods[pod.Name] = metav1.NewTime(time.Now())
			return p, nil
		})
	return err
}
