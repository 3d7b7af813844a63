package policy

import (
	"bufio"
	"net"
	"net/netip"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/dataplane/internal/testnet"
)

// policyLab is two network namespaces joined by a veth pair: "srv" holds
// the server pod's address, "cli" two client pods' addresses (good and
// bad). The test process joins a fresh cgroup that the programs attach
// to, so every socket it opens in either namespace is judged.
type policyLab struct {
	srv, cli *testnet.Netns
	cfg      Config
	e        *Enforcer
}

var (
	srvIP  = netip.MustParseAddr("10.77.0.1")
	goodIP = netip.MustParseAddr("10.77.0.2")
	badIP  = netip.MustParseAddr("10.77.0.3")
)

func newPolicyLab(t *testing.T) *policyLab {
	testnet.RequireRoot(t)
	l := &policyLab{srv: testnet.NewNetns(t, "psrv"), cli: testnet.NewNetns(t, "pcli")}
	testnet.Veth(t, l.srv, "eth0", []string{srvIP.String() + "/24"}, l.cli, "eth0", []string{goodIP.String() + "/24", badIP.String() + "/24"})
	cg := testnet.NewCgroup(t)
	testnet.JoinCgroup(t, cg)
	l.cfg = Config{CgroupPath: cg, BPFFSPath: testnet.BPFFSDir(t)}
	e, err := New(l.cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	l.e = e
	t.Cleanup(func() {
		if l.e != nil {
			l.e.Uninstall()
		}
	})
	return l
}

// listenTCP listens on addr in the server namespace until the test ends.
func (l *policyLab) listenTCP(t *testing.T, addr netip.AddrPort) net.Listener {
	t.Helper()
	var ln net.Listener
	err := l.srv.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", addr.String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// serveTCP answers every connection on port with one line.
func (l *policyLab) serveTCP(t *testing.T, port int) {
	t.Helper()
	ln := l.listenTCP(t, netip.AddrPortFrom(srvIP, uint16(port)))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("hello\n"))
				rd := bufio.NewReader(c)
				for {
					s, err := rd.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(s))
				}
			}()
		}
	}()
}

// dial connects from the client namespace with source address from.
func (l *policyLab) dial(from netip.Addr, port int) (net.Conn, error) {
	var c net.Conn
	err := l.cli.Do(func() error {
		d := net.Dialer{Timeout: 400 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: from.AsSlice()}}
		var err error
		c, err = d.Dial("tcp", netip.AddrPortFrom(srvIP, uint16(port)).String())
		if err != nil {
			return err
		}
		c.SetDeadline(time.Now().Add(time.Second))
		_, err = bufio.NewReader(c).ReadString('\n')
		if err != nil {
			c.Close()
		}
		return err
	})
	return c, err
}

func (l *policyLab) expect(t *testing.T, from netip.Addr, port int, ok bool) {
	t.Helper()
	c, err := l.dial(from, port)
	if c != nil {
		c.Close()
	}
	if ok && err != nil {
		t.Fatalf("%s → %s:%d refused, want allowed: %v", from, srvIP, port, err)
	}
	if !ok && err == nil {
		t.Fatalf("%s → %s:%d allowed, want dropped", from, srvIP, port)
	}
}

func (l *policyLab) apply(t *testing.T, in Input) {
	t.Helper()
	r := Compile(in)
	if len(r.Warnings) > 0 {
		t.Fatalf("warnings: %v", r.Warnings)
	}
	if _, err := l.e.Apply(r); err != nil {
		t.Fatal(err)
	}
}

// labPods are the lab's three pods: the server on this node, the clients
// elsewhere (peers only).
func labPods() []Pod {
	return []Pod{
		{Namespace: "prod", Name: "web", Labels: map[string]string{"app": "web"}, IPs: []netip.Addr{srvIP}, Local: true,
			NamedPorts: []NamedPort{{"http", protoTCP, 8080}}},
		{Namespace: "prod", Name: "good", Labels: map[string]string{"app": "good"}, IPs: []netip.Addr{goodIP}},
		{Namespace: "other", Name: "bad", Labels: map[string]string{"app": "bad"}, IPs: []netip.Addr{badIP}},
	}
}

// TestEnforcerTCP runs real connections through the programs: no policy,
// deny-all ingress, an allow by pod label on a named port, an ipBlock
// with an except, an established connection across a change to deny-all,
// and a restart of the enforcer that keeps the rules in force.
func TestEnforcerTCP(t *testing.T) {
	l := newPolicyLab(t)
	l.serveTCP(t, 8080)
	l.serveTCP(t, 9090)
	ns := map[string]map[string]string{"prod": {"team": "a"}, "other": {"team": "b"}}
	base := Input{Pods: labPods(), Namespaces: ns}

	l.apply(t, base)
	l.expect(t, goodIP, 8080, true)
	l.expect(t, badIP, 8080, true)

	denyAll := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	est, err := l.dial(goodIP, 8080)
	if err != nil {
		t.Fatal(err)
	}
	defer est.Close()
	in := base
	in.Policies = []*networkingv1.NetworkPolicy{denyAll}
	l.apply(t, in)
	l.expect(t, goodIP, 8080, false)
	l.expect(t, badIP, 8080, false)
	// The established connection keeps working.
	est.SetDeadline(time.Now().Add(time.Second))
	if _, err := est.Write([]byte("still\n")); err != nil {
		t.Fatalf("established connection: %v", err)
	}
	if s, err := bufio.NewReader(est).ReadString('\n'); err != nil || s != "still\n" {
		t.Fatalf("established connection: %q, %v", s, err)
	}
	drops := l.e.Drops()[Endpoint{srvIP, Ingress}]
	if drops == 0 {
		t.Fatalf("no drops counted for %s ingress", srvIP)
	}

	allowGood := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "good"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "good"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptrIntStr("http")}},
			}},
		}}
	in.Policies = []*networkingv1.NetworkPolicy{denyAll, allowGood}
	l.apply(t, in)
	l.expect(t, goodIP, 8080, true)
	l.expect(t, goodIP, 9090, false)
	l.expect(t, badIP, 8080, false)

	block := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "block"},
		Spec: networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.77.0.0/24", Except: []string{"10.77.0.2/32"}}}},
			}},
		}}
	in.Policies = []*networkingv1.NetworkPolicy{block}
	l.apply(t, in)
	l.expect(t, goodIP, 9090, false)
	l.expect(t, badIP, 9090, true)

	// The agent stops: the rules stay in force; a new enforcer adopts
	// them and has nothing to write.
	if err := l.e.Close(); err != nil {
		t.Fatal(err)
	}
	l.e = nil
	l.expect(t, goodIP, 9090, false)
	l.expect(t, badIP, 9090, true)
	e2, err := New(l.cfg)
	if err != nil {
		t.Fatalf("New after restart: %v", err)
	}
	l.e = e2
	l.expect(t, goodIP, 9090, false)
	r := Compile(in)
	if len(e2.kernel.AllowCIDR) != len(r.AllowCIDR) || len(e2.kernel.Isolated) != len(r.Isolated) || len(e2.kernel.IDs) != len(r.IDs) {
		t.Fatalf("adopted %d cidr, %d isolated, %d ids; want %d, %d, %d", len(e2.kernel.AllowCIDR), len(e2.kernel.Isolated),
			len(e2.kernel.IDs), len(r.AllowCIDR), len(r.Isolated), len(r.IDs))
	}
	l.apply(t, in)
	l.expect(t, badIP, 9090, true)
}
