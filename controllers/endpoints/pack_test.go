package endpoints

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func testService(target intstr.IntOrString) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "svc-uid", Labels: map[string]string{"team": "a"}},
		Spec: corev1.ServiceSpec{
			Selector:   map[string]string{"app": "web"},
			ClusterIP:  "10.0.0.10",
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: target, Protocol: corev1.ProtocolTCP}},
		},
	}
}

func testPod(i int, ready bool, port int32) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%03d", i), Namespace: "ns", UID: types.UID(fmt.Sprintf("uid-%03d", i)), Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{
			Name: "c", Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: port}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)},
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	return p
}

func zoneA(string) string { return "zone-a" }

// generated numbers the names apply gives new slices.
var generated int

// apply turns a plan into the slices the hub would then hold.
func apply(existing []*discoveryv1.EndpointSlice, p plan) []*discoveryv1.EndpointSlice {
	byName := map[string]*discoveryv1.EndpointSlice{}
	for _, s := range existing {
		byName[s.Name] = s
	}
	for _, s := range p.delete {
		delete(byName, s.Name)
	}
	for _, s := range p.update {
		byName[s.Name] = s
	}
	for _, s := range p.create {
		s = s.DeepCopy()
		generated++
		s.Name = fmt.Sprintf("%s%05d", s.GenerateName, generated)
		byName[s.Name] = s
	}
	out := make([]*discoveryv1.EndpointSlice, 0, len(byName))
	for _, k := range sortedKeys(byName) {
		out = append(out, byName[k])
	}
	return out
}

func countEndpoints(ss []*discoveryv1.EndpointSlice) int {
	n := 0
	for _, s := range ss {
		n += len(s.Endpoints)
	}
	return n
}

func TestPackSlices(t *testing.T) {
	svc := testService(intstr.FromString("web"))
	var pods []*corev1.Pod
	for i := range 250 {
		pods = append(pods, testPod(i, true, 8080))
	}

	t.Run("250 pods give 3 slices of at most 100", func(t *testing.T) {
		p := planSlices(svc, desiredGroups(svc, pods, zoneA), nil, 100, "")
		if len(p.create) != 3 || len(p.update) != 0 || len(p.delete) != 0 {
			t.Fatalf("plan: %d creates, %d updates, %d deletes", len(p.create), len(p.update), len(p.delete))
		}
		for _, s := range p.create {
			if len(s.Endpoints) > 100 {
				t.Errorf("slice with %d endpoints", len(s.Endpoints))
			}
			if s.Labels[LabelServiceName] != "web" || s.Labels[LabelManagedBy] != ManagedByValue || s.Labels["team"] != "a" {
				t.Errorf("labels %v", s.Labels)
			}
			if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "svc-uid" || !*s.OwnerReferences[0].Controller {
				t.Errorf("owner %v", s.OwnerReferences)
			}
			if *s.Ports[0].Port != 8080 || *s.Ports[0].Name != "http" {
				t.Errorf("ports %v", s.Ports)
			}
		}
		if n := countEndpoints(p.create); n != 250 {
			t.Errorf("%d endpoints, want 250", n)
		}
	})

	t.Run("a readiness change writes one slice", func(t *testing.T) {
		cur := apply(nil, planSlices(svc, desiredGroups(svc, pods, zoneA), nil, 100, ""))
		changed := append([]*corev1.Pod(nil), pods...)
		changed[17] = testPod(17, false, 8080)
		p := planSlices(svc, desiredGroups(svc, changed, zoneA), cur, 100, "t")
		if len(p.create) != 0 || len(p.update) != 1 || len(p.delete) != 0 {
			t.Fatalf("plan: %d creates, %d updates, %d deletes", len(p.create), len(p.update), len(p.delete))
		}
		for _, ep := range p.update[0].Endpoints {
			if ep.TargetRef.Name == "p017" && (*ep.Conditions.Ready || *ep.Conditions.Serving) {
				t.Errorf("p017 conditions %+v", ep.Conditions)
			}
		}
		if p.update[0].Annotations[AnnotationTriggerTime] != "t" {
			t.Errorf("annotations %v", p.update[0].Annotations)
		}
		// Nothing changed: nothing written.
		if p := planSlices(svc, desiredGroups(svc, pods, zoneA), cur, 100, ""); !p.empty() {
			t.Errorf("unchanged input planned %+v", p)
		}
	})

	t.Run("new endpoints prefer one new slice over several updates", func(t *testing.T) {
		// Two slices with 5 free places each, 10 new endpoints: one
		// new slice, the two untouched (the documented example).
		// Two full slices at a limit of 95 are two with 5 free places
		// at 100.
		all := apply(nil, planSlices(svc, desiredGroups(svc, pods[:190], zoneA), nil, 95, ""))
		if len(all) != 2 {
			t.Fatalf("%d slices", len(all))
		}
		p := planSlices(svc, desiredGroups(svc, pods[:200], zoneA), all, 100, "")
		if len(p.create) != 1 || len(p.update) != 0 || len(p.delete) != 0 {
			t.Fatalf("plan: %d creates, %d updates, %d deletes", len(p.create), len(p.update), len(p.delete))
		}
	})

	t.Run("removal frees room that additions reuse", func(t *testing.T) {
		cur := apply(nil, planSlices(svc, desiredGroups(svc, pods[:100], zoneA), nil, 100, ""))
		next := append(append([]*corev1.Pod(nil), pods[1:100]...), pods[100])
		p := planSlices(svc, desiredGroups(svc, next, zoneA), cur, 100, "")
		if len(p.create) != 0 || len(p.update) != 1 || len(p.delete) != 0 || len(p.update[0].Endpoints) != 100 {
			t.Fatalf("plan: %d creates, %d updates, %d deletes", len(p.create), len(p.update), len(p.delete))
		}
	})

	t.Run("no pods leave one empty slice", func(t *testing.T) {
		cur := apply(nil, planSlices(svc, desiredGroups(svc, pods[:3], zoneA), nil, 100, ""))
		p := planSlices(svc, desiredGroups(svc, nil, zoneA), cur, 100, "")
		if len(p.create) != 1 || len(p.delete) != 1 || len(p.create[0].Endpoints) != 0 || p.create[0].Ports != nil {
			t.Fatalf("plan: %+v", p)
		}
		cur = apply(cur, p)
		if p := planSlices(svc, desiredGroups(svc, nil, zoneA), cur, 100, ""); !p.empty() {
			t.Fatalf("placeholder rewritten: %+v", p)
		}
		p = planSlices(svc, desiredGroups(svc, pods[:3], zoneA), cur, 100, "")
		if len(p.create) != 1 || len(p.delete) != 1 {
			t.Fatalf("placeholder not replaced: %+v", p)
		}
	})

	t.Run("slices of another service incarnation are deleted", func(t *testing.T) {
		cur := apply(nil, planSlices(svc, desiredGroups(svc, pods[:3], zoneA), nil, 100, ""))
		svc2 := svc.DeepCopy()
		svc2.UID = "svc-uid-2"
		p := planSlices(svc2, desiredGroups(svc2, pods[:3], zoneA), cur, 100, "")
		if len(p.create) != 1 || len(p.delete) != 1 {
			t.Fatalf("plan: %+v", p)
		}
	})
}

func TestPortGrouping(t *testing.T) {
	svc := testService(intstr.FromString("web"))
	pods := []*corev1.Pod{testPod(1, true, 8080), testPod(2, true, 9090), testPod(3, true, 8080)}
	noPort := testPod(4, true, 8080)
	noPort.Spec.Containers[0].Ports = nil
	pods = append(pods, noPort)
	g := desiredGroups(svc, pods, zoneA)
	if len(g) != 3 {
		t.Fatalf("%d groups, want 3 (8080, 9090, no port)", len(g))
	}
	sizes := map[int32]int{}
	for _, gr := range g {
		port := int32(-1)
		if len(gr.ports) == 1 {
			port = *gr.ports[0].Port
		}
		sizes[port] = len(gr.endpoints)
	}
	if sizes[8080] != 2 || sizes[9090] != 1 || sizes[-1] != 1 {
		t.Errorf("group sizes %v", sizes)
	}
	p := planSlices(svc, g, nil, 100, "")
	if len(p.create) != 3 {
		t.Errorf("%d slices, want 3", len(p.create))
	}

	num := testService(intstr.FromInt32(0))
	for _, gr := range desiredGroups(num, pods, zoneA) {
		if *gr.ports[0].Port != 80 {
			t.Errorf("targetPort 0 resolved to %d, want the service port", *gr.ports[0].Port)
		}
	}
}

func TestEndpointFields(t *testing.T) {
	svc := testService(intstr.FromInt32(8080))
	ready := testPod(1, true, 8080)
	ready.Spec.Hostname, ready.Spec.Subdomain = "h1", "web"
	otherSub := testPod(2, true, 8080)
	otherSub.Spec.Hostname, otherSub.Spec.Subdomain = "h2", "other"
	unready := testPod(3, false, 8080)
	terminating := testPod(4, true, 8080)
	terminating.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	done := testPod(5, true, 8080)
	done.Status.Phase = corev1.PodSucceeded
	noIP := testPod(6, true, 8080)
	noIP.Status.PodIP = ""
	v6 := testPod(7, true, 8080)
	v6.Status.PodIPs = []corev1.PodIP{{IP: "10.1.0.8"}, {IP: "fd00::8"}}

	type want struct{ ready, serving, terminating bool }
	check := func(t *testing.T, svc *corev1.Service, exp map[string]want) {
		t.Helper()
		g := desiredGroups(svc, []*corev1.Pod{ready, otherSub, unready, terminating, done, noIP, v6}, zoneA)
		got := map[string]discoveryv1.Endpoint{}
		for _, gr := range g {
			if gr.addressType != discoveryv1.AddressTypeIPv4 {
				t.Errorf("address type %s for an IPv4 service", gr.addressType)
			}
			for _, ep := range gr.endpoints {
				got[ep.TargetRef.Name] = ep
			}
		}
		if len(got) != len(exp) {
			t.Fatalf("endpoints %v, want %v", len(got), exp)
		}
		for name, w := range exp {
			ep, ok := got[name]
			if !ok {
				t.Fatalf("no endpoint for %s", name)
			}
			c := ep.Conditions
			if *c.Ready != w.ready || *c.Serving != w.serving || *c.Terminating != w.terminating {
				t.Errorf("%s: ready %v serving %v terminating %v, want %+v", name, *c.Ready, *c.Serving, *c.Terminating, w)
			}
			if *ep.NodeName != "n1" || *ep.Zone != "zone-a" {
				t.Errorf("%s: node %v zone %v", name, ep.NodeName, ep.Zone)
			}
		}
		if h := got["p001"].Hostname; h == nil || *h != "h1" {
			t.Errorf("hostname of p001 %v, want h1", h)
		}
		if got["p002"].Hostname != nil {
			t.Errorf("hostname of p002 set though its subdomain is not the service")
		}
	}
	check(t, svc, map[string]want{
		"p001": {true, true, false}, "p002": {true, true, false}, "p003": {false, false, false},
		"p004": {false, true, true}, "p007": {true, true, false},
	})
	pub := svc.DeepCopy()
	pub.Spec.PublishNotReadyAddresses = true
	check(t, pub, map[string]want{
		"p001": {true, true, false}, "p002": {true, true, false}, "p003": {true, true, false},
		"p004": {true, true, true}, "p007": {true, true, false},
	})

	dual := svc.DeepCopy()
	dual.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	g := desiredGroups(dual, []*corev1.Pod{v6}, zoneA)
	if len(g) != 2 {
		t.Fatalf("dual-stack: %d groups", len(g))
	}
	for _, gr := range g {
		for _, ep := range gr.endpoints {
			if gr.addressType == discoveryv1.AddressTypeIPv6 && ep.Addresses[0] != "fd00::8" {
				t.Errorf("IPv6 slice has %v", ep.Addresses)
			}
		}
	}
}

func TestLegacySubsets(t *testing.T) {
	svc := testService(intstr.FromString("web"))
	pods := []*corev1.Pod{testPod(1, true, 8080), testPod(2, false, 8080), testPod(3, true, 9090)}
	term := testPod(4, true, 8080)
	term.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	pods = append(pods, term)
	ss, trunc := desiredSubsets(svc, pods, MaxEndpointsPerObject)
	if trunc || len(ss) != 2 {
		t.Fatalf("subsets %+v truncated %v", ss, trunc)
	}
	for _, s := range ss {
		switch s.Ports[0].Port {
		case 8080:
			if len(s.Addresses) != 1 || len(s.NotReadyAddresses) != 1 {
				t.Errorf("8080 subset %+v", s)
			}
		case 9090:
			if len(s.Addresses) != 1 || len(s.NotReadyAddresses) != 0 {
				t.Errorf("9090 subset %+v", s)
			}
		}
	}

	var many []*corev1.Pod
	for i := range 1200 {
		many = append(many, testPod(i, i%2 == 0, 8080))
	}
	ss, trunc = desiredSubsets(svc, many, MaxEndpointsPerObject)
	if !trunc || len(ss) != 1 || len(ss[0].Addresses) != 600 || len(ss[0].NotReadyAddresses) != 400 {
		t.Fatalf("truncated %v: %d subsets", trunc, len(ss))
	}
}

// Additions in waves leave a small slice behind unless a later plan moves
// it into room it writes anyway.
func TestPackAbsorbsSmallSlices(t *testing.T) {
	svc := testService(intstr.FromString("web"))
	var pods []*corev1.Pod
	for i := range 250 {
		pods = append(pods, testPod(i, i >= 240, 8080))
	}
	// 4, then 100 more (a new full slice; the 4 stays untouched), then
	// the rest.
	cur := apply(nil, planSlices(svc, desiredGroups(svc, pods[:4], zoneA), nil, 100, ""))
	cur = apply(cur, planSlices(svc, desiredGroups(svc, pods[:104], zoneA), cur, 100, ""))
	cur = apply(cur, planSlices(svc, desiredGroups(svc, pods[:250], zoneA), cur, 100, ""))
	if n := countEndpoints(cur); n != 250 {
		t.Fatalf("%d endpoints", n)
	}
	// The last pods turn ready: the slices holding them are written, and
	// whatever small slice fits in their room goes.
	ready := make([]*corev1.Pod, 250)
	for i := range ready {
		ready[i] = testPod(i, true, 8080)
	}
	cur = apply(cur, planSlices(svc, desiredGroups(svc, ready, zoneA), cur, 100, ""))
	if n := countEndpoints(cur); n != 250 || len(cur) != 3 {
		var sizes []int
		for _, s := range cur {
			sizes = append(sizes, len(s.Endpoints))
		}
		t.Fatalf("%d endpoints in slices of %v, want 250 in 3", n, sizes)
	}
	for _, s := range cur {
		if len(s.Endpoints) > 100 {
			t.Fatalf("slice of %d", len(s.Endpoints))
		}
	}
}

// Whatever the waves endpoints arrive in, 250 of them end in three slices.
func TestPackWavesEndInFewSlices(t *testing.T) {
	svc := testService(intstr.FromString("web"))
	ready := make([]*corev1.Pod, 250)
	for i := range ready {
		ready[i] = testPod(i, true, 8080)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var cur []*discoveryv1.EndpointSlice
		pods := make([]*corev1.Pod, 250)
		for i := range pods {
			pods[i] = testPod(i, false, 8080)
		}
		for n := 0; n < 250; {
			n = min(250, n+1+rng.IntN(80))
			cur = apply(cur, planSlices(svc, desiredGroups(svc, pods[:n], zoneA), cur, 100, ""))
		}
		// Pods turn ready in waves too.
		for n := 0; n < 250; {
			next := min(250, n+1+rng.IntN(80))
			copy(pods[n:next], ready[n:next])
			n = next
			cur = apply(cur, planSlices(svc, desiredGroups(svc, pods, zoneA), cur, 100, ""))
		}
		var sizes []int
		for _, s := range cur {
			sizes = append(sizes, len(s.Endpoints))
			if len(s.Endpoints) > 100 {
				t.Fatalf("round %d: slice of %d", round, len(s.Endpoints))
			}
		}
		if countEndpoints(cur) != 250 || len(cur) != 3 {
			t.Fatalf("round %d: slices of %v, want 250 endpoints in 3", round, sizes)
		}
	}
}
