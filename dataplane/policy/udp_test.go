package policy

import (
	"net"
	"net/netip"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEnforcerUDP: a client isolated for egress may send to the port a
// rule allows, and the answer comes back through the flow table although
// no rule allows it in; another port stays closed.
func TestEnforcerUDP(t *testing.T) {
	l := newPolicyLab(t)
	for _, port := range []int{53, 54} {
		var pc net.PacketConn
		err := l.srv.Do(func() error {
			var err error
			pc, err = net.ListenPacket("udp", netip.AddrPortFrom(srvIP, uint16(port)).String())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			b := make([]byte, 64)
			for {
				n, from, err := pc.ReadFrom(b)
				if err != nil {
					return
				}
				pc.WriteTo(b[:n], from)
			}
		}()
	}
	pods := labPods()
	pods[1].Local = true // the good client runs here too
	udp := ptrProto("UDP")
	egress := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "dns-only"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "good"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: udp, Port: ptrInt(53)}}}},
		}}
	// The server is isolated for ingress too, and allows the client in.
	ingress := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "web-in"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "good"}}}},
			}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		}}
	l.apply(t, Input{Pods: pods, Policies: []*networkingv1.NetworkPolicy{egress, ingress}})
	echo := func(port int) error {
		return l.cli.Do(func() error {
			c, err := net.DialUDP("udp", &net.UDPAddr{IP: goodIP.AsSlice()}, &net.UDPAddr{IP: srvIP.AsSlice(), Port: port})
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := c.Write([]byte("ping")); err != nil {
				return err
			}
			b := make([]byte, 64)
			_, err = c.Read(b)
			return err
		})
	}
	if err := echo(53); err != nil {
		t.Fatalf("udp 53: %v, want an answer", err)
	}
	if err := echo(54); err == nil {
		t.Fatal("udp 54 answered, want it dropped")
	}
	if s, _ := l.e.Stats(); s.ReplyHits == 0 {
		t.Error("no reply went through the flow table")
	}
}
