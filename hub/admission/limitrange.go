package admission

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"

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
	var ns string
	switch o := obj.(type) {
	case *corev1.Pod:
		ns = o.Namespace
	case *corev1.PersistentVolumeClaim:
		ns = o.Namespace
	default:
		return nil, nil
	}
	objs, err := l.a.listIn(ctx, limitRangesKind, ns)
	if err != nil {
		return nil, fmt.Errorf("list limit ranges: %w", err)
	}
	if len(objs) == 0 {
		return nil, nil
	}
	ranges := make([]*corev1.LimitRange, 0, len(objs))
	for _, o := range objs {
		ranges = append(ranges, o.(*corev1.LimitRange))
	}
	sort.Slice(ranges, func(i, j int) bool { return ranges[i].Name < ranges[j].Name })
	var errs []string
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
		return nil, nil
	}
	m, _ := obj.(interface{ GetName() string })
	msg := errs[0]
	if len(errs) > 1 {
		msg = "[" + strings.Join(errs, ", ") + "]"
	}
	return nil, apierrors.NewForbidden(k.GroupResource(), m.GetName(), fmt.Errorf("%s", msg))
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

// validatePod checks a pod against one LimitRange.
func validatePod(pod *corev1.Pod, lr *corev1.LimitRange) []string {
	var errs []string
	for _, item := range lr.Spec.Limits {
		switch item.Type {
		case corev1.LimitTypeContainer:
			all := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
			for _, c := range all {
				errs = append(errs, checkItem(item, "Container", c.Resources.Requests, c.Resources.Limits)...)
			}
		case corev1.LimitTypePod:
			req, lim := podTotals(pod)
			errs = append(errs, checkItem(item, "Pod", req, lim)...)
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

func validateClaim(pvc *corev1.PersistentVolumeClaim, lr *corev1.LimitRange) []string {
	var errs []string
	for _, item := range lr.Spec.Limits {
		if item.Type != corev1.LimitTypePersistentVolumeClaim {
			continue
		}
		errs = append(errs, checkItem(item, "PersistentVolumeClaim", pvc.Spec.Resources.Requests, pvc.Spec.Resources.Limits)...)
	}
	return errs
}

// checkItem applies min, max and maxLimitRequestRatio of one item.
func checkItem(item corev1.LimitRangeItem, what string, req, lim corev1.ResourceList) []string {
	var errs []string
	for _, name := range sortedNames(item.Min) {
		min := item.Min[name]
		r, ok := req[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Sprintf("minimum %s usage per %s is %s.  No request is specified", name, what, min.String()))
		case r.Cmp(min) < 0:
			errs = append(errs, fmt.Sprintf("minimum %s usage per %s is %s, but request is %s", name, what, min.String(), r.String()))
		}
	}
	for _, name := range sortedNames(item.Max) {
		max := item.Max[name]
		l, ok := lim[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Sprintf("maximum %s usage per %s is %s.  No limit is specified", name, what, max.String()))
		case l.Cmp(max) > 0:
			errs = append(errs, fmt.Sprintf("maximum %s usage per %s is %s, but limit is %s", name, what, max.String(), l.String()))
		}
	}
	for _, name := range sortedNames(item.MaxLimitRequestRatio) {
		ratio := item.MaxLimitRequestRatio[name]
		l, lok := lim[name]
		r, rok := req[name]
		if !lok || !rok {
			errs = append(errs, fmt.Sprintf("%s max limit to request ratio per %s is %s, but no request or limit is specified", name, what, ratio.String()))
			continue
		}
		if r.IsZero() {
			continue
		}
		got := float64(l.MilliValue()) / float64(r.MilliValue())
		if got > float64(ratio.MilliValue())/1000 {
			errs = append(errs, fmt.Sprintf("%s max limit to request ratio per %s is %s, but provided ratio is %f", name, what, ratio.String(), got))
		}
	}
	return errs
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
