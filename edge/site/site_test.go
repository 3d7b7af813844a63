package site

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/sitedigest"
)

// cluster is a set of members on loopback addresses 127.0.0.<base+i>, all
// on one port.
type cluster struct {
	t    *testing.T
	base int
	port int
	keys [][]byte
}

func newCluster(t *testing.T, base int) *cluster {
	t.Helper()
	return &cluster{t: t, base: base, port: freeGossipPort(t), keys: [][]byte{key(1)}}
}

// freeGossipPort returns a port free now for TCP and for UDP on every
// address: members bind both on it, and a port picked for TCP alone was
// once held for UDP by another test's socket.
func freeGossipPort(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.ListenTCP("tcp", &net.TCPAddr{})
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenUDP("udp", &net.UDPAddr{Port: port})
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no port free for both TCP and UDP")
	return 0
}

func key(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func (c *cluster) addr(i int) string {
	return net.JoinHostPort(fmt.Sprintf("127.0.0.%d", c.base+i), strconv.Itoa(c.port))
}

func (c *cluster) addrs(n int) []string {
	var out []string
	for i := range n {
		out = append(out, c.addr(i))
	}
	return out
}

// member starts member i with keys and peers; it stops with the test.
func (c *cluster) member(i int, keys [][]byte, peers []string) *Site {
	c.t.Helper()
	return c.memberConfig(i, keys, peers, nil)
}

// memberConfig starts member i with edit applied to its Config.
func (c *cluster) memberConfig(i int, keys [][]byte, peers []string, edit func(*Config)) *Site {
	c.t.Helper()
	cfg := Config{
		Site:          "shop-1",
		Node:          fmt.Sprintf("node-%d", i),
		BindAddr:      fmt.Sprintf("127.0.0.%d", c.base+i),
		AdvertiseAddr: fmt.Sprintf("127.0.0.%d", c.base+i),
		BindPort:      c.port,
		Keys:          keys,
		Peers:         peers,
		RetryInterval: 300 * time.Millisecond,
		PollInterval:  100 * time.Millisecond,
		KeyGrace:      300 * time.Millisecond,
		Log:           slog.New(slog.DiscardHandler),
	}
	if edit != nil {
		edit(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	c.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			c.t.Errorf("run node-%d: %v", i, err)
		}
	})
	return s
}

// state returns node's state and incarnation in s's view.
func state(s *Site, node string) (sitedigest.State, uint32) {
	for _, m := range s.View().Members {
		if m.Node == node {
			return m.State, m.Incarnation
		}
	}
	return 0, 0
}

func eventually(t *testing.T, timeout time.Duration, what string, f func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !f() {
		if time.Since(start) > timeout {
			t.Fatalf("after %v: %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

func allAlive(s *Site, n int) bool {
	v := s.View()
	if len(v.Members) != n {
		return false
	}
	for _, m := range v.Members {
		if m.State != sitedigest.Alive {
			return false
		}
	}
	return true
}

func TestMembersConvergeAndOneSends(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 10)
	peers := c.addrs(3)
	var ms []*Site
	for i := range 3 {
		ms = append(ms, c.member(i, c.keys, peers))
	}
	changed := ms[2].Changed()
	for i, s := range ms {
		eventually(t, 10*time.Second, fmt.Sprintf("node-%d sees 3 alive members: %v", i, s.View()), func() bool { return allAlive(s, 3) })
	}
	select {
	case <-changed:
	default:
		t.Error("Changed did not fire when members joined")
	}
	if st := ms[0].Stats(); st.Members != 3 || st.DroppedKey != 0 || st.DroppedNonMember != 0 {
		t.Errorf("stats = %+v, want 3 members and no drops", st)
	}
	if v, err := ms[1].View().Marshal(); err != nil || len(v) == 0 {
		t.Errorf("marshal view: %v", err)
	}

	senders := func() []int {
		var out []int
		for i, s := range ms {
			if s.Sender() {
				out = append(out, i)
			}
		}
		return out
	}
	if got := senders(); len(got) != 0 {
		t.Errorf("senders with no tunnel up = %v, want none", got)
	}
	ms[1].SetConnected(true)
	ms[2].SetConnected(true)
	eventually(t, 5*time.Second, "node-1 alone sends", func() bool { s := senders(); return len(s) == 1 && s[0] == 1 })
	ms[0].SetConnected(true)
	eventually(t, 5*time.Second, "node-0 alone sends", func() bool { s := senders(); return len(s) == 1 && s[0] == 0 })
	ms[0].SetConnected(false)
	eventually(t, 5*time.Second, "node-1 alone sends again", func() bool { s := senders(); return len(s) == 1 && s[0] == 1 })
}

func TestKilledMemberIsDeadThenAliveAgain(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 20)
	peers := c.addrs(3)
	var ms []*Site
	for i := range 3 {
		ms = append(ms, c.member(i, c.keys, peers))
	}
	for _, s := range ms {
		eventually(t, 10*time.Second, "3 alive members", func() bool { return allAlive(s, 3) })
	}
	ms[2].Kill()
	took := eventually(t, 10*time.Second, "node-2 dead in the others' views", func() bool {
		a, _ := state(ms[0], "node-2")
		b, _ := state(ms[1], "node-2")
		return a == sitedigest.Dead && b == sitedigest.Dead
	})
	t.Logf("killed member declared dead by both others after %v", took)
	_, deadInc := state(ms[0], "node-2")

	// Restarted: memberlist refutes its death with a higher incarnation,
	// and the new generation comes first.
	restarted := c.memberConfig(2, c.keys, peers, func(c *Config) { c.Generation = 1 })
	eventually(t, 10*time.Second, "node-2 alive again with a higher incarnation", func() bool {
		for _, s := range []*Site{ms[0], ms[1], restarted} {
			st, inc := state(s, "node-2")
			if st != sitedigest.Alive || inc <= deadInc || inc>>16 != 1 {
				return false
			}
		}
		return true
	})
}

func TestWrongKeyAndNonMembersAreRefused(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 30)
	a := c.member(0, c.keys, c.addrs(2))
	b := c.member(1, c.keys, c.addrs(2))
	eventually(t, 10*time.Second, "a and b members", func() bool { return allAlive(a, 2) && allAlive(b, 2) })

	// Wrong key: a member of the peer set that holds another key.
	wrong := c.member(2, [][]byte{key(9)}, c.addrs(3))
	eventually(t, 10*time.Second, "wrong-key gossip dropped", func() bool { return a.Stats().DroppedKey > 0 })
	// No key: plaintext memberlist traffic, over UDP and TCP.
	before := a.Stats().DroppedKey
	u, err := net.Dial("udp", c.addr(0))
	if err != nil {
		t.Fatal(err)
	}
	u.Write([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30})
	u.Close()
	tc, err := net.Dial("tcp", c.addr(0))
	if err != nil {
		t.Fatal(err)
	}
	tc.Write([]byte{6, 0, 0, 0, 0})
	tc.Close()
	eventually(t, 5*time.Second, "plaintext packet and stream dropped", func() bool { return a.Stats().DroppedKey >= before+2 })

	// Non-member: the right key, but not at a peer address of a and b.
	outsider := c.member(3, c.keys, c.addrs(2))
	eventually(t, 10*time.Second, "non-member refused", func() bool { return a.Stats().DroppedNonMember > 0 })
	time.Sleep(time.Second)
	for _, s := range []*Site{a, b} {
		if st, _ := state(s, "node-2"); st != 0 {
			t.Errorf("wrong-key node is in the view: %v", s.View())
		}
		if st, _ := state(s, "node-3"); st != 0 {
			t.Errorf("non-member is in the view: %v", s.View())
		}
		if !allAlive(s, 2) {
			t.Errorf("view = %v, want the two members alive", s.View())
		}
	}
	if allAlive(wrong, 1) != true || len(outsider.View().Members) == 0 {
		t.Errorf("refused nodes work alone: wrong %v outsider %v", wrong.View(), outsider.View())
	}
	t.Logf("stats of a: %+v", a.Stats())
}

func TestNoKeyNoGossip(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 40)
	s := c.member(0, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := s.Addr(ctx); err == nil {
		t.Fatal("gossip started without a key")
	}
	if conn, err := net.Dial("tcp", c.addr(0)); err == nil {
		conn.Close()
		t.Fatal("gossip port open without a key")
	}
	if err := s.SetKeys([][]byte{[]byte("short")}); err == nil {
		t.Error("a 5-byte key was accepted")
	}
	if err := s.SetKeys(c.keys); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if _, err := s.Addr(ctx2); err != nil {
		t.Fatalf("gossip did not start once the key came: %v", err)
	}
}

func TestKeyRotationKeepsTheCluster(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 50)
	peers := c.addrs(4)
	var ms []*Site
	for i := range 3 {
		ms = append(ms, c.member(i, c.keys, peers))
	}
	for _, s := range ms {
		eventually(t, 10*time.Second, "3 alive members", func() bool { return allAlive(s, 3) })
	}
	// The hub's rotation: the new key first, the old one kept; later the
	// old one is dropped.
	for _, s := range ms {
		if err := s.SetKeys([][]byte{key(2), key(1)}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // past KeyGrace: all encrypt with key 2
	for _, s := range ms {
		if err := s.SetKeys([][]byte{key(2)}); err != nil {
			t.Fatal(err)
		}
		if got := s.keyring.GetKeys(); len(got) != 1 || !bytes.Equal(got[0], key(2)) {
			t.Errorf("installed keys = %d, want key 2 alone", len(got))
		}
	}
	// A member with only the new key joins; nobody was ever suspected.
	newcomer := c.member(3, [][]byte{key(2)}, peers)
	for _, s := range append(ms, newcomer) {
		eventually(t, 10*time.Second, "4 alive members under the new key", func() bool { return allAlive(s, 4) })
		for _, m := range s.View().Members {
			if m.Incarnation > 1 {
				t.Errorf("%s was suspected during the rotation (incarnation %d)", m.Node, m.Incarnation)
			}
		}
		if st := s.Stats(); st.DroppedKey != 0 {
			t.Errorf("dropped %d messages for a wrong key during the rotation", st.DroppedKey)
		}
	}
}

func TestNodeTableLayout(t *testing.T) { // not parallel: AllocsPerRun
	c := newCluster(t, 60)
	s := c.member(0, c.keys, nil)
	if _, err := s.Addr(context.Background()); err != nil {
		t.Fatal(err)
	}
	table, err := newNodeTable(s.ml)
	if err != nil {
		t.Fatal(err)
	}
	nodes, changed := table.read()
	if !changed {
		t.Error("first read of the node table: no change reported")
	}
	if again, changed := table.read(); changed || len(again) != len(nodes) {
		t.Errorf("second read of an unchanged table: changed %v, %d nodes", changed, len(again))
	}
	// The site polls the table four times a second on every node.
	if allocs := testing.AllocsPerRun(100, func() { table.read() }); allocs != 0 {
		t.Errorf("a read of an unchanged table allocates %.0f times, want 0", allocs)
	}
	if len(nodes) != 1 || nodes[0].name != "node-0" || nodes[0].addr != c.addr(0) || nodes[0].incarnation == 0 {
		t.Errorf("node table = %+v", nodes)
	}
}

// TestForgottenDeadMemberStaysDead: memberlist forgets a dead member after
// GossipToTheDeadTime; the view keeps it Dead while it is a peer, and drops
// it once it is not.
func TestForgottenDeadMemberStaysDead(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 80)
	peers := c.addrs(2)
	forget := func(c *Config) { c.deadForget = time.Second }
	a := c.memberConfig(0, c.keys, peers, forget)
	b := c.memberConfig(1, c.keys, peers, forget)
	eventually(t, 10*time.Second, "2 alive members", func() bool { return allAlive(a, 2) })
	b.Kill()
	eventually(t, 10*time.Second, "node-1 dead", func() bool { st, _ := state(a, "node-1"); return st == sitedigest.Dead })
	eventually(t, 10*time.Second, "memberlist forgets node-1", func() bool {
		a.mu.Lock()
		ml := a.ml
		a.mu.Unlock()
		table, err := newNodeTable(ml)
		if err != nil {
			t.Fatal(err)
		}
		nodes, _ := table.read()
		return len(nodes) == 1
	})
	time.Sleep(300 * time.Millisecond)
	if st, _ := state(a, "node-1"); st != sitedigest.Dead {
		t.Fatalf("forgotten member: view %v, want node-1 Dead", a.View())
	}
	a.SetPeers(c.addrs(1))
	eventually(t, 5*time.Second, "node-1 leaves the view once not a peer", func() bool { st, _ := state(a, "node-1"); return st == 0 })
}

// TestLeaveIsLeft: a member that stops cleanly is Left, not Dead, in the
// others' views.
func TestLeaveIsLeft(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 90)
	peers := c.addrs(2)
	a := c.member(0, c.keys, peers)
	b, err := New(Config{Site: "shop-1", Node: "node-1", BindAddr: "127.0.0.91", AdvertiseAddr: "127.0.0.91", BindPort: c.port,
		Keys: c.keys, Peers: peers, RetryInterval: 300 * time.Millisecond, PollInterval: 100 * time.Millisecond,
		Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	eventually(t, 10*time.Second, "2 alive members", func() bool { return allAlive(a, 2) })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "node-1 left", func() bool { st, _ := state(a, "node-1"); return st == sitedigest.Left })
}

// TestSuspectSenderKeepsTheRole: the sender is the first connected member
// the site has not declared dead or seen leave; a suspicion does not hand
// the role on, a death or a lost tunnel does.
func TestSuspectSenderKeepsTheRole(t *testing.T) {
	s, err := New(Config{Site: "shop-1", Node: "node-1", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	set := func(first sitedigest.State, connected bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.view = sitedigest.Digest{Site: "shop-1", Members: []sitedigest.Member{
			{Node: "node-0", State: first, Incarnation: 1}, {Node: "node-1", State: sitedigest.Alive, Incarnation: 1},
		}}
		s.metas = map[string]meta{"node-0": {connected: connected}, "node-1": {connected: true}}
	}
	for _, c := range []struct {
		first     sitedigest.State
		connected bool
		sends     bool
	}{
		{sitedigest.Alive, true, false},
		{sitedigest.Suspect, true, false},
		{sitedigest.Dead, true, true},
		{sitedigest.Left, true, true},
		{sitedigest.Alive, false, true},
	} {
		set(c.first, c.connected)
		if got := s.Sender(); got != c.sends {
			t.Errorf("node-0 %v, connected %v: node-1 sends %v, want %v", c.first, c.connected, got, c.sends)
		}
	}
}
