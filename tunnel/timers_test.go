package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sort"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"
)

// The tests in this file run in fake time (testing/synctest) over memNet,
// with the tunnel's default timers: a minute of heartbeats or half an hour
// of reconnect backoff takes milliseconds, and every duration is exact.

// fakeTime runs f in a synctest bubble. yamux, the TCP fallback's
// multiplexer, keeps its send timers in a package-level sync.Pool: a timer
// made in one bubble and reused in another or outside any is a fatal error
// ("select on synctest channel from outside bubble"). Two collections
// empty the pool, before the bubble and after it.
func fakeTime(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	runtime.GC()
	runtime.GC()
	synctest.Test(t, f)
	runtime.GC()
	runtime.GC()
}

// hubHost is the host part of memHubAddr.
const hubHost = "10.0.0.1"

// events records when things happened, in fake time.
type events struct {
	mu  sync.Mutex
	at  []time.Time
	err []error
}

func (e *events) add(err error) {
	e.mu.Lock()
	e.at = append(e.at, time.Now())
	e.err = append(e.err, err)
	e.mu.Unlock()
}

func (e *events) times() []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]time.Time(nil), e.at...)
}

func (e *events) errs() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.err...)
}

// TestFakeTimeHeartbeatsAndIdleTimeout: an idle edge sends a heartbeat
// every 15s; when the path goes dark both ends notice within the 45s idle
// timeout of the last packet they heard, and the edge comes back once the
// path returns.
func TestFakeTimeHeartbeatsAndIdleTimeout(t *testing.T) {
	transports(t, func(t *testing.T, tcp bool) {
		fakeTime(t, func(t *testing.T) {
			n := newMemNet(10 * time.Millisecond)
			p := newPKI(t)
			var beats, hubGone, edgeGone events
			h := startMemHub(t, n, p, ServerConfig{
				OnHeartbeat:  func(*Session) { beats.add(nil) },
				OnDisconnect: func(_ *Session, err error) { hubGone.add(err) },
			}, memHubAddr)
			c := startMemClient(t, n, p, h.addr, "n1", func(c *ClientConfig) {
				c.ForceTCP = tcp
				c.OnDisconnect = edgeGone.add
			})
			waitConnected(t, c, 5*time.Second)
			connected := time.Now()
			time.Sleep(time.Minute + time.Second)
			bt := beats.times()
			if len(bt) != 4 {
				t.Fatalf("%d heartbeats in a minute, want 4: %v", len(bt), bt)
			}
			for i, b := range bt {
				// The first heartbeat goes 15s after the welcome and
				// takes the one-way latency (at most) to arrive.
				want := connected.Add(time.Duration(i+1) * 15 * time.Second)
				if d := b.Sub(want); d < 0 || d > n.delay {
					t.Errorf("heartbeat %d at %v after the connect, want 15s apart", i, b.Sub(connected))
				}
			}
			if s := h.srv.Session("n1"); s.LastHeartbeat() != bt[len(bt)-1] {
				t.Errorf("LastHeartbeat %v, want %v", s.LastHeartbeat(), bt[len(bt)-1])
			}

			// The path goes dark between two heartbeats.
			time.Sleep(5 * time.Second)
			synctest.Wait()
			dark := time.Now()
			n.setBlackhole(hubHost, true)
			lastBeat := bt[len(bt)-1]
			time.Sleep(time.Minute)
			hg, eg := hubGone.times(), edgeGone.times()
			if len(hg) != 1 || len(eg) != 1 {
				t.Fatalf("%d hub and %d edge disconnects after a minute in the dark, want 1 and 1", len(hg), len(eg))
			}
			t.Logf("dark %v after the last heartbeat; hub noticed %v and edge %v after the last heartbeat (idle timeout 45s)",
				dark.Sub(lastBeat), hg[0].Sub(lastBeat), eg[0].Sub(lastBeat))
			// The hub gives up 45s after the last heartbeat. The edge
			// gives up 45s after the last packet it heard over TCP (the
			// echo); over QUIC the idle timer restarts with the first
			// packet the edge sends after one it heard (RFC 9000, 10.1),
			// here the next heartbeat into the dark, so it gives up
			// 45s after that, at most 60s after the last one answered.
			if d := hg[0].Sub(lastBeat); d < 45*time.Second || d > 45*time.Second+3*n.delay {
				t.Errorf("hub noticed the loss %v after the last heartbeat, want 45s", d)
			}
			edgeMax := 45*time.Second + 3*n.delay
			if !tcp {
				edgeMax += 15 * time.Second
			}
			if d := eg[0].Sub(lastBeat); d < 45*time.Second || d > edgeMax {
				t.Errorf("edge noticed the loss %v after the last heartbeat, want 45s to %v", d, edgeMax)
			}
			// Over TCP the hub's control stream deadline expires; over
			// QUIC its idle timer does (the deadline is twice as long).
			herr, eerr := hubGone.errs()[0], edgeGone.errs()[0]
			var ie *quic.IdleTimeoutError
			if tcp && (herr == nil || herr.Error() != "no heartbeat for 45s") {
				t.Errorf("hub saw %v, want no heartbeat for 45s", herr)
			}
			if !tcp && !errors.As(herr, &ie) {
				t.Errorf("hub saw %v, want QUIC's idle timeout", herr)
			}
			if !isTimeout(eerr) {
				t.Errorf("edge saw %v, want a timeout", eerr)
			}
			// The path returns: the edge is back after at most a
			// handshake that went into the dark (5s) and a backoff wait.
			back := time.Now()
			n.setBlackhole(hubHost, false)
			waitConnected(t, c, 30*time.Second)
			t.Logf("reconnected %v after the path returned", time.Since(back))
		})
	})
}

// TestFakeTimeHandshakeTimeouts: a QUIC handshake without answer gives up
// after HandshakeTimeout (5s), and after two of them the edge falls back
// to TCP; a TCP+TLS handshake without answer gives up after 5s too; a hub
// drops an edge that never says hello after its own HandshakeTimeout (10s).
func TestFakeTimeHandshakeTimeouts(t *testing.T) {
	t.Run("quic unanswered, fallback", func(t *testing.T) {
		fakeTime(t, func(t *testing.T) {
			n := newMemNet(10 * time.Millisecond)
			p := newPKI(t)
			n.blockUDP(hubHost, true)
			h := startMemHub(t, n, p, ServerConfig{}, memHubAddr)
			var dials events
			start := time.Now()
			c := startMemClient(t, n, p, h.addr, "n1", func(c *ClientConfig) {
				c.DialTCP = func(ctx context.Context, addr string) (net.Conn, error) {
					dials.add(nil)
					return n.dialTCP(ctx, addr)
				}
			})
			waitConnected(t, c, time.Minute)
			took := time.Since(start)
			st := c.Stats()
			t.Logf("on the TCP fallback %v after the start", took)
			// Two unanswered handshakes of 5s and a jittered wait of less
			// than BackoffBase (1s) between them.
			if took < 10*time.Second || took >= 11*time.Second || st.Fallbacks != 1 || st.Transport != TransportTCP {
				t.Fatalf("fallback after %v, %d fallbacks, transport %q; want after 10s to 11s, 1, tcp", took, st.Fallbacks, st.Transport)
			}
			if d := dials.times(); len(d) != 1 {
				t.Fatalf("%d TCP dials, want 1", len(d))
			}
			// UDP works again: the probe every QUICProbeInterval (5m)
			// moves the edge back to QUIC without a gap.
			n.blockUDP(hubHost, false)
			onTCP := time.Now()
			time.Sleep(5*time.Minute - time.Second)
			if tr := c.Stats().Transport; tr != TransportTCP {
				t.Fatalf("transport %q before the first probe", tr)
			}
			time.Sleep(2 * time.Second)
			if st := c.Stats(); st.Transport != TransportQUIC || h.srv.Session("n1").Peer().Transport != TransportQUIC {
				t.Fatalf("transport %q %v after the fallback, want quic", st.Transport, time.Since(onTCP))
			}
		})
	})
	t.Run("tcp unanswered", func(t *testing.T) {
		fakeTime(t, func(t *testing.T) {
			n := newMemNet(10 * time.Millisecond)
			p := newPKI(t)
			n.setBlackhole(hubHost, true) // the hub's host takes TCP connects and never answers
			h := startMemHub(t, n, p, ServerConfig{}, memHubAddr)
			var dials events
			c := startMemClient(t, n, p, h.addr, "n1", func(c *ClientConfig) {
				c.ForceTCP = true
				c.BackoffBase, c.BackoffCap = time.Nanosecond, time.Nanosecond // retry at once
				c.DialTCP = func(ctx context.Context, addr string) (net.Conn, error) {
					dials.add(nil)
					return n.dialTCP(ctx, addr)
				}
			})
			time.Sleep(time.Minute)
			d := dials.times()
			if len(d) < 3 || c.Connected() {
				t.Fatalf("%d TCP attempts in a minute, connected %v", len(d), c.Connected())
			}
			for i := 1; i < len(d); i++ {
				if gap := d[i].Sub(d[i-1]); gap != 5*time.Second {
					t.Errorf("TCP attempt %d gave up after %v, want HandshakeTimeout (5s)", i, gap)
				}
			}
		})
	})
	t.Run("no hello", func(t *testing.T) {
		fakeTime(t, func(t *testing.T) {
			n := newMemNet(10 * time.Millisecond)
			p := newPKI(t)
			h := startMemHub(t, n, p, ServerConfig{}, memHubAddr)
			tc := p.clientTLS(p.node(t, "mute"))
			tc.NextProtos = []string{ALPN}
			pc := n.listenUDP("10.0.1.1:0")
			tr := &quic.Transport{Conn: pc}
			defer tr.Close()
			raddr, _ := net.ResolveUDPAddr("udp", h.addr)
			conn, err := tr.Dial(context.Background(), raddr, tc, &quic.Config{MaxIdleTimeout: time.Hour, KeepAlivePeriod: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			<-conn.Context().Done()
			took := time.Since(start)
			var ae *quic.ApplicationError
			if !errors.As(context.Cause(conn.Context()), &ae) || uint64(ae.ErrorCode) != codeProtocol {
				t.Errorf("connection ended with %v, want the hub's protocol error", context.Cause(conn.Context()))
			}
			// The hub's default HandshakeTimeout is 10s; its close frame
			// takes one latency.
			if took < 10*time.Second || took > 10*time.Second+2*n.delay {
				t.Fatalf("hub dropped a mute edge after %v, want 10s", took)
			}
			if h.srv.Stats().SessionsRefused != 1 {
				t.Fatalf("SessionsRefused = %d, want 1", h.srv.Stats().SessionsRefused)
			}
		})
	})
}

// TestFakeTimeBackoffCeiling: an edge the hub refuses retries with
// full-jitter exponential backoff, base 1s and ceiling 60s: the n-th wait
// stays below min(60s, 2^n s), and at the ceiling the waits fill the whole
// range up to 60s.
func TestFakeTimeBackoffCeiling(t *testing.T) {
	fakeTime(t, func(t *testing.T) {
		n := newMemNet(0)
		p := newPKI(t)
		var attempts events
		startMemHub(t, n, p, ServerConfig{
			Identify: func(tls.ConnectionState) (string, error) {
				attempts.add(nil)
				return "", errors.New("banned")
			},
		}, memHubAddr)
		c := startMemClient(t, n, p, memHubAddr, "n1", nil)
		time.Sleep(30 * time.Minute)
		at := attempts.times()
		if c.Connected() || c.Stats().Fallbacks != 0 {
			t.Fatalf("refused edge connected or fell back to TCP")
		}
		if len(at) < 20 {
			t.Fatalf("%d attempts in half an hour", len(at))
		}
		var atCeiling []time.Duration
		for i := 1; i < len(at); i++ {
			gap := at[i].Sub(at[i-1])
			ceil := time.Minute
			if i < 7 {
				ceil = time.Second << (i - 1)
			}
			if gap >= ceil {
				t.Errorf("wait %d was %v, want below %v", i, gap, ceil)
			}
			if ceil == time.Minute {
				atCeiling = append(atCeiling, gap)
			}
		}
		sort.Slice(atCeiling, func(i, j int) bool { return atCeiling[i] < atCeiling[j] })
		t.Logf("%d attempts in half an hour; %d waits at the ceiling, from %v to %v", len(at), len(atCeiling),
			atCeiling[0].Round(time.Millisecond), atCeiling[len(atCeiling)-1].Round(time.Millisecond))
		// With n waits uniform in [0, 60s), the chance that none
		// exceeds 40s is (2/3)^n: below 1e-5 for n >= 30.
		if len(atCeiling) < 30 || atCeiling[len(atCeiling)-1] < 40*time.Second {
			t.Fatalf("waits at the ceiling do not reach it: %v", atCeiling)
		}
	})
}

// TestFakeTimeBackoffResetsAfterStableConnection: an edge whose connection
// lasted past BackoffReset (2m) comes back from a hub restart within its
// first backoff wait (below 1s), even after a series of failures before.
func TestFakeTimeBackoffResetsAfterStableConnection(t *testing.T) {
	fakeTime(t, func(t *testing.T) {
		n := newMemNet(10 * time.Millisecond)
		p := newPKI(t)
		// No hub for 10 minutes: the backoff climbs to its ceiling.
		c := startMemClient(t, n, p, memHubAddr, "n1", nil)
		time.Sleep(10 * time.Minute)
		h := startMemHub(t, n, p, ServerConfig{}, memHubAddr)
		waitConnected(t, c, 2*time.Minute)
		time.Sleep(3 * time.Minute)
		h.stop()
		down := time.Now()
		startMemHub(t, n, p, ServerConfig{}, memHubAddr)
		for c.Stats().Connects < 2 && time.Since(down) < time.Minute {
			time.Sleep(time.Millisecond)
		}
		// The edge is on the TCP fallback (QUIC went unanswered while
		// no hub was there), which notices the close at once. Without
		// the reset, the wait would be drawn below the 60s ceiling.
		if took := time.Since(down); took >= time.Second+10*n.delay {
			t.Fatalf("edge came back %v after the restart, want within the first backoff wait (below 1s)", took)
		}
	})
}

// TestFakeTimeDrainSpreadsReconnects: a hub that drains with a 60s window
// and then shuts down, as tether hub does, gets its edges back spread over
// the whole window, none after it.
func TestFakeTimeDrainSpreadsReconnects(t *testing.T) {
	fakeTime(t, func(t *testing.T) {
		const edges, window = 20, time.Minute
		n := newMemNet(10 * time.Millisecond)
		p := newPKI(t)
		a := startMemHub(t, n, p, ServerConfig{}, memHubAddr)
		clients := make([]*testClient, edges)
		var gone events
		for i := range edges {
			clients[i] = startMemClient(t, n, p, memHubAddr, fmt.Sprint("e", i), func(c *ClientConfig) {
				c.OnDisconnect = gone.add
			})
		}
		for _, c := range clients {
			waitConnected(t, c, time.Minute)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_ = a.srv.Drain(ctx, window)
		a.stop()
		var back events
		startMemHub(t, n, p, ServerConfig{OnConnect: func(*Session) { back.add(nil) }}, memHubAddr)
		time.Sleep(10 * n.delay) // the close frames arrive
		if g := gone.times(); len(g) != edges {
			t.Fatalf("%d edges saw the hub go, want %d", len(g), edges)
		}
		for _, err := range gone.errs() {
			if !errors.Is(err, errGoAway) {
				t.Errorf("an edge left with %v, want the goaway", err)
			}
		}
		time.Sleep(window + time.Second)
		bt := back.times()
		if len(bt) != edges {
			t.Fatalf("%d of %d edges back after the window", len(bt), edges)
		}
		var quarters [4]int
		first, last := bt[0], bt[0]
		for _, b := range bt {
			d := b.Sub(start)
			if d > window+5*n.delay {
				t.Errorf("an edge came back %v after the goaway, window %v", d, window)
			}
			quarters[min(3, int(4*d/window))]++
			if b.Before(first) {
				first = b
			}
			if b.After(last) {
				last = b
			}
		}
		t.Logf("edges back per quarter of the window: %v; first %v, last %v after the goaway", quarters, first.Sub(start), last.Sub(start))
		// 20 uniform draws all within half the window: probability
		// about 20·2^-19, below 1e-4.
		if last.Sub(first) < window/2 {
			t.Errorf("reconnects within %v of a %v window: not spread", last.Sub(first), window)
		}
	})
}

// TestFakeTimeDialWait: DialContext while disconnected waits DialWait (30s)
// and fails with ECONNREFUSED; a dial that waits while the hub comes up
// succeeds.
func TestFakeTimeDialWait(t *testing.T) {
	fakeTime(t, func(t *testing.T) {
		n := newMemNet(10 * time.Millisecond)
		p := newPKI(t)
		c := startMemClient(t, n, p, memHubAddr, "n1", nil)
		start := time.Now()
		_, err := c.DialContext(context.Background(), "tcp", "hub")
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("DialContext while disconnected: %v, want ECONNREFUSED", err)
		}
		if d := time.Since(start); d != 30*time.Second {
			t.Fatalf("DialContext gave up after %v, want DialWait (30s)", d)
		}

		patient := startMemClient(t, n, p, memHubAddr, "n2", nil)
		res := make(chan error, 1)
		start = time.Now()
		go func() {
			conn, err := patient.DialContext(context.Background(), "tcp", "hub")
			if err == nil {
				conn.Close()
			}
			res <- err
		}()
		time.Sleep(8 * time.Second)
		startMemHub(t, n, p, ServerConfig{}, memHubAddr)
		if err := <-res; err != nil {
			t.Fatalf("dial while the hub came up: %v", err)
		}
		t.Logf("dial went through %v after it started, the hub %v after it", time.Since(start), 8*time.Second)
	})
}

// TestFakeTimeHubDialTimeout: a hub-opened stream whose edge does not
// answer fails after the hub's DialTimeout (10s) and is reset.
func TestFakeTimeHubDialTimeout(t *testing.T) {
	transports(t, func(t *testing.T, tcp bool) {
		fakeTime(t, func(t *testing.T) {
			n := newMemNet(10 * time.Millisecond)
			p := newPKI(t)
			h := startMemHub(t, n, p, ServerConfig{}, memHubAddr)
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			c := startMemClient(t, n, p, memHubAddr, "n1", func(c *ClientConfig) {
				c.ForceTCP = tcp
				c.DialTarget = func(context.Context, string) (net.Conn, error) {
					<-release // a target that never answers, not even to its context
					return nil, errors.New("released")
				}
			})
			waitConnected(t, c, time.Minute)
			start := time.Now()
			conn, err := h.srv.Dial(context.Background(), "n1", TargetNode)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, err = conn.Read(make([]byte, 1))
			took := time.Since(start)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read from an unanswered dial: %v, want a timeout", err)
			}
			if took != 10*time.Second {
				t.Fatalf("unanswered dial failed after %v, want DialTimeout (10s)", took)
			}
		})
	})
}

// TestFakeTimeLossyPathStaysUp: on a path that loses a quarter of its
// packets, heartbeats still get through (QUIC retransmits them) and
// neither end mistakes the loss for a dead peer. At a third, QUIC's own
// idle timer ends about one ten-minute run in 250: its probe timeout
// doubles after every unanswered probe, and quic-go does not count the
// answer to the first of its two probes, so 45 s can pass with nothing
// through either way. The hub no longer adds its own such drops (see
// controlLoop).
func TestFakeTimeLossyPathStaysUp(t *testing.T) {
	fakeTime(t, func(t *testing.T) {
		n := newMemNet(20 * time.Millisecond)
		p := newPKI(t)
		var beats, hubGone, edgeGone events
		h := startMemHub(t, n, p, ServerConfig{
			OnHeartbeat:  func(*Session) { beats.add(nil) },
			OnDisconnect: func(_ *Session, err error) { hubGone.add(err) },
		}, memHubAddr)
		c := startMemClient(t, n, p, h.addr, "n1", func(c *ClientConfig) { c.OnDisconnect = edgeGone.add })
		waitConnected(t, c, time.Minute)
		n.setLoss(1.0 / 4)
		time.Sleep(10 * time.Minute)
		if len(hubGone.times()) != 0 || len(edgeGone.times()) != 0 || c.Stats().Connects != 1 {
			t.Fatalf("lossy path: hub saw %v, edge %v, %d connects", hubGone.errs(), edgeGone.errs(), c.Stats().Connects)
		}
		// 40 heartbeats in 10 minutes; the last may still be in flight.
		if b := len(beats.times()); b < 39 {
			t.Fatalf("%d heartbeats arrived in 10 minutes, want 40", b)
		}
	})
}

// TestFakeTimeSilentAgentOnLiveQUIC: an edge whose QUIC stack answers (it
// sends keepalives, so no idle timer expires) but which sends no
// heartbeats after its hello is dropped by the hub after twice the idle
// timeout: the deadline over QUIC leaves room for heartbeats delayed by
// retransmissions and still catches a stuck agent.
func TestFakeTimeSilentAgentOnLiveQUIC(t *testing.T) {
	fakeTime(t, func(t *testing.T) {
		n := newMemNet(10 * time.Millisecond)
		p := newPKI(t)
		var gone events
		h := startMemHub(t, n, p, ServerConfig{
			OnDisconnect: func(_ *Session, err error) { gone.add(err) },
		}, memHubAddr)
		tc := p.clientTLS(p.node(t, "stuck"))
		tc.NextProtos = []string{ALPN}
		tr := &quic.Transport{Conn: n.listenUDP("10.0.1.1:0")}
		defer tr.Close()
		raddr, _ := net.ResolveUDPAddr("udp", h.addr)
		conn, err := tr.Dial(context.Background(), raddr, tc, &quic.Config{MaxIdleTimeout: time.Hour, KeepAlivePeriod: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		st, err := conn.OpenStreamSync(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Write(appendFrame(nil, frameHello, marshalHello(Hello{Node: "stuck", Version: "test"}, 0))); err != nil {
			t.Fatal(err)
		}
		if typ, _, err := readFrame(&byteReader{r: st}); err != nil || typ != frameWelcome {
			t.Fatalf("welcome: frame %#x, %v", typ, err)
		}
		welcomed := time.Now()
		<-conn.Context().Done()
		took := time.Since(welcomed)
		errs := gone.errs()
		if len(errs) != 1 || errs[0] == nil || errs[0].Error() != "no heartbeat for 1m30s" {
			t.Fatalf("hub saw %v, want no heartbeat for 1m30s", errs)
		}
		// The deadline runs from the welcome; the close frame takes one
		// latency.
		if took < 90*time.Second || took > 90*time.Second+2*n.delay {
			t.Fatalf("hub dropped a silent edge %v after its welcome, want 90s", took)
		}
	})
}
