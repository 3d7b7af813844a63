package admission

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"

	"github.com/tether-edge/tether/hub/registry"
)

// limitRanger applies the namespace's LimitRanges to new pods and claims:
// it fills in default requests and limits of containers, then refuses what
// breaks a minimum, a maximum or a limit-to-request ratio, with upstream's
// messages.
type limitRanger struct{ a *Admission }

// limitRangerAnnotation records which defaults were set, as upstream does.
const limitRangerAnnotation = "kubernetes.io/limit-ranger"

// AdmitCreate implements storage.Admitter.
func (l *limitRanger) AdmitCreate(ctx context.Context, k *registry.Kind, obj runtime.Object, _ bool) (func(), error) {
	if k != podsKind && k != pvcKind {
		return nil, nil
	}
	return nil, l.admit(ctx, k, obj)
}

// AdmitUpdate implements storage.UpdateAdmitter. As upstream, a claim is
// checked again on every update (a resize above the maximum is refused),
// unless it is being deleted; pods are not, their resources being fixed
// once created.
func (l *limitRanger) AdmitUpdate(ctx context.Context, k *registry.Kind, obj, old runtime.Object, _ bool) error {
	if k != pvcKind {
		return nil
	}
	if o, ok := old.(*corev1.PersistentVolumeClaim); ok && o.DeletionTimestamp != nil {
		return nil
	}
	return l.admit(ctx, k, obj)
}

// admit applies the namespace's LimitRanges to a pod or claim.
func (l *limitRanger) admit(ctx context.Context, k *registry.Kind, obj runtime.Object) error {
	var ns, name string
	switch o := obj.(type) {
	case *corev1.Pod:
		ns, name = o.Namespace, o.Name
	case *corev1.PersistentVolumeClaim:
		ns, name = o.Namespace, o.Name
	default:
		return nil
	}
	objs, err := l.a.listIn(ctx, limitRangesKind, ns)
	if err != nil {
		return fmt.Errorf("list limit ranges: %w", err)
	}
	if len(objs) == 0 {
		return nil
	}
	ranges := make([]*corev1.LimitRange, 0, len(objs))
	for _, o := range objs {
		ranges = append(ranges, o.(*corev1.LimitRange))
	}
	sort.Slice(ranges, func(i, j int) bool { return ranges[i].Name < ranges[j].Name })
	var errs []error
	switch o := obj.(type) {
	case *corev1.Pod:
		setPodDefaults(o, ranges)
		for _, lr := range ranges {
			errs = append(errs, validatePod(o, lr)...)
		}
		if len(errs) == 0 {
			o.Status.QOSClass = registry.PodQOSClass(&o.Spec)
		}
	case *corev1.PersistentVolumeClaim:
		for _, lr := range ranges {
			errs = append(errs, validateClaim(o, lr)...)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	// An aggregate prints one message alone and several, without
	// repeats, in brackets, as upstream's admission does.
	return apierrors.NewForbidden(k.GroupResource(), name, utilerrors.NewAggregate(errs))
}

// setPodDefaults fills missing container requests and limits from the
// first LimitRange that has defaults for them.
func setPodDefaults(pod *corev1.Pod, ranges []*corev1.LimitRange) {
	var notes []string
	apply := func(c *corev1.Container) {
		for _, lr := range ranges {
			for _, item := range lr.Spec.Limits {
				if item.Type != corev1.LimitTypeContainer {
					continue
				}
				for name, q := range item.DefaultRequest {
					if _, ok := c.Resources.Requests[name]; ok {
						continue
					}
					// A container that sets a limit but no request gets the
					// limit as its request, not the default (API defaulting
					// already did that; keep it).
					if c.Resources.Requests == nil {
						c.Resources.Requests = corev1.ResourceList{}
					}
					c.Resources.Requests[name] = q.DeepCopy()
					notes = append(notes, fmt.Sprintf("%s request for %s %s", name, containerWord(pod, c), c.Name))
				}
				for name, q := range item.Default {
					if _, ok := c.Resources.Limits[name]; ok {
						continue
					}
					if c.Resources.Limits == nil {
						c.Resources.Limits = corev1.ResourceList{}
					}
					c.Resources.Limits[name] = q.DeepCopy()
					notes = append(notes, fmt.Sprintf("%s limit for %s %s", name, containerWord(pod, c), c.Name))
				}
			}
		}
	}
	for i := range pod.Spec.InitContainers {
		apply(&pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		apply(&pod.Spec.Containers[i])
	}
	if len(notes) > 0 {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[limitRangerAnnotation] = "LimitRanger plugin set: " + strings.Join(notes, "; ")
	}
}

func containerWord(pod *corev1.Pod, c *corev1.Container) string {
	for i := range pod.Spec.InitContainers {
		if &pod.Spec.InitContainers[i] == c {
			return "init container"
		}
	}
	return "container"
}

// validatePod checks a pod against one LimitRange: every container, then
// every init container, then the pod's totals, as upstream orders them.
func validatePod(pod *corev1.Pod, lr *corev1.LimitRange) []error {
	var errs []error
	for _, item := range lr.Spec.Limits {
		switch item.Type {
		case corev1.LimitTypeContainer:
			for _, c := range pod.Spec.Containers {
				errs = append(errs, checkItem(item, c.Resources.Requests, c.Resources.Limits)...)
			}
			for _, c := range pod.Spec.InitContainers {
				errs = append(errs, checkItem(item, c.Resources.Requests, c.Resources.Limits)...)
			}
		case corev1.LimitTypePod:
			req, lim := podTotals(pod)
			errs = append(errs, checkItem(item, req, lim)...)
		}
	}
	return errs
}

// podTotals sums the containers' requests and limits, with init containers
// counted by their largest value as upstream's pod limits do.
func podTotals(pod *corev1.Pod) (req, lim corev1.ResourceList) {
	req, lim = corev1.ResourceList{}, corev1.ResourceList{}
	for _, c := range pod.Spec.Containers {
		addList(req, c.Resources.Requests)
		addList(lim, c.Resources.Limits)
	}
	for _, c := range pod.Spec.InitContainers {
		maxList(req, c.Resources.Requests)
		maxList(lim, c.Resources.Limits)
	}
	return req, lim
}

// validateClaim checks a claim against one LimitRange. A claim's limits
// are not what it asks for: its minimum and maximum both apply to its
// requests.
func validateClaim(pvc *corev1.PersistentVolumeClaim, lr *corev1.LimitRange) []error {
	var errs []error
	for _, item := range lr.Spec.Limits {
		if item.Type != corev1.LimitTypePersistentVolumeClaim {
			continue
		}
		what := string(item.Type)
		req := pvc.Spec.Resources.Requests
		for _, name := range sortedNames(item.Min) {
			errs = appendErr(errs, minConstraint(what, name, item.Min[name], req, nil))
		}
		for _, name := range sortedNames(item.Max) {
			errs = appendErr(errs, maxRequestConstraint(what, name, item.Max[name], req))
		}
	}
	return errs
}

// checkItem applies min, max and maxLimitRequestRatio of one Container or
// Pod item.
func checkItem(item corev1.LimitRangeItem, req, lim corev1.ResourceList) []error {
	var errs []error
	what := string(item.Type)
	for _, name := range sortedNames(item.Min) {
		errs = appendErr(errs, minConstraint(what, name, item.Min[name], req, lim))
	}
	for _, name := range sortedNames(item.Max) {
		errs = appendErr(errs, maxConstraint(what, name, item.Max[name], req, lim))
	}
	for _, name := range sortedNames(item.MaxLimitRequestRatio) {
		errs = appendErr(errs, ratioConstraint(what, name, item.MaxLimitRequestRatio[name], req, lim))
	}
	return errs
}

func appendErr(errs []error, err error) []error {
	if err != nil {
		errs = append(errs, err)
	}
	return errs
}

// values returns request, limit and bound in milli-units when none of
// them would overflow, in units otherwise, as upstream compares them.
func values(req, lim, bound resource.Quantity) (r, l, b int64) {
	r, l, b = req.Value(), lim.Value(), bound.Value()
	if r <= resource.MaxMilliValue && l <= resource.MaxMilliValue && b <= resource.MaxMilliValue {
		r, l, b = req.MilliValue(), lim.MilliValue(), bound.MilliValue()
	}
	return r, l, b
}

// minConstraint requires a request, and a request and limit (when set)
// of at least lo.
func minConstraint(what string, name corev1.ResourceName, lo resource.Quantity, req, lim corev1.ResourceList) error {
	rq, rok := req[name]
	lq, lok := lim[name]
	r, l, b := values(rq, lq, lo)
	switch {
	case !rok:
		return fmt.Errorf("minimum %s usage per %s is %s.  No request is specified", name, what, lo.String())
	case r < b:
		return fmt.Errorf("minimum %s usage per %s is %s, but request is %s", name, what, lo.String(), rq.String())
	case lok && l < b:
		return fmt.Errorf("minimum %s usage per %s is %s, but limit is %s", name, what, lo.String(), lq.String())
	}
	return nil
}

// maxConstraint requires a limit, and a limit and request (when set) of
// at most hi.
func maxConstraint(what string, name corev1.ResourceName, hi resource.Quantity, req, lim corev1.ResourceList) error {
	rq, rok := req[name]
	lq, lok := lim[name]
	r, l, b := values(rq, lq, hi)
	switch {
	case !lok:
		return fmt.Errorf("maximum %s usage per %s is %s.  No limit is specified", name, what, hi.String())
	case l > b:
		return fmt.Errorf("maximum %s usage per %s is %s, but limit is %s", name, what, hi.String(), lq.String())
	case rok && r > b:
		return fmt.Errorf("maximum %s usage per %s is %s, but request is %s", name, what, hi.String(), rq.String())
	}
	return nil
}

// maxRequestConstraint requires a request of at most hi; it is the
// maximum of claims, which ask for storage by their requests alone.
func maxRequestConstraint(what string, name corev1.ResourceName, hi resource.Quantity, req corev1.ResourceList) error {
	rq, rok := req[name]
	r, _, b := values(rq, resource.Quantity{}, hi)
	switch {
	case !rok:
		return fmt.Errorf("maximum %s usage per %s is %s.  No request is specified", name, what, hi.String())
	case r > b:
		return fmt.Errorf("maximum %s usage per %s is %s, but request is %s", name, what, hi.String(), rq.String())
	}
	return nil
}

// ratioConstraint bounds limit / request.
func ratioConstraint(what string, name corev1.ResourceName, ratio resource.Quantity, req, lim corev1.ResourceList) error {
	rq, rok := req[name]
	lq, lok := lim[name]
	r, l, _ := values(rq, lq, ratio)
	if !rok || r == 0 {
		return fmt.Errorf("%s max limit to request ratio per %s is %s, but no request is specified or request is 0", name, what, ratio.String())
	}
	if !lok || l == 0 {
		return fmt.Errorf("%s max limit to request ratio per %s is %s, but no limit is specified or limit is 0", name, what, ratio.String())
	}
	got := float64(l) / float64(r)
	shown, bound := got, float64(ratio.Value())
	if ratio.Value() <= resource.MaxMilliValue {
		got *= 1000
		bound = float64(ratio.MilliValue())
	}
	if got > bound {
		return fmt.Errorf("%s max limit to request ratio per %s is %s, but provided ratio is %f", name, what, ratio.String(), shown)
	}
	return nil
}

func sortedNames(l corev1.ResourceList) []corev1.ResourceName {
	names := make([]corev1.ResourceName, 0, len(l))
	for n := range l {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return names[i] < names[j] })
	return names
}

func addList(dst, src corev1.ResourceList) {
	for n, q := range src {
		v := dst[n]
		v.Add(q)
		dst[n] = v
	}
}

func maxList(dst, src corev1.ResourceList) {
	for n, q := range src {
		if v, ok := dst[n]; !ok || q.Cmp(v) > 0 {
			dst[n] = q.DeepCopy()
		}
	}
}
