package endpoints

import (
	"cmp"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// plan is the writes that bring a Service's slices to the desired state.
// Slices in create have no name: the hub generates it.
type plan struct {
	create []*discoveryv1.EndpointSlice
	update []*discoveryv1.EndpointSlice
	delete []*discoveryv1.EndpointSlice
}

func (p plan) empty() bool { return len(p.create)+len(p.update)+len(p.delete) == 0 }

// sliceLabels returns the labels the Service's slices carry: the Service's
// own, plus the controller's.
func sliceLabels(svc *corev1.Service) map[string]string {
	l := map[string]string{}
	for k, v := range svc.Labels {
		switch k {
		case LabelServiceName, LabelManagedBy, LabelHeadless:
			continue
		}
		l[k] = v
	}
	l[LabelServiceName] = svc.Name
	l[LabelManagedBy] = ManagedByValue
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		l[LabelHeadless] = ""
	}
	return l
}

func ownerRef(svc *corev1.Service) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
		Controller: ptr(true), BlockOwnerDeletion: ptr(true),
	}
}

func ownedBy(s *discoveryv1.EndpointSlice, svc *corev1.Service) bool {
	for _, r := range s.OwnerReferences {
		if r.UID == svc.UID && r.Controller != nil && *r.Controller {
			return true
		}
	}
	return false
}

// slot is an existing slice being reconciled.
type slot struct {
	orig      *discoveryv1.EndpointSlice
	endpoints []discoveryv1.Endpoint
	changed   bool
}

// planSlices compares a Service's existing slices with the desired groups
// and returns the writes, with as few slices touched as it can:
//
//  1. in every slice of a group, endpoints still wanted are updated in
//     place and the others removed;
//  2. new endpoints fill the slices step 1 changed anyway;
//  3. what is left goes to the one untouched slice that has room for all
//     of it (the fullest such), else to new slices;
//  4. an untouched slice whose endpoints fit in the room left in slices
//     written anyway moves into them and is deleted: one write more, one
//     slice fewer (see absorbSmall).
//
// Slices are not otherwise rebalanced. A Service with no endpoint at all keeps one
// empty slice, so that it shows up in slice listings. triggerTime, when
// not empty, is written to every slice written.
func planSlices(svc *corev1.Service, groups map[string]*group, existing []*discoveryv1.EndpointSlice, maxPerSlice int, triggerTime string) plan {
	var p plan
	labels := sliceLabels(svc)
	byGroup := map[string][]*slot{}
	for _, s := range existing {
		if !ownedBy(s, svc) {
			p.delete = append(p.delete, s)
			continue
		}
		k := groupKey(s.AddressType, s.Ports)
		if _, ok := groups[k]; !ok {
			// No such group any more; an empty placeholder is handled
			// below.
			byGroup[""] = append(byGroup[""], &slot{orig: s})
			continue
		}
		byGroup[k] = append(byGroup[k], &slot{orig: s})
	}

	finish := func(sl *slot) {
		s := sl.orig
		if !sl.changed && maps.Equal(s.Labels, labels) {
			return
		}
		if len(sl.endpoints) == 0 {
			p.delete = append(p.delete, s)
			return
		}
		u := s.DeepCopy()
		u.Labels = maps.Clone(labels)
		u.Endpoints = sl.endpoints
		setTrigger(&u.ObjectMeta, triggerTime)
		p.update = append(p.update, u)
	}
	newSlice := func(g *group, eps []discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				GenerateName:    svc.Name + "-",
				Namespace:       svc.Namespace,
				Labels:          maps.Clone(labels),
				OwnerReferences: []metav1.OwnerReference{ownerRef(svc)},
			},
			AddressType: g.addressType,
			Ports:       g.ports,
			Endpoints:   eps,
		}
		setTrigger(&s.ObjectMeta, triggerTime)
		return s
	}

	for _, gk := range sortedKeys(groups) {
		g := groups[gk]
		remaining := maps.Clone(g.endpoints)
		slots := byGroup[gk]
		slices.SortFunc(slots, func(a, b *slot) int { return compareStr(a.orig.Name, b.orig.Name) })
		// Step 1: update and remove in place.
		for _, sl := range slots {
			for i := range sl.orig.Endpoints {
				old := &sl.orig.Endpoints[i]
				k := endpointKey(old)
				want, ok := remaining[k]
				if !ok {
					sl.changed = true
					continue
				}
				delete(remaining, k)
				if !apiequality.Semantic.DeepEqual(*old, want) {
					sl.changed = true
				}
				sl.endpoints = append(sl.endpoints, want)
			}
			if len(sl.endpoints) > maxPerSlice {
				// Written with a larger limit: shed the excess.
				for _, ep := range sl.endpoints[maxPerSlice:] {
					remaining[endpointKey(&ep)] = ep
				}
				sl.endpoints = sl.endpoints[:maxPerSlice]
				sl.changed = true
			}
		}
		keys := sortedKeys(remaining)
		// Step 2: top up the slices that are written anyway.
		for _, sl := range slots {
			for sl.changed && len(keys) > 0 && len(sl.endpoints) < maxPerSlice {
				sl.endpoints = append(sl.endpoints, remaining[keys[0]])
				keys = keys[1:]
			}
		}
		// Step 3: one untouched slice with room for the rest, else new
		// slices.
		if len(keys) > 0 {
			var best *slot
			for _, sl := range slots {
				if sl.changed || len(sl.endpoints)+len(keys) > maxPerSlice {
					continue
				}
				if best == nil || len(sl.endpoints) > len(best.endpoints) {
					best = sl
				}
			}
			if best != nil {
				for _, k := range keys {
					best.endpoints = append(best.endpoints, remaining[k])
				}
				best.changed = true
				keys = nil
			}
		}
		var fresh [][]discoveryv1.Endpoint
		for len(keys) > 0 {
			n := min(len(keys), maxPerSlice)
			eps := make([]discoveryv1.Endpoint, 0, maxPerSlice)
			for _, k := range keys[:n] {
				eps = append(eps, remaining[k])
			}
			keys = keys[n:]
			fresh = append(fresh, eps)
		}
		fresh = absorbSmall(slots, fresh, maxPerSlice)
		for _, eps := range fresh {
			p.create = append(p.create, newSlice(g, eps))
		}
		for _, sl := range slots {
			if len(sl.orig.Endpoints) == 0 && !sl.changed && len(sl.endpoints) == 0 {
				// An empty slice of a live group: not needed.
				p.delete = append(p.delete, sl.orig)
				continue
			}
			finish(sl)
		}
	}

	// Slices of groups that no longer exist go, except one empty
	// placeholder when the Service has no endpoints at all.
	leftovers := byGroup[""]
	slices.SortFunc(leftovers, func(a, b *slot) int { return compareStr(a.orig.Name, b.orig.Name) })
	needPlaceholder := len(groups) == 0
	placeholderType := addressTypes(svc)[0]
	for _, sl := range leftovers {
		s := sl.orig
		if needPlaceholder && len(s.Endpoints) == 0 && len(s.Ports) == 0 && s.AddressType == placeholderType {
			needPlaceholder = false
			if !maps.Equal(s.Labels, labels) {
				u := s.DeepCopy()
				u.Labels = maps.Clone(labels)
				p.update = append(p.update, u)
			}
			continue
		}
		p.delete = append(p.delete, s)
	}
	if needPlaceholder {
		p.create = append(p.create, newSlice(&group{addressType: placeholderType}, []discoveryv1.Endpoint{}))
	}
	return p
}

// absorbSmall keeps a Service's slices few. Additions arriving in waves
// leave small slices behind (250 endpoints in four slices instead of
// three), so while a plan writes anything, it also folds small slices into
// the room of others, smallest first, and deletes them:
//
//   - an untouched slice that fits in the room of slices written anyway
//     costs one delete and saves a slice;
//   - while there are more slices than the endpoints need, the smallest one,
//     if at most half full, also goes into untouched slices with room (the
//     roomiest first), one more update each. Fuller slices stay: one new
//     slice is cheaper than several updates, as upstream prefers.
//
// It returns fresh, possibly grown.
func absorbSmall(slots []*slot, fresh [][]discoveryv1.Endpoint, maxPerSlice int) [][]discoveryv1.Endpoint {
	free := func(n int) int { return max(maxPerSlice-n, 0) }
	total, live := 0, len(fresh)
	for _, sl := range slots {
		if len(sl.endpoints) > 0 {
			total += len(sl.endpoints)
			live++
		}
	}
	for _, eps := range fresh {
		total += len(eps)
	}
	needed := (total + maxPerSlice - 1) / maxPerSlice
	absorbed := map[*slot]bool{}
	// move puts eps into the room of the slots pass allows, then of the
	// fresh slices; it reports whether all of eps found a place.
	move := func(eps []discoveryv1.Endpoint, pass func(*slot) bool) []discoveryv1.Endpoint {
		for _, sl := range slots {
			if absorbed[sl] || !pass(sl) {
				continue
			}
			n := min(free(len(sl.endpoints)), len(eps))
			if n > 0 {
				sl.endpoints = append(sl.endpoints, eps[:n]...)
				sl.changed = true
				eps = eps[n:]
			}
		}
		for i := range fresh {
			n := min(free(len(fresh[i])), len(eps))
			fresh[i] = append(fresh[i], eps[:n]...)
			eps = eps[n:]
		}
		return eps
	}
	room := func(pass func(*slot) bool, except *slot) int {
		r := 0
		for _, sl := range slots {
			if sl != except && !absorbed[sl] && pass(sl) {
				r += free(len(sl.endpoints))
			}
		}
		for _, eps := range fresh {
			r += free(len(eps))
		}
		return r
	}
	written := func(sl *slot) bool { return sl.changed }
	any := func(sl *slot) bool { return len(sl.endpoints) > 0 || sl.changed }
	for live > 0 {
		var c *slot
		for _, sl := range slots {
			if absorbed[sl] || len(sl.endpoints) == 0 {
				continue
			}
			if c == nil || len(sl.endpoints) < len(c.endpoints) {
				c = sl
			}
		}
		if c == nil {
			break
		}
		switch {
		case !c.changed && len(c.endpoints) <= room(written, c):
			absorbed[c] = true
			move(c.endpoints, written)
		case live > needed && 2*len(c.endpoints) <= maxPerSlice && len(c.endpoints) <= room(any, c):
			absorbed[c] = true
			// Slices written anyway first, then the roomiest others.
			rest := move(c.endpoints, written)
			order := slices.Clone(slots)
			slices.SortStableFunc(order, func(a, b *slot) int { return cmp.Compare(len(a.endpoints), len(b.endpoints)) })
			for _, sl := range order {
				if len(rest) == 0 {
					break
				}
				if absorbed[sl] || sl.changed || len(sl.endpoints) == 0 {
					continue
				}
				n := min(free(len(sl.endpoints)), len(rest))
				sl.endpoints = append(sl.endpoints, rest[:n]...)
				sl.changed = true
				rest = rest[n:]
			}
		default:
			return fresh
		}
		c.endpoints, c.changed = nil, true
		live--
	}
	return fresh
}

func setTrigger(m *metav1.ObjectMeta, t string) {
	if t == "" {
		return
	}
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[AnnotationTriggerTime] = t
}

func compareStr(a, b string) int { return cmp.Compare(a, b) }
