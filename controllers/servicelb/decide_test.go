package servicelb

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

func node(name string, ready bool, addrs ...corev1.NodeAddress) *corev1.Node {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}},
			Addresses:  addrs,
		},
	}
}

func internal(ip string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
}

func external(ip string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip}
}

func names(nodes []*corev1.Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	return out
}

func TestEligibleNodes(t *testing.T) {
	a := node("a", true, internal("10.0.0.2"))
	b := node("b", true, internal("10.0.0.1"), external("203.0.113.9"), corev1.NodeAddress{Type: corev1.NodeHostName, Address: "b"})
	notReady := node("c", false, internal("10.0.0.3"))
	unknown := node("d", true, internal("10.0.0.4"))
	unknown.Status.Conditions[0].Status = corev1.ConditionUnknown
	cordoned := node("e", true, internal("10.0.0.5"))
	cordoned.Spec.Unschedulable = true
	excluded := node("f", true, internal("10.0.0.6"))
	excluded.Labels[corev1.LabelNodeExcludeBalancers] = ""
	noCond := node("g", true, internal("10.0.0.7"))
	noCond.Status.Conditions = nil
	dual := node("h", true, internal("10.0.0.2"), internal("fd00::8"))

	all := []*corev1.Node{a, b, notReady, unknown, cordoned, excluded, noCond, dual}
	if got, want := names(Eligible(all)), []string{"a", "b", "h"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("eligible %v, want %v", got, want)
	}
	// ExternalIP over InternalIP; sorted, without repeats; IPv4 first.
	if got, want := Addresses(Eligible(all)), []string{"10.0.0.2", "203.0.113.9", "fd00::8"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("addresses %v, want %v", got, want)
	}

	// Once a node is labelled, only labelled nodes serve; a labelled
	// node that is not Ready does not.
	a.Labels[LabelLoadBalancer] = "true"
	notReady.Labels[LabelLoadBalancer] = "true"
	b.Labels[LabelLoadBalancer] = "false"
	if got, want := names(Eligible(all)), []string{"a"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("eligible with label %v, want %v", got, want)
	}
	if got := Addresses(nil); len(got) != 0 {
		t.Fatalf("no nodes: %v", got)
	}
}

func lbService(ns, name string, age time.Duration, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(-age))},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: ports},
	}
}

func port(p int32, proto corev1.Protocol) corev1.ServicePort {
	return corev1.ServicePort{Port: p, Protocol: proto}
}

func TestConflictsOldestFirst(t *testing.T) {
	old := lbService("default", "old", time.Hour, port(80, corev1.ProtocolTCP))
	newer := lbService("default", "newer", time.Minute, port(80, corev1.ProtocolTCP), port(443, corev1.ProtocolTCP))
	// Loses nothing to newer, which holds no port while in conflict.
	https := lbService("default", "https", 0, port(443, corev1.ProtocolTCP))
	// The same port over UDP is another port.
	dns := lbService("default", "dns", 0, port(80, corev1.ProtocolUDP))
	// Same age: the name decides.
	twinA := lbService("b", "twin", 2*time.Hour, port(8080, ""))
	twinB := lbService("a", "twin", 2*time.Hour, port(8080, corev1.ProtocolTCP))
	// Not served: another class, another type.
	class := lbService("default", "class", 3*time.Hour, port(80, corev1.ProtocolTCP))
	class.Spec.LoadBalancerClass = new("example.com/lb")
	np := lbService("default", "np", 3*time.Hour, port(80, corev1.ProtocolTCP))
	np.Spec.Type = corev1.ServiceTypeNodePort

	got := Conflicts([]*corev1.Service{https, newer, dns, old, twinA, twinB, class, np})
	want := map[string]string{
		"default/newer": "port 80/TCP is already used on the node addresses by LoadBalancer Service default/old",
		"b/twin":        "port 8080/TCP is already used on the node addresses by LoadBalancer Service a/twin",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("conflicts:\n got %v\nwant %v", got, want)
	}
	// The older one gone, the newer one takes the port; https now
	// conflicts with it.
	got = Conflicts([]*corev1.Service{https, newer, dns})
	want = map[string]string{"default/https": "port 443/TCP is already used on the node addresses by LoadBalancer Service default/newer"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("conflicts after release:\n got %v\nwant %v", got, want)
	}
}

func TestDesiredIngress(t *testing.T) {
	addrs := []string{"10.0.0.1", "10.0.0.2"}
	owned := sets.New("10.0.0.1", "10.0.0.2", "10.0.0.9")
	vip := corev1.LoadBalancerIPModeVIP
	full := []corev1.LoadBalancerIngress{{IP: "10.0.0.1", IPMode: &vip}, {IP: "10.0.0.2", IPMode: &vip}}

	svc := lbService("default", "web", 0, port(80, corev1.ProtocolTCP))
	got, write := Desired(svc, addrs, false, owned, false)
	if !write || !Equal(got, full) {
		t.Fatalf("served: %v %v", got, write)
	}
	// An unset ipMode is VIP: nothing to write.
	if !Equal([]corev1.LoadBalancerIngress{{IP: "10.0.0.1"}, {IP: "10.0.0.2"}}, got) {
		t.Fatal("unset ipMode differs from VIP")
	}
	if got, write := Desired(svc, addrs, true, owned, true); !write || len(got) != 0 {
		t.Fatalf("in conflict: %v %v", got, write)
	}

	// Another class: left alone, whatever its ingress.
	class := svc.DeepCopy()
	class.Spec.LoadBalancerClass = new("example.com/lb")
	class.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}
	if _, write := Desired(class, addrs, false, owned, true); write {
		t.Fatal("wrote the ingress of another class's Service")
	}
	// Node addresses another controller wrote stay too...
	class.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.0.0.9"}, {IP: "10.0.0.1"}}
	if _, write := Desired(class, addrs, false, owned, false); write {
		t.Fatal("cleared node addresses another class's controller wrote")
	}
	// ...but those this controller wrote before the class was set go.
	if got, write := Desired(class, addrs, false, owned, true); !write || len(got) != 0 {
		t.Fatalf("class with this controller's node addresses: %v %v", got, write)
	}
	// No longer a LoadBalancer: cleared when owned, kept otherwise.
	cip := svc.DeepCopy()
	cip.Spec.Type = corev1.ServiceTypeClusterIP
	cip.Status.LoadBalancer.Ingress = full
	if got, write := Desired(cip, addrs, false, owned, false); !write || len(got) != 0 {
		t.Fatalf("ClusterIP with owned ingress: %v %v", got, write)
	}
	cip.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.0.0.1"}, {Hostname: "lb.example.com"}}
	if _, write := Desired(cip, addrs, false, owned, false); write {
		t.Fatal("cleared ingress another controller wrote")
	}
	cip.Status.LoadBalancer.Ingress = nil
	if _, write := Desired(cip, addrs, false, owned, false); write {
		t.Fatal("wrote an empty ingress")
	}
}
