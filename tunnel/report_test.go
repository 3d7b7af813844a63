package tunnel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// reports collects what a hub's OnReport receives.
type reports struct {
	mu  sync.Mutex
	got []string // node + "=" + payload
}

func (r *reports) add(s *Session, payload []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, s.Node()+"="+string(payload))
}

func (r *reports) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

func (r *reports) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) == 0 {
		return ""
	}
	return r.got[len(r.got)-1]
}

// TestReportDelivered: a report reaches OnReport with the session of its
// node, later ones follow in order, and concurrent callers leave the hub
// with the latest payload.
func TestReportDelivered(t *testing.T) {
	transports(t, func(t *testing.T, tcp bool) {
		p := newPKI(t)
		var got reports
		h := startHub(t, p, ServerConfig{OnReport: got.add}, 0, nil)
		c := startClient(t, p, h.addr, "n1", func(c *ClientConfig) { c.ForceTCP = tcp })
		waitConnected(t, c, 5*time.Second)
		buf := []byte("first")
		c.Report(buf)
		copy(buf, "XXXXX") // the client keeps its own copy
		waitFor(t, 3*time.Second, "first report", func() bool { return got.last() == "n1=first" })
		c.Report([]byte("second"))
		waitFor(t, 3*time.Second, "second report", func() bool { return got.last() == "n1=second" })

		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					c.Report(fmt.Appendf(nil, "g%d-%d", g, i))
				}
			}()
		}
		wg.Wait()
		c.Report([]byte("final"))
		waitFor(t, 3*time.Second, "final report", func() bool { return got.last() == "n1=final" })
		// Superseded payloads are skipped, never sent after a newer one.
		all := got.all()
		if all[0] != "n1=first" || all[1] != "n1=second" {
			t.Fatalf("reports start %q", all[:2])
		}
		if n := len(all); n > 2+8*50+1 {
			t.Fatalf("%d reports for %d calls", n, 2+8*50+1)
		}
		if st := c.Stats(); st.ReportsSent != uint64(len(all)) || st.ReportsRefused != 0 {
			t.Fatalf("stats %+v, hub got %d", st, len(all))
		}
	})
}

// TestReportResentAfterReconnect: the latest payload, given before the
// first connect, is sent on connect, and a hub that restarted learns it
// again without a new Report call.
func TestReportResentAfterReconnect(t *testing.T) {
	transports(t, func(t *testing.T, tcp bool) {
		p := newPKI(t)
		key := new([32]byte)
		var a1, b1 reports
		a := startHub(t, p, ServerConfig{StatelessResetKey: key, OnReport: a1.add}, 0, nil)
		port := a.port()
		c := startClient(t, p, a.addr, "n1", func(c *ClientConfig) { c.ForceTCP = tcp })
		c.Report([]byte("old"))
		c.Report([]byte("digest-1"))
		waitFor(t, 5*time.Second, "report on connect", func() bool { return a1.last() == "n1=digest-1" })
		if all := a1.all(); len(all) != 1 {
			t.Fatalf("hub got %q, want only the latest", all)
		}
		a.stop()
		waitFor(t, 3*time.Second, "disconnect noticed", func() bool { return !c.Connected() })
		b := startHub(t, p, ServerConfig{StatelessResetKey: key, OnReport: b1.add}, port, nil)
		waitFor(t, 10*time.Second, "report after reconnect", func() bool { return b1.last() == "n1=digest-1" })
		if s := b.srv.Session("n1"); s == nil {
			t.Fatal("no session on the new hub")
		}
	})
}

// TestReportSkippedByOldHub: a hub that does not take reports (no
// OnReport, as a hub that predates the frame skips it) keeps the session
// and its heartbeats; so does a hub receiving a control frame it does
// not know at all.
func TestReportSkippedByOldHub(t *testing.T) {
	p := newPKI(t)
	var beats atomic.Int32
	h := startHub(t, p, ServerConfig{OnHeartbeat: func(*Session) { beats.Add(1) }}, 0, nil)
	c := startClient(t, p, h.addr, "n1", func(c *ClientConfig) { c.HeartbeatInterval = 50 * time.Millisecond })
	waitConnected(t, c, 5*time.Second)
	s := h.srv.Session("n1")
	c.Report([]byte("digest"))
	cs, _ := c.current()
	if err := cs.writeControl(0x7f, []byte("from a newer edge")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "report sent", func() bool { return c.Stats().ReportsSent == 1 })
	n := beats.Load()
	waitFor(t, 3*time.Second, "heartbeats after the unknown frames", func() bool { return beats.Load() >= n+3 })
	if h.srv.Session("n1") != s || c.Stats().Connects != 1 {
		t.Fatalf("session changed: connects %d", c.Stats().Connects)
	}
}

// TestReportTooLarge: a payload over MaxReport is refused and counted,
// and the previous payload stays the one resent; MaxReport itself fits.
func TestReportTooLarge(t *testing.T) {
	p := newPKI(t)
	var got reports
	h := startHub(t, p, ServerConfig{OnReport: got.add}, 0, nil)
	c := startClient(t, p, h.addr, "n1", nil)
	waitConnected(t, c, 5*time.Second)
	full := bytes.Repeat([]byte{'x'}, MaxReport)
	c.Report(full)
	waitFor(t, 3*time.Second, "full-size report", func() bool { return len(got.last()) == len("n1=")+MaxReport })
	c.Report(make([]byte, MaxReport+1))
	if st := c.Stats(); st.ReportsRefused != 1 || st.ReportsSent != 1 {
		t.Fatalf("stats %+v", st)
	}
	if p, _ := c.latestReport(); !bytes.Equal(p, full) {
		t.Fatalf("refused report replaced the latest one (%d bytes)", len(p))
	}
	c.Report([]byte("small"))
	waitFor(t, 3*time.Second, "next report", func() bool { return got.last() == "n1=small" })
	if n := len(got.all()); n != 2 {
		t.Fatalf("hub got %d reports, want 2", n)
	}
}

// TestProbe: a probe of a connected agent that answers its dials
// succeeds; one whose agent does not answer fails when its context ends;
// one of a node with no session fails at once.
func TestProbe(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	ok := startClient(t, p, h.addr, "answers", func(c *ClientConfig) {
		c.DialTarget = func(context.Context, string) (net.Conn, error) {
			a, b := net.Pipe()
			go func() { <-release; b.Close() }()
			return a, nil
		}
	})
	hung := startClient(t, p, h.addr, "hung", func(c *ClientConfig) {
		c.DialTarget = func(context.Context, string) (net.Conn, error) {
			<-release
			return nil, errors.New("released")
		}
	})
	waitConnected(t, ok, 5*time.Second)
	waitConnected(t, hung, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := h.srv.Probe(ctx, "answers"); err != nil {
		t.Fatalf("probe of an answering agent: %v", err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancelShort()
	if err := h.srv.Probe(short, "hung"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("probe of an agent that does not answer: %v, want the context's deadline", err)
	}
	if err := h.srv.Probe(ctx, "nobody"); !errors.Is(err, ErrNoSession) {
		t.Fatalf("probe of a node with no session: %v, want ErrNoSession", err)
	}
}
