package tunnel

import (
	"testing"
	"time"
)

// TestClientMovesThroughFleet connects to the first hub, and when that
// hub goes away moves to another of Addrs; when that one goes too, to the
// last one.
func TestClientMovesThroughFleet(t *testing.T) {
	p := newPKI(t)
	hubs := []*testHub{startHub(t, p, ServerConfig{}, 0, nil), startHub(t, p, ServerConfig{}, 0, nil), startHub(t, p, ServerConfig{}, 0, nil)}
	c := startClient(t, p, hubs[0].addr, "n1", func(cfg *ClientConfig) {
		cfg.Addrs = func() []string { return []string{hubs[1].addr, hubs[2].addr, "not an address"} }
	})
	waitConnected(t, c, 10*time.Second)
	if c.Addr() != hubs[0].addr || hubs[0].srv.Session("n1") == nil {
		t.Fatalf("connected to %s, want the first hub %s", c.Addr(), hubs[0].addr)
	}
	on := func() int {
		for i, h := range hubs {
			if h.srv.Session("n1") != nil {
				return i
			}
		}
		return -1
	}
	gone := map[int]bool{0: true}
	hubs[0].stop()
	for range 2 {
		waitFor(t, 15*time.Second, "a session on a remaining hub", func() bool { i := on(); return i >= 0 && !gone[i] })
		i := on()
		if c.Addr() != hubs[i].addr {
			t.Fatalf("client targets %s, session on %s", c.Addr(), hubs[i].addr)
		}
		if len(gone) == 2 {
			break
		}
		gone[i] = true
		hubs[i].stop()
	}
}

// TestClientDialsNextHubWhenTargetIsSilent: the first hub drops every
// datagram (a dead machine). The client dials the next hub of the fleet
// after DialStagger instead of waiting out the handshake timeout, and
// makes it its target.
func TestClientDialsNextHubWhenTargetIsSilent(t *testing.T) {
	p := newPKI(t)
	silent := make(chan struct{})
	dead := startHubWith(t, p, ServerConfig{}, 0, nil, silent)
	t.Cleanup(func() { close(silent) }) // before the hub's stop, which waits for it
	live := startHub(t, p, ServerConfig{}, 0, nil)
	start := time.Now()
	c := startClient(t, p, dead.addr, "n1", func(cfg *ClientConfig) {
		cfg.Addrs = func() []string { return []string{live.addr} }
		cfg.HandshakeTimeout = 5 * time.Second
		cfg.DialStagger = 200 * time.Millisecond
	})
	waitConnected(t, c, 10*time.Second)
	took := time.Since(start)
	if c.Addr() != live.addr || live.srv.Session("n1") == nil {
		t.Fatalf("connected to %s, want the live hub %s", c.Addr(), live.addr)
	}
	// The stagger and a handshake on loopback, well short of the 5s a
	// sequential dial would have waited on the silent hub.
	if took > 3*time.Second {
		t.Errorf("connected after %v; the silent hub held the client up", took)
	}
	t.Logf("connected to the second hub %v after the start", took.Round(time.Millisecond))
}

// TestClientKeepsOneSessionWhenHubsAnswerTogether: with a stagger shorter
// than a handshake both hubs welcome the client; it keeps the first and
// closes the other, so that one hub alone holds its session.
func TestClientKeepsOneSessionWhenHubsAnswerTogether(t *testing.T) {
	p := newPKI(t)
	hubs := []*testHub{startHub(t, p, ServerConfig{}, 0, nil), startHub(t, p, ServerConfig{}, 0, nil)}
	c := startClient(t, p, hubs[0].addr, "n1", func(cfg *ClientConfig) {
		cfg.Addrs = func() []string { return []string{hubs[1].addr} }
		cfg.DialStagger = time.Nanosecond
	})
	waitConnected(t, c, 10*time.Second)
	holders := func() (n int, on string) {
		for _, h := range hubs {
			if h.srv.Session("n1") != nil {
				n++
				on = h.addr
			}
		}
		return n, on
	}
	waitFor(t, 10*time.Second, "one hub holding the session", func() bool { n, _ := holders(); return n == 1 })
	time.Sleep(300 * time.Millisecond)
	if n, on := holders(); n != 1 || on != c.Addr() {
		t.Fatalf("%d hubs hold the session (last %s); the client targets %s", n, on, c.Addr())
	}
}
