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
