package admission

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// quota enforces ResourceQuotas on create and keeps their status.used.
//
// Usage is computed from the stored objects of the namespace, not from a
// running tally, so deletions need no bookkeeping; a namespace's checks and
// writes are serialized so that two creates cannot both take the last unit.
type quota struct {
	a *Admission

	mu    sync.Mutex
	locks map[string]*sync.Mutex // namespace -> lock held from check to write
	kick  chan struct{}
}

func newQuota(a *Admission) *quota {
	return &quota{a: a, locks: map[string]*sync.Mutex{}, kick: make(chan struct{}, 1)}
}

func (q *quota) nsLock(ns string) *sync.Mutex {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.locks[ns]
	if l == nil {
		l = &sync.Mutex{}
		q.locks[ns] = l
	}
	return l
}

// AdmitCreate implements storage.Admitter.
func (q *quota) AdmitCreate(ctx context.Context, k *registry.Kind, obj runtime.Object, dryRun bool) (func(), error) {
	if !k.Namespaced {
		return nil, nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil
	}
	ns := m.GetNamespace()
	quotas, err := q.quotasIn(ctx, ns)
	if err != nil || len(quotas) == 0 {
		return nil, err
	}
	delta := usageOf(k, obj)
	relevant := false
	for _, rq := range quotas {
		for name := range rq.Spec.Hard {
			if _, ok := delta[name]; ok || podComputeResource(k, name) {
				relevant = true
			}
		}
	}
	if !relevant {
		return nil, nil
	}
	lock := q.nsLock(ns)
	lock.Lock()
	done := func() {
		lock.Unlock()
		if !dryRun {
			q.poke()
		}
	}
	if err := q.check(ctx, k, obj, m.GetName(), ns, quotas, delta); err != nil {
		done()
		return nil, err
	}
	return done, nil
}

func (q *quota) check(ctx context.Context, k *registry.Kind, obj runtime.Object, name, ns string, quotas []*corev1.ResourceQuota, delta corev1.ResourceList) error {
	used, err := q.usage(ctx, ns, quotas)
	if err != nil {
		return fmt.Errorf("compute quota usage: %w", err)
	}
	for _, rq := range quotas {
		if !matchesScopes(rq, k, obj) {
			continue
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			if missing := missingCompute(pod, rq.Spec.Hard); len(missing) > 0 {
				return apierrors.NewForbidden(k.GroupResource(), name,
					fmt.Errorf("failed quota: %s: must specify %s", rq.Name, strings.Join(missing, ",")))
			}
		}
		var req, use, lim []string
		for _, res := range sortedNames(rq.Spec.Hard) {
			d, ok := delta[res]
			if !ok || d.IsZero() {
				continue
			}
			hard := rq.Spec.Hard[res]
			u := used[rq.Name][res]
			total := u.DeepCopy()
			total.Add(d)
			if total.Cmp(hard) > 0 {
				req = append(req, fmt.Sprintf("%s=%s", res, d.String()))
				use = append(use, fmt.Sprintf("%s=%s", res, u.String()))
				lim = append(lim, fmt.Sprintf("%s=%s", res, hard.String()))
			}
		}
		if len(req) > 0 {
			return apierrors.NewForbidden(k.GroupResource(), name, fmt.Errorf("exceeded quota: %s, requested: %s, used: %s, limited: %s",
				rq.Name, strings.Join(req, ","), strings.Join(use, ","), strings.Join(lim, ",")))
		}
	}
	return nil
}

func (q *quota) quotasIn(ctx context.Context, ns string) ([]*corev1.ResourceQuota, error) {
	objs, err := q.a.listIn(ctx, quotasKind, ns)
	if err != nil {
		return nil, fmt.Errorf("list resource quotas: %w", err)
	}
	out := make([]*corev1.ResourceQuota, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*corev1.ResourceQuota))
	}
	return out, nil
}

// usage returns, per quota, what the namespace uses of each resource the
// quota limits, honouring the quota's scopes.
func (q *quota) usage(ctx context.Context, ns string, quotas []*corev1.ResourceQuota) (map[string]corev1.ResourceList, error) {
	needed := map[string]*registry.Kind{} // qualified resource -> kind
	for _, rq := range quotas {
		for name := range rq.Spec.Hard {
			for _, k := range kindsCounting(name) {
				needed[k.QualifiedResource()] = k
			}
		}
	}
	objsByKind := map[*registry.Kind][]runtime.Object{}
	for _, k := range needed {
		objs, err := q.a.listIn(ctx, k, ns)
		if err != nil {
			return nil, err
		}
		objsByKind[k] = objs
	}
	out := map[string]corev1.ResourceList{}
	for _, rq := range quotas {
		used := corev1.ResourceList{}
		for name := range rq.Spec.Hard {
			used[name] = resource.Quantity{Format: resource.DecimalSI}
		}
		for k, objs := range objsByKind {
			for _, o := range objs {
				if !matchesScopes(rq, k, o) || terminalPod(o) {
					continue
				}
				for name, v := range usageOf(k, o) {
					if _, tracked := rq.Spec.Hard[name]; tracked {
						cur := used[name]
						cur.Add(v)
						used[name] = cur
					}
				}
			}
		}
		out[rq.Name] = used
	}
	return out, nil
}

func (q *quota) poke() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// run rewrites status.hard and status.used of every quota whose usage
// changed: after admitted creates at once, and every 10 seconds to catch
// deletions and pods that finished. It writes nothing when nothing changed.
func (q *quota) run(ctx context.Context) {
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-q.kick:
		}
		if err := q.refresh(ctx); err != nil && ctx.Err() == nil {
			q.a.log.Warn("refresh resource quota status", "err", err)
		}
	}
}

func (q *quota) refresh(ctx context.Context) error {
	all, err := q.a.listIn(ctx, quotasKind, "")
	if err != nil {
		return err
	}
	byNS := map[string][]*corev1.ResourceQuota{}
	for _, o := range all {
		rq := o.(*corev1.ResourceQuota)
		byNS[rq.Namespace] = append(byNS[rq.Namespace], rq)
	}
	st := q.a.storage()
	for ns, quotas := range byNS {
		used, err := q.usage(ctx, ns, quotas)
		if err != nil {
			return err
		}
		for _, rq := range quotas {
			want := corev1.ResourceQuotaStatus{Hard: rq.Spec.Hard.DeepCopy(), Used: used[rq.Name]}
			if apiequality.Semantic.DeepEqual(rq.Status, want) {
				continue
			}
			_, err := st.GuaranteedUpdate(ctx, quotasKind, ns, rq.Name, storage.Options{Subresource: "status", FieldManager: "resourcequota-controller"},
				func(cur runtime.Object) (runtime.Object, error) {
					c := cur.(*corev1.ResourceQuota)
					c.Status = corev1.ResourceQuotaStatus{Hard: c.Spec.Hard.DeepCopy(), Used: want.Used}
					return c, nil
				})
			if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

// terminalPod reports a pod that no longer counts against quota.
func terminalPod(o runtime.Object) bool {
	p, ok := o.(*corev1.Pod)
	return ok && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
}

// matchesScopes applies the quota scopes that concern pods: Terminating,
// NotTerminating, BestEffort, NotBestEffort, and PriorityClass in a scope
// selector. Objects other than pods are counted only by quotas without
// scopes, as upstream.
func matchesScopes(rq *corev1.ResourceQuota, k *registry.Kind, o runtime.Object) bool {
	scopes := append([]corev1.ResourceQuotaScope{}, rq.Spec.Scopes...)
	var selectors []corev1.ScopedResourceSelectorRequirement
	if rq.Spec.ScopeSelector != nil {
		selectors = rq.Spec.ScopeSelector.MatchExpressions
	}
	if len(scopes) == 0 && len(selectors) == 0 {
		return true
	}
	pod, ok := o.(*corev1.Pod)
	if !ok || k != podsKind {
		return false
	}
	in := func(scope corev1.ResourceQuotaScope) bool {
		switch scope {
		case corev1.ResourceQuotaScopeTerminating:
			return pod.Spec.ActiveDeadlineSeconds != nil
		case corev1.ResourceQuotaScopeNotTerminating:
			return pod.Spec.ActiveDeadlineSeconds == nil
		case corev1.ResourceQuotaScopeBestEffort:
			return registry.PodQOSClass(&pod.Spec) == corev1.PodQOSBestEffort
		case corev1.ResourceQuotaScopeNotBestEffort:
			return registry.PodQOSClass(&pod.Spec) != corev1.PodQOSBestEffort
		}
		return false
	}
	for _, s := range scopes {
		if !in(s) {
			return false
		}
	}
	for _, sel := range selectors {
		if sel.ScopeName != corev1.ResourceQuotaScopePriorityClass {
			if !in(sel.ScopeName) {
				return false
			}
			continue
		}
		has := false
		for _, v := range sel.Values {
			has = has || v == pod.Spec.PriorityClassName
		}
		switch sel.Operator {
		case corev1.ScopeSelectorOpIn:
			if !has {
				return false
			}
		case corev1.ScopeSelectorOpNotIn:
			if has {
				return false
			}
		case corev1.ScopeSelectorOpExists:
			if pod.Spec.PriorityClassName == "" {
				return false
			}
		case corev1.ScopeSelectorOpDoesNotExist:
			if pod.Spec.PriorityClassName != "" {
				return false
			}
		}
	}
	return true
}

// podComputeResource reports whether name is a compute resource a pod
// must declare when a quota limits it.
func podComputeResource(k *registry.Kind, name corev1.ResourceName) bool {
	if k != podsKind {
		return false
	}
	switch name {
	case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceRequestsCPU, corev1.ResourceRequestsMemory,
		corev1.ResourceLimitsCPU, corev1.ResourceLimitsMemory:
		return true
	}
	return false
}

// missingCompute lists the compute resources a quota limits that some
// container of pod does not declare.
func missingCompute(pod *corev1.Pod, hard corev1.ResourceList) []string {
	missing := map[string]bool{}
	check := func(cs []corev1.Container) {
		for _, c := range cs {
			for name := range hard {
				var res corev1.ResourceName
				var list corev1.ResourceList
				switch name {
				case corev1.ResourceCPU, corev1.ResourceRequestsCPU:
					res, list = corev1.ResourceCPU, c.Resources.Requests
				case corev1.ResourceMemory, corev1.ResourceRequestsMemory:
					res, list = corev1.ResourceMemory, c.Resources.Requests
				case corev1.ResourceLimitsCPU:
					res, list = corev1.ResourceCPU, c.Resources.Limits
				case corev1.ResourceLimitsMemory:
					res, list = corev1.ResourceMemory, c.Resources.Limits
				default:
					continue
				}
				if _, ok := list[res]; !ok {
					missing[string(name)] = true
				}
			}
		}
	}
	check(pod.Spec.InitContainers)
	check(pod.Spec.Containers)
	out := make([]string, 0, len(missing))
	for m := range missing {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// kindsCounting returns the kinds whose objects count toward a quota
// resource name.
func kindsCounting(name corev1.ResourceName) []*registry.Kind {
	switch name {
	case corev1.ResourcePods, corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage,
		corev1.ResourceRequestsCPU, corev1.ResourceRequestsMemory, corev1.ResourceRequestsEphemeralStorage,
		corev1.ResourceLimitsCPU, corev1.ResourceLimitsMemory, corev1.ResourceLimitsEphemeralStorage:
		return []*registry.Kind{podsKind}
	case corev1.ResourceServices, corev1.ResourceServicesNodePorts, corev1.ResourceServicesLoadBalancers:
		return []*registry.Kind{servicesKind}
	case corev1.ResourcePersistentVolumeClaims, corev1.ResourceRequestsStorage:
		return []*registry.Kind{pvcKind}
	case corev1.ResourceConfigMaps:
		return []*registry.Kind{kindOf("configmaps", "")}
	case corev1.ResourceSecrets:
		return []*registry.Kind{kindOf("secrets", "")}
	case corev1.ResourceQuotas:
		return []*registry.Kind{quotasKind}
	case corev1.ResourceReplicationControllers:
		return []*registry.Kind{kindOf("replicationcontrollers", "")}
	}
	s := string(name)
	if strings.HasPrefix(s, "requests.") && !strings.Contains(s, "/") {
		return []*registry.Kind{podsKind} // extended resources
	}
	if strings.HasSuffix(s, ".storageclass.storage.k8s.io/requests.storage") ||
		strings.HasSuffix(s, ".storageclass.storage.k8s.io/persistentvolumeclaims") {
		return []*registry.Kind{pvcKind}
	}
	if res, ok := strings.CutPrefix(s, "count/"); ok {
		resName, group, _ := strings.Cut(res, ".")
		for _, k := range registry.All() {
			if k.Resource == resName && k.GVK.Group == group && k.Namespaced {
				return []*registry.Kind{k}
			}
		}
	}
	return nil
}

// usageOf returns what one object uses, under every name a quota may
// give it.
func usageOf(k *registry.Kind, o runtime.Object) corev1.ResourceList {
	u := corev1.ResourceList{}
	one := resource.MustParse("1")
	count := "count/" + k.Resource
	if k.GVK.Group != "" {
		count += "." + k.GVK.Group
	}
	u[corev1.ResourceName(count)] = one.DeepCopy()
	switch obj := o.(type) {
	case *corev1.Pod:
		u[corev1.ResourcePods] = one.DeepCopy()
		req, lim := podTotals(obj)
		addOverhead := func(l corev1.ResourceList) {
			for n, q := range obj.Spec.Overhead {
				v := l[n]
				v.Add(q)
				l[n] = v
			}
		}
		addOverhead(req)
		addOverhead(lim)
		for n, q := range req {
			switch n {
			case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
				u[n] = q.DeepCopy()
				u["requests."+n] = q.DeepCopy()
			default:
				u["requests."+n] = q.DeepCopy()
			}
		}
		for n, q := range lim {
			switch n {
			case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
				u["limits."+n] = q.DeepCopy()
			}
		}
	case *corev1.Service:
		u[corev1.ResourceServices] = one.DeepCopy()
		ports := int64(0)
		for _, p := range obj.Spec.Ports {
			if p.NodePort != 0 || obj.Spec.Type == corev1.ServiceTypeNodePort {
				ports++
			}
		}
		if obj.Spec.Type == corev1.ServiceTypeNodePort || obj.Spec.Type == corev1.ServiceTypeLoadBalancer {
			u[corev1.ResourceServicesNodePorts] = *resource.NewQuantity(ports, resource.DecimalSI)
		}
		if obj.Spec.Type == corev1.ServiceTypeLoadBalancer {
			u[corev1.ResourceServicesLoadBalancers] = one.DeepCopy()
		}
	case *corev1.PersistentVolumeClaim:
		u[corev1.ResourcePersistentVolumeClaims] = one.DeepCopy()
		if q, ok := obj.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
			u[corev1.ResourceRequestsStorage] = q.DeepCopy()
			if obj.Spec.StorageClassName != nil && *obj.Spec.StorageClassName != "" {
				cls := *obj.Spec.StorageClassName + ".storageclass.storage.k8s.io/"
				u[corev1.ResourceName(cls+"requests.storage")] = q.DeepCopy()
				u[corev1.ResourceName(cls+"persistentvolumeclaims")] = one.DeepCopy()
			}
		}
	case *corev1.ConfigMap:
		u[corev1.ResourceConfigMaps] = one.DeepCopy()
	case *corev1.Secret:
		u[corev1.ResourceSecrets] = one.DeepCopy()
	case *corev1.ResourceQuota:
		u[corev1.ResourceQuotas] = one.DeepCopy()
	case *corev1.ReplicationController:
		u[corev1.ResourceReplicationControllers] = one.DeepCopy()
	}
	return u
}
