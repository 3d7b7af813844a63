package tunnel

import (
	"errors"
	"testing"
	"time"
)

// TestReconnectAfterServedSessionStartsAtBase: a session that lasted its
// idle timeout (three heartbeat intervals, the default BackoffReset)
// showed the hub served, so each loss of such a session is a
// new outage whose first reconnect is drawn from the base window, however
// many sessions were lost before. Without the reset the sixth wait would
// be drawn from 32 times the base.
func TestReconnectAfterServedSessionStartsAtBase(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	const base = 500 * time.Millisecond
	c := startClient(t, p, h.addr, "n1", func(cfg *ClientConfig) {
		cfg.BackoffBase, cfg.BackoffCap = base, time.Minute
		cfg.HeartbeatInterval = 100 * time.Millisecond // resets after 300ms
	})
	waitConnected(t, c, 10*time.Second)
	for round := range 6 {
		s := h.srv.Session("n1")
		if s == nil {
			t.Fatalf("round %d: no session", round)
		}
		time.Sleep(500 * time.Millisecond) // longer than three heartbeats
		lost := time.Now()
		s.teardown(codeConnClosed, errors.New("test: hub drops the session"))
		waitFor(t, 10*time.Second, "a new session", func() bool {
			ns := h.srv.Session("n1")
			return ns != nil && ns != s
		})
		// The wait is below base; the rest is noticing the loss and a
		// handshake on loopback.
		if took := time.Since(lost); took > base+time.Second {
			t.Fatalf("round %d: reconnected %v after the loss, beyond the base window %v", round, took, base)
		}
	}
}
