package endpoints

//lint:file-ignore SA1019 EndpointSlice mirroring reads core/v1 Endpoints by definition

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and limits of EndpointSlice mirroring, as upstream's.
const (
	// MirroringManagedByValue marks the slices the mirroring controller
	// writes.
	MirroringManagedByValue = "endpointslicemirroring-controller.k8s.io"
	// LabelSkipMirror on an Endpoints object set to "true" keeps it from
	// being mirrored.
	LabelSkipMirror = discoveryv1.LabelSkipMirror
	// MaxMirroredPerSubset caps the addresses mirrored from one subset,
	// and the endpoints of one mirrored slice.
	MaxMirroredPerSubset = 1000
)

// mirrorGroup is the mirrored endpoints of one address type and port list.
type mirrorGroup struct {
	key         string
	addressType discoveryv1.AddressType
	ports       []discoveryv1.EndpointPort
	endpoints   []discoveryv1.Endpoint
}

// mirroredGroups turns an Endpoints object's subsets into endpoints grouped
// by address type and ports, in a stable order. Each subset gives at most
// maxPerSubset addresses, ready ones first; addresses that are not IPs are
// skipped, as are repeats within a group.
func mirroredGroups(ep *corev1.Endpoints, maxPerSubset int) []*mirrorGroup {
	byKey := map[string]*mirrorGroup{}
	seen := map[string]map[string]bool{}
	for _, ss := range ep.Subsets {
		ports := make([]discoveryv1.EndpointPort, 0, len(ss.Ports))
		for _, p := range ss.Ports {
			ports = append(ports, discoveryv1.EndpointPort{
				Name: new(p.Name), Port: new(p.Port), Protocol: new(p.Protocol), AppProtocol: p.AppProtocol,
			})
		}
		added := 0
		add := func(a corev1.EndpointAddress, ready bool) {
			if added >= maxPerSubset {
				return
			}
			ip, err := netip.ParseAddr(a.IP)
			if err != nil {
				return
			}
			t := discoveryv1.AddressTypeIPv4
			if ip.Unmap().Is6() {
				t = discoveryv1.AddressTypeIPv6
			}
			k := groupKey(t, ports)
			g := byKey[k]
			if g == nil {
				g = &mirrorGroup{key: k, addressType: t, ports: ports}
				byKey[k] = g
				seen[k] = map[string]bool{}
			}
			if seen[k][a.IP] {
				return
			}
			seen[k][a.IP] = true
			added++
			e := discoveryv1.Endpoint{
				Addresses:  []string{a.IP},
				Conditions: discoveryv1.EndpointConditions{Ready: new(ready)},
				TargetRef:  a.TargetRef,
				NodeName:   a.NodeName,
			}
			if a.Hostname != "" {
				e.Hostname = new(a.Hostname)
			}
			g.endpoints = append(g.endpoints, e)
		}
		for _, a := range ss.Addresses {
			add(a, true)
		}
		for _, a := range ss.NotReadyAddresses {
			add(a, false)
		}
	}
	keys := slices.Sorted(maps.Keys(byKey))
	out := make([]*mirrorGroup, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

// mirroredMeta returns the labels and annotations of the slices mirrored
// from ep for the Service svc: the Endpoints' own, less the ones
// describing the Endpoints object alone, plus the service name and
// managed-by labels.
func mirroredMeta(ep *corev1.Endpoints, svc string) (map[string]string, map[string]string) {
	l := maps.Clone(ep.Labels)
	if l == nil {
		l = map[string]string{}
	}
	delete(l, LabelSkipMirror)
	l[LabelServiceName] = svc
	l[LabelManagedBy] = MirroringManagedByValue
	var a map[string]string
	for k, v := range ep.Annotations {
		if k == corev1.EndpointsLastChangeTriggerTime || k == corev1.LastAppliedConfigAnnotation {
			continue
		}
		if a == nil {
			a = map[string]string{}
		}
		a[k] = v
	}
	return l, a
}

// mirrorPlan is the writes that mirror an Endpoints object.
type mirrorPlan struct {
	create, update, delete []*discoveryv1.EndpointSlice
}

// planMirror matches the desired slices of ep to the existing mirrored
// slices by address type and ports, reusing slices in name order, and
// returns the creations, updates and deletions that make them equal.
func planMirror(ep *corev1.Endpoints, existing []*discoveryv1.EndpointSlice, maxPerSlice int) mirrorPlan {
	svc := ep.Name
	labels, annotations := mirroredMeta(ep, svc)
	owner := metav1.NewControllerRef(ep, corev1.SchemeGroupVersion.WithKind("Endpoints"))
	have := map[string][]*discoveryv1.EndpointSlice{}
	slices.SortFunc(existing, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range existing {
		k := groupKey(s.AddressType, s.Ports)
		have[k] = append(have[k], s)
	}
	var p mirrorPlan
	for _, g := range mirroredGroups(ep, MaxMirroredPerSubset) {
		for chunk := range slices.Chunk(g.endpoints, maxPerSlice) {
			want := &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{
					Namespace: ep.Namespace, Labels: labels, Annotations: annotations,
					OwnerReferences: []metav1.OwnerReference{*owner},
				},
				AddressType: g.addressType,
				Endpoints:   chunk,
				Ports:       g.ports,
			}
			if olds := have[g.key]; len(olds) > 0 {
				old := olds[0]
				have[g.key] = olds[1:]
				if sameMirror(old, want) {
					continue
				}
				u := old.DeepCopy()
				u.Labels, u.Annotations, u.OwnerReferences = labels, annotations, want.OwnerReferences
				u.Endpoints, u.Ports = want.Endpoints, want.Ports
				p.update = append(p.update, u)
				continue
			}
			want.GenerateName = svc + "-"
			p.create = append(p.create, want)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(have)) {
		p.delete = append(p.delete, have[k]...)
	}
	return p
}

// sameMirror says whether an existing slice already holds what want does.
func sameMirror(cur, want *discoveryv1.EndpointSlice) bool {
	return maps.Equal(cur.Labels, want.Labels) && maps.Equal(cur.Annotations, want.Annotations) &&
		equality.Semantic.DeepEqual(cur.OwnerReferences, want.OwnerReferences) &&
		equality.Semantic.DeepEqual(cur.Endpoints, want.Endpoints) &&
		equality.Semantic.DeepEqual(cur.Ports, want.Ports)
}
