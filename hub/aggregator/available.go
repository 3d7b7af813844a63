package aggregator

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/kube-aggregator/pkg/apis/apiregistration/v1/helper"
)

func fieldsEverything() fields.Selector { return fields.Everything() }

func serviceUnavailable() *apierrors.StatusError {
	return apierrors.NewServiceUnavailable("service unavailable")
}

// runAvailability checks every service-backed APIService every
// ProbeInterval, and at once when one changes, until ctx ends.
func (a *Aggregator) runAvailability(ctx context.Context) {
	t := time.NewTicker(a.cfg.ProbeInterval)
	defer t.Stop()
	for {
		a.checkAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.kick:
		}
	}
}

// checkAll checks the service-backed APIServices in parallel.
func (a *Aggregator) checkAll(ctx context.Context) {
	a.mu.RLock()
	var todo []*entry
	for _, e := range a.services {
		if e.svc.Spec.Service != nil {
			todo = append(todo, e)
		}
	}
	a.mu.RUnlock()
	var wg sync.WaitGroup
	for _, e := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.check(ctx, e)
		}()
	}
	wg.Wait()
}

// check decides one APIService's Available condition as upstream's
// availability controller does, records the discovery document it got,
// and writes the condition when it changed.
func (a *Aggregator) check(ctx context.Context, e *entry) {
	a.mu.RLock()
	svc, b := e.svc, e.backend
	a.mu.RUnlock()
	cond, doc := a.evaluate(ctx, svc, b)
	a.mu.Lock()
	if e.svc.Spec.Service != nil && e.backend == b {
		e.discovery = doc
	}
	a.mu.Unlock()
	old := helper.GetAPIServiceConditionByType(svc, apiregistrationv1.Available)
	if old != nil && old.Status == cond.Status && old.Reason == cond.Reason && old.Message == cond.Message {
		return
	}
	upd := svc.DeepCopy()
	helper.SetAPIServiceCondition(upd, cond)
	if _, err := a.reg.ApiregistrationV1().APIServices().UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil &&
		!apierrors.IsConflict(err) && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		a.log.Warn("update apiservice status", "name", svc.Name, "err", err)
		return
	}
	if old == nil || old.Status != cond.Status {
		a.log.Info("apiservice availability changed", "name", svc.Name, "status", cond.Status, "reason", cond.Reason, "message", cond.Message)
	}
}

// evaluate returns the Available condition of a service-backed
// APIService and, when the service answered, its discovery document.
func (a *Aggregator) evaluate(ctx context.Context, s *apiregistrationv1.APIService, b *backend) (apiregistrationv1.APIServiceCondition, []byte) {
	ref := s.Spec.Service
	cond := apiregistrationv1.APIServiceCondition{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionTrue,
		LastTransitionTime: metav1.Now(), Reason: "Passed", Message: "all checks passed"}
	fail := func(status apiregistrationv1.ConditionStatus, reason, msg string) (apiregistrationv1.APIServiceCondition, []byte) {
		cond.Status, cond.Reason, cond.Message = status, reason, msg
		return cond, nil
	}
	service, err := a.kube.CoreV1().Services(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fail(apiregistrationv1.ConditionFalse, "ServiceNotFound", fmt.Sprintf("service/%s in %q is not present", ref.Name, ref.Namespace))
	}
	if err != nil {
		return fail(apiregistrationv1.ConditionUnknown, "ServiceAccessError", fmt.Sprintf("service/%s in %q cannot be checked due to: %v", ref.Name, ref.Namespace, err))
	}
	if service.Spec.Type == corev1.ServiceTypeClusterIP || service.Spec.Type == "" {
		port := int32(443)
		if ref.Port != nil {
			port = *ref.Port
		}
		portName, found := "", false
		for _, p := range service.Spec.Ports {
			if p.Port == port {
				portName, found = p.Name, true
				break
			}
		}
		if !found {
			return fail(apiregistrationv1.ConditionFalse, "ServicePortError", fmt.Sprintf("service/%s in %q is not listening on port %d", ref.Name, ref.Namespace, port))
		}
		slices, err := a.kube.DiscoveryV1().EndpointSlices(ref.Namespace).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + ref.Name})
		switch {
		case err != nil:
			return fail(apiregistrationv1.ConditionUnknown, "EndpointsAccessError", fmt.Sprintf("service/%s in %q cannot be checked due to: %v", ref.Name, ref.Namespace, err))
		case len(slices.Items) == 0:
			return fail(apiregistrationv1.ConditionFalse, "EndpointsNotFound", fmt.Sprintf("cannot find endpointslices for service/%s in %q", ref.Name, ref.Namespace))
		case !hasReadyEndpoint(portName, slices.Items):
			return fail(apiregistrationv1.ConditionFalse, "MissingEndpoints", fmt.Sprintf("endpointslices for service/%s in %q have no addresses with port name %q", ref.Name, ref.Namespace, portName))
		}
	}
	if b == nil {
		return fail(apiregistrationv1.ConditionFalse, "FailedDiscoveryCheck", "no route to services from the hub")
	}
	doc, err := b.probeDiscovery(ctx)
	if err != nil {
		return fail(apiregistrationv1.ConditionFalse, "FailedDiscoveryCheck", err.Error())
	}
	return cond, doc
}

// hasReadyEndpoint reports whether a slice has a ready endpoint with the
// named port.
func hasReadyEndpoint(portName string, slices []discoveryv1.EndpointSlice) bool {
	for _, s := range slices {
		named := false
		for _, p := range s.Ports {
			if p.Name != nil && *p.Name == portName {
				named = true
			}
		}
		if !named {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				return true
			}
		}
	}
	return false
}
