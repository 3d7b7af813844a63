package tunnelbench

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/testbench"
	"github.com/tether-edge/tether/tunnel"
)

func newH2Server(r *rig) *http.Server {
	s := &http.Server{
		Handler:   r.handlers(),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{r.hubCert}, NextProtos: []string{"h2"}},
	}
	// The same per-stream receive window as the tunnel's hub side below.
	http2.ConfigureServer(s, &http2.Server{MaxUploadBufferPerStream: holWindow, MaxUploadBufferPerConnection: 64 << 20})
	return s
}

// holWindow is the hub's per-stream receive window in the HOL benchmark,
// for the tunnel and the HTTP/2 peer alike.
const holWindow = 256 << 10

// TestHeadOfLineIsolation (B1): one stream's reader stalls, another
// uploads in bulk, and small request/responses on a third stream are
// timed, against the same three streams on one TCP+TLS HTTP/2 connection.
func TestHeadOfLineIsolation(t *testing.T) {
	link := testbench.LinkParams{Delay: testbench.Duration(25 * time.Millisecond), Rate: 100_000_000, QueueLimit: 1 << 20}
	r := newRig(t, link, tunnel.ServerConfig{StreamWindow: holWindow})
	c := r.client(node, nil)
	pings := 100
	if *full {
		pings = 1000
	}
	tunnelHTTP := &http.Client{Transport: &http.Transport{DialContext: c.DialContext}}
	h2 := &http.Client{Transport: &http2.Transport{
		TLSClientConfig: &tls.Config{RootCAs: r.pki.pool, ServerName: "hub"},
		DialTLSContext: func(ctx context.Context, network, addr string, cfg *tls.Config) (net.Conn, error) {
			raw, err := r.dialInNode(ctx, "tcp4", addr)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(raw, cfg)
			return tc, tc.HandshakeContext(ctx)
		},
	}}
	type result struct{ idle, loaded []time.Duration }
	run := func(hc *http.Client, base string) result {
		var res result
		res.idle = pingLoop(t, hc, base, pings)
		stop := new(atomic.Bool)
		done := make(chan struct{}, 2)
		for _, path := range []string{"/stall", "/bulk"} {
			go func() {
				defer func() { done <- struct{}{} }()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go func() {
					for !stop.Load() {
						time.Sleep(10 * time.Millisecond)
					}
					cancel()
				}()
				req, _ := http.NewRequestWithContext(ctx, "POST", base+path, io.NopCloser(infinite{stop}))
				if resp, err := hc.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
		}
		time.Sleep(time.Second) // let the bulk upload reach steady state
		before := r.bulk.Load()
		start := time.Now()
		res.loaded = pingLoop(t, hc, base, pings)
		rate := float64(r.bulk.Load()-before) * 8 / time.Since(start).Seconds() / 1e6
		stop.Store(true)
		<-done
		<-done
		t.Logf("%s: bulk upload ran at %.1f Mbit/s during the loaded pings", base, rate)
		return res
	}
	q := run(tunnelHTTP, "http://hub")
	p := run(h2, "https://"+r.hubIP+":"+h2Port)
	t.Logf("B1 head-of-line isolation: RTT 50 ms, 100 Mbit/s, %d pings per phase, one stalled and one bulk stream", pings)
	t.Logf("%-22s %10s %10s %10s %10s %9s", "transport", "idle p50", "idle p99", "load p50", "load p99", "p99 ratio")
	for _, x := range []struct {
		name string
		r    result
	}{{"tunnel (QUIC)", q}, {"TCP+TLS HTTP/2", p}} {
		ip99, lp99 := percentile(x.r.idle, .99), percentile(x.r.loaded, .99)
		t.Logf("%-22s %10s %10s %10s %10s %8.2fx", x.name, ms(percentile(x.r.idle, .5)), ms(ip99),
			ms(percentile(x.r.loaded, .5)), ms(lp99), float64(lp99)/float64(ip99))
	}
	qr := float64(percentile(q.loaded, .99)) / float64(percentile(q.idle, .99))
	pr := float64(percentile(p.loaded, .99)) / float64(percentile(p.idle, .99))
	t.Logf("loaded p99 increase: tunnel %+.0f%% (target ≤ +10%%), HTTP/2 %+.0f%%", (qr-1)*100, (pr-1)*100)
	benchfmt.Report(t, benchfmt.Figure{Name: "tunnel_hol_loaded_p99_growth", Value: qr, Unit: "x", Target: "<=1.1",
		Peer: "http2_over_tcp_tls", PeerValue: pr, Mode: benchfmt.Mode(*full),
		Extra: []string{fmt.Sprintf("pings=%d", pings), "rtt_ms=50", "rate_mbit=100"}})
}

func pingLoop(t *testing.T, hc *http.Client, base string, n int) []time.Duration {
	t.Helper()
	out := make([]time.Duration, 0, n)
	for i := range n + 3 { // the first pings warm up connections and streams
		if i == 3 {
			out = out[:0]
		}
		start := time.Now()
		resp, err := hc.Get(base + "/ping")
		if err != nil {
			t.Fatalf("ping %s: %v", base, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out = append(out, time.Since(start))
	}
	return out
}

// TestTimeToFirstByte (B2): a hub→edge request at 100 ms RTT with the
// tunnel already up, over QUIC (optimistic dial) and over the TCP fallback,
// against a dial that waits for the edge's answer before sending the
// request (the Konnectivity DIAL_REQ/DIAL_RSP pattern).
func TestTimeToFirstByte(t *testing.T) {
	const rtt = 100 * time.Millisecond
	r := newRig(t, testbench.LinkParams{Delay: testbench.Duration(rtt / 2)}, tunnel.ServerConfig{})
	// A local service on the edge node: it greets on accept (for the
	// wait-first variant) and answers every line.
	var ln net.Listener
	if err := r.inNode(func() (err error) { ln, err = net.Listen("tcp4", "127.0.0.1:9000"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("+"))
				br := bufio.NewReader(c)
				for {
					if _, err := br.ReadString('\n'); err != nil {
						return
					}
					c.Write([]byte("x"))
				}
			}()
		}
	}()
	r.client(node, nil)
	r.client("edge-tcp", func(c *tunnel.ClientConfig) { c.ForceTCP = true })
	n := 10
	if *full {
		n = 100
	}
	measure := func(name string, waitFirst bool) []time.Duration {
		var out []time.Duration
		for range n {
			start := time.Now()
			conn, err := r.srv.Dial(context.Background(), name, "tcp:127.0.0.1:9000")
			if err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 1)
			if waitFirst {
				if _, err := io.ReadFull(conn, b); err != nil { // the dial's answer
					t.Fatal(err)
				}
				conn.Write([]byte("GET\n"))
				if _, err := io.ReadFull(conn, b); err != nil {
					t.Fatal(err)
				}
			} else {
				conn.Write([]byte("GET\n"))
				if _, err := io.ReadFull(conn, make([]byte, 2)); err != nil { // greeting and answer
					t.Fatal(err)
				}
			}
			out = append(out, time.Since(start))
			conn.Close()
		}
		return out
	}
	quic := measure(node, false)
	tcp := measure("edge-tcp", false)
	wait := measure(node, true)
	t.Logf("B2 time to first response byte of a hub→edge request, RTT %v, %d requests each", rtt, n)
	t.Logf("%-36s %10s %10s %12s", "variant", "p50", "p99", "p50 / RTT")
	for _, x := range []struct {
		name string
		d    []time.Duration
	}{{"tunnel QUIC, optimistic dial", quic}, {"tunnel TCP fallback, optimistic dial", tcp}, {"dial, wait for answer, then request", wait}} {
		t.Logf("%-36s %10s %10s %11.2fx", x.name, ms(percentile(x.d, .5)), ms(percentile(x.d, .99)), float64(percentile(x.d, .5))/float64(rtt))
	}
	t.Logf("tunnel QUIC p99 %s (target ≤ %s); wait-first / optimistic p50 = %.2fx",
		ms(percentile(quic, .99)), ms(rtt+10*time.Millisecond), float64(percentile(wait, .5))/float64(percentile(quic, .5)))
	msf := func(d time.Duration) float64 { return float64(d) / 1e6 }
	extra := []string{fmt.Sprintf("rtt_ms=%.0f", msf(rtt)), fmt.Sprintf("requests=%d", n)}
	benchfmt.Report(t, benchfmt.Figure{Name: "tunnel_first_byte_p50", Value: msf(percentile(quic, .5)), Unit: "ms",
		Peer: "dial_then_request", PeerValue: msf(percentile(wait, .5)), Mode: benchfmt.Mode(*full), Extra: extra})
	benchfmt.Report(t, benchfmt.Figure{Name: "tunnel_first_byte_p99", Value: msf(percentile(quic, .99)), Unit: "ms",
		Target: fmt.Sprintf("<=%.0f", msf(rtt+10*time.Millisecond)),
		Peer:   "dial_then_request", PeerValue: msf(percentile(wait, .99)), Mode: benchfmt.Mode(*full),
		Extra: append(extra, fmt.Sprintf("tcp_fallback_p99_ms=%.1f", msf(percentile(tcp, .99))))})
}

// TestGoodputUnderLoss (B3): one upload through a link with 1 % and 3 %
// random loss each way, at RTT 50 ms and 300 ms: the tunnel's QUIC stream
// (at 50 ms), a stream on the bulk lane, and one TCP+TLS connection with
// cubic and with bbr, all in the same run.
func TestGoodputUnderLoss(t *testing.T) {
	lossy := func(rtt time.Duration, loss float64) testbench.LinkParams {
		return testbench.LinkParams{Delay: testbench.Duration(rtt / 2), Loss: loss, QueueLimit: 1 << 20}
	}
	// The edge connects over the lossy link, as an edge on such a link
	// does: the tunnel judges loss against the path's round trip.
	r := newRig(t, lossy(50*time.Millisecond, 0.01), tunnel.ServerConfig{})
	c := r.client(node, func(c *tunnel.ClientConfig) { c.BulkIdle = 300 * time.Millisecond })
	d := 4 * time.Second
	if *full {
		d = 20 * time.Second
	}
	linkDelta := func(f func() float64) (float64, string) {
		before := r.lab.Stats().Links[site].Up
		rate := f()
		after := r.lab.Stats().Links[site].Up
		pk, dr := after.Packets-before.Packets, after.Dropped-before.Dropped
		return rate, fmt.Sprintf("%d pkts, %.1f%% dropped", pk, 100*float64(dr)/float64(max(pk, 1)))
	}
	var fecNote string
	tunnelRun := func() float64 {
		h0 := r.srv.Stats().FEC
		rate, f := r.tunnelUpload(c, d)
		h := r.srv.Stats().FEC
		fecNote = fmt.Sprintf("parity: %d packets for %d protected (%.1f%% more packets), hub rebuilt %d, %d groups unrecoverable",
			f.ParityPackets, f.Protected, 100*float64(f.ParityPackets)/float64(max(f.Protected, 1)),
			h.Recovered-h0.Recovered, h.Unrecoverable-h0.Unrecoverable)
		return rate
	}
	type row struct {
		rtt                  time.Duration
		loss                 float64
		quic, tcp, bbr, lane float64
	}
	var rows []row
	for _, rtt := range []time.Duration{50 * time.Millisecond, 300 * time.Millisecond} {
		// BBR's startup takes about ten round trips to find the rate,
		// after the handshakes: TCP and TLS, and on the lane its welcome.
		warm := max(time.Second, 15*rtt)
		for _, loss := range []float64{0.01, 0.03} {
			if err := r.lab.Shape(site, lossy(rtt, loss)); err != nil {
				t.Fatal(err)
			}
			x := row{rtt: rtt, loss: loss}
			var qs string
			if rtt == 50*time.Millisecond {
				x.quic, qs = linkDelta(tunnelRun)
				qs = fmt.Sprintf("; tunnel QUIC %s (%s)", qs, fecNote)
			}
			var ps, bs, ls string
			x.tcp, ps = linkDelta(func() float64 { return r.tlsUploadAfter("cubic", warm, d) })
			x.bbr, bs = linkDelta(func() float64 { return r.tlsUploadAfter("bbr", warm, d) })
			x.lane, ls = linkDelta(func() float64 { return r.bulkUpload(c, warm, d) })
			t.Logf("RTT %v, loss %.0f%%: uplink TCP cubic %s; TCP bbr %s; bulk lane %s%s", rtt, loss*100, ps, bs, ls, qs)
			rows = append(rows, x)
		}
	}
	cs := c.Stats()
	t.Logf("B3 goodput of one upload, random loss each way, %v per run after a warm-up of 15 RTTs (1 s at least) from the dial", d)
	t.Logf("quic-go's congestion control is NewReno; the like-for-like peer of the QUIC stream is TCP with cubic")
	t.Logf("the bulk lane is TCP+TLS+yamux with %s set on its socket; its peer is TCP+TLS with bbr", cs.BulkCongestion)
	t.Logf("%-6s %-6s %13s %13s %7s %13s %13s %7s", "RTT", "loss", "tunnel QUIC", "TCP cubic", "ratio", "TCP bbr", "bulk lane", "ratio")
	for _, x := range rows {
		q := "—"
		qr := "—"
		if x.quic > 0 {
			q, qr = fmt.Sprintf("%8.2f Mb/s", x.quic), fmt.Sprintf("%6.2fx", x.quic/x.tcp)
		}
		t.Logf("%-6s %-6s %13s %8.2f Mb/s %7s %8.2f Mb/s %8.2f Mb/s %6.2fx", fmt.Sprintf("%.0fms", float64(x.rtt)/1e6),
			fmt.Sprintf("%.0f%%", x.loss*100), q, x.tcp, qr, x.bbr, x.lane, x.lane/x.bbr)
	}
	t.Logf("targets: QUIC ≥ 1.5x cubic; bulk lane ≥ 0.9x bbr")
	for _, x := range rows {
		rttMs := fmt.Sprintf("rtt_ms=%.0f", float64(x.rtt)/1e6)
		if x.quic > 0 {
			benchfmt.Report(t, benchfmt.Figure{Name: fmt.Sprintf("tunnel_goodput_loss_%.0fpct", x.loss*100), Value: x.quic, Unit: "Mbit/s",
				Target: "ratio>=1.5", Peer: "tcp_tls_cubic", PeerValue: x.tcp, Mode: benchfmt.Mode(*full),
				Extra: []string{fmt.Sprintf("tcp_tls_bbr=%.2f", x.bbr), rttMs, fmt.Sprintf("seconds=%.0f", d.Seconds())}})
		}
		benchfmt.Report(t, benchfmt.Figure{Name: fmt.Sprintf("tunnel_bulk_goodput_rtt%.0f_loss_%.0fpct", float64(x.rtt)/1e6, x.loss*100),
			Value: x.lane, Unit: "Mbit/s", Target: "ratio>=0.9", Peer: "tcp_tls_bbr", PeerValue: x.bbr, Mode: benchfmt.Mode(*full),
			Extra: []string{fmt.Sprintf("tcp_tls_cubic=%.2f", x.tcp), "lane_cc=" + cs.BulkCongestion, rttMs, fmt.Sprintf("seconds=%.0f", d.Seconds())}})
	}
}

// sampleAfter measures the hub's receive rate in Mbit/s over d, after a
// warm-up of warm.
func sampleAfter(r *rig, warm, d time.Duration) float64 {
	time.Sleep(warm)
	return sampleNow(r, d)
}

// sampleNow measures the hub's receive rate in Mbit/s over d from now.
func sampleNow(r *rig, d time.Duration) float64 {
	before, start := r.bulk.Load(), time.Now()
	time.Sleep(d)
	return float64(r.bulk.Load()-before) * 8 / time.Since(start).Seconds() / 1e6
}

// settle waits until the hub has received nothing for half a second (at
// most 20 s), so that what a finished run left in socket buffers is not
// counted in the next one.
func settle(r *rig) {
	last, quiet := r.bulk.Load(), time.Now()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		if n := r.bulk.Load(); n != last {
			last, quiet = n, time.Now()
		} else if time.Since(quiet) >= 500*time.Millisecond {
			return
		}
	}
}

// TestIdleUplink (B4): what an idle edge costs on its uplink: heartbeats,
// which double as the keepalive, and nothing else. The short run beats
// every second after path MTU discovery has settled and reports the cost
// per heartbeat at the default 15 s interval; the full run measures the
// default interval directly.
func TestIdleUplink(t *testing.T) {
	t.Parallel()
	r := newRig(t, testbench.LinkParams{Delay: testbench.Duration(20 * time.Millisecond)}, tunnel.ServerConfig{})
	interval, warm, window := time.Second, 12*time.Second, 20*time.Second
	if *full {
		interval, warm, window = 15*time.Second, 120*time.Second, 150*time.Second
	}
	c := r.client(node, func(c *tunnel.ClientConfig) { c.HeartbeatInterval = interval })
	// Tickets, acks and path MTU probes happen early in a connection's life;
	// the steady state is what an idle fleet pays.
	time.Sleep(warm)
	link0, cs0 := r.lab.Stats().Links[site], c.Stats()
	time.Sleep(window)
	link1, cs1 := r.lab.Stats().Links[site], c.Stats()
	upBytes := link1.Up.Bytes - link0.Up.Bytes
	upPkts := link1.Up.Packets - link0.Up.Packets
	sent := cs1.BytesSent - cs0.BytesSent
	beats := window.Seconds() / interval.Seconds()
	at15 := func(b uint64) float64 { return float64(b) / beats * 8 / 15 }
	t.Logf("B4 idle uplink per edge: heartbeat every %v, measured %v after %v warm-up", interval, window, warm)
	t.Logf("%-26s %8s %8s %14s %18s", "measured at", "packets", "bytes", "bytes/beat", "bit/s at 15 s beat")
	t.Logf("%-26s %8d %8d %14.1f %18.1f", "lab link (IP packets)", upPkts, upBytes, float64(upBytes)/beats, at15(upBytes))
	t.Logf("%-26s %8d %8d %14.1f %18.1f", "Client.Stats (UDP+IP)", cs1.PacketsSent-cs0.PacketsSent, sent, float64(sent)/beats, at15(sent))
	t.Logf("downlink (hub acks): %d packets, %d bytes", link1.Down.Packets-link0.Down.Packets, link1.Down.Bytes-link0.Down.Bytes)
	t.Logf("target ≤ 100 bit/s; KubeEdge anchor ≈ 250 bit/s per node")
	benchfmt.Report(t, benchfmt.Figure{Name: "tunnel_idle_uplink", Value: at15(upBytes), Unit: "bit/s", Target: "<=100",
		Mode: benchfmt.Mode(*full), Extra: []string{"heartbeat_s=15", fmt.Sprintf("window_s=%.0f", window.Seconds())}})
	if bps := at15(upBytes); bps > 100 {
		t.Errorf("idle uplink %.1f bit/s exceeds 100 bit/s", bps)
	}
}
