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

	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/testbench"
	"github.com/tether-edge/tether/tunnel"
)

// startBulk starts an endless upload to the hub's /bulk on c's bulk lane;
// the returned func stops it and waits until it ended.
func (r *rig) startBulk(c *tunnel.Client) (stop func()) {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return c.DialContext(tunnel.WithBulk(ctx), network, addr)
	}}
	return r.startPost(&http.Client{Transport: tr}, "http://hub/bulk", tr.CloseIdleConnections)
}

// startPost posts an endless body to url until the returned func is called.
func (r *rig) startPost(hc *http.Client, url string, after func()) (stop func()) {
	halt := new(atomic.Bool)
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, "POST", url, io.NopCloser(infinite{halt}))
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	return func() {
		halt.Store(true)
		cancel()
		<-done
		if after != nil {
			after()
		}
	}
}

// startTLS starts an endless upload to the TCP+TLS peer with congestion
// control cc.
func (r *rig) startTLS(cc string) (stop func()) {
	raw, err := r.dialInNodeCC(context.Background(), r.hubIP+":"+tlsPort, cc)
	if err != nil {
		r.t.Fatal(err)
	}
	tc := tls.Client(raw, &tls.Config{RootCAs: r.pki.pool, ServerName: "hub"})
	halt := new(atomic.Bool)
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(tc, infinite{halt})
	}()
	return func() {
		halt.Store(true)
		raw.(*net.TCPConn).SetLinger(0)
		tc.Close()
		<-done
	}
}

// TestBulkOnThinLinks (B5): one upload on the bulk lane through a
// rate-limited link of 4 Mbit/s and of 256 kbit/s (RTT 50 ms, a queue of
// about 130 ms and 250 ms), against the shaped rate; TCP+TLS with bbr
// through the same link for context. Goodput counts payload only: TCP/IP,
// TLS and framing headers take about 4 % of the link. The queue's content
// at the start and the end of a run blurs a short run's figure by up to
// queue/(rate·time): 4 % at 256 kbit/s in the short run.
func TestBulkOnThinLinks(t *testing.T) {
	thin := func(rate int64) testbench.LinkParams {
		queue := 64 << 10
		if rate < 1_000_000 {
			queue = 8 << 10
		}
		return testbench.LinkParams{Delay: testbench.Duration(25 * time.Millisecond), Rate: rate, QueueLimit: queue}
	}
	r := newRig(t, thin(4_000_000), tunnel.ServerConfig{})
	c := r.client(node, func(c *tunnel.ClientConfig) { c.BulkIdle = 300 * time.Millisecond })
	d := 6 * time.Second
	if *full {
		d = 30 * time.Second
	}
	type row struct {
		rate      int64
		lane, bbr float64
	}
	var rows []row
	for _, rate := range []int64{4_000_000, 256_000} {
		if err := r.lab.Shape(site, thin(rate)); err != nil {
			t.Fatal(err)
		}
		warm := 2 * time.Second
		x := row{rate: rate}
		x.lane = r.bulkUpload(c, warm, d)
		x.bbr = r.tlsUploadAfter("bbr", warm, d)
		rows = append(rows, x)
	}
	t.Logf("B5 goodput of one bulk-lane upload on thin links, RTT 50 ms, %v per run", d)
	t.Logf("%-12s %14s %8s %14s %8s", "link", "bulk lane", "of rate", "TCP+TLS bbr", "of rate")
	for _, x := range rows {
		link := float64(x.rate) / 1e6
		t.Logf("%-12s %9.3f Mb/s %7.2fx %9.3f Mb/s %7.2fx", fmt.Sprintf("%g Mbit/s", link), x.lane, x.lane/link, x.bbr, x.bbr/link)
		benchfmt.Report(t, benchfmt.Figure{Name: fmt.Sprintf("tunnel_bulk_thin_%dkbit", x.rate/1000), Value: x.lane, Unit: "Mbit/s",
			Target: "ratio>=0.9", Peer: "shaped_rate", PeerValue: link, Mode: benchfmt.Mode(*full),
			Extra: []string{fmt.Sprintf("tcp_tls_bbr=%.3f", x.bbr), "rtt_ms=50", fmt.Sprintf("queue_kib=%d", thin(x.rate).QueueLimit>>10),
				fmt.Sprintf("seconds=%.0f", d.Seconds())}})
	}
}

// TestBulkBesideCubic: a TCP+TLS cubic upload and a bulk-lane upload share
// one 20 Mbit/s uplink (RTT 50 ms). BBRv1 is known to starve cubic in
// shallow buffers and to yield to it in deep ones, so the share is
// measured at the lab's default queue (64 KiB, half the path's
// bandwidth-delay product) and at 500 KiB (200 ms at this rate, four
// times the product, as deep as the buffers of cellular links), where the
// target applies: cubic keeps at least a third of the link. The full run
// adds 250 KiB, twice the product.
func TestBulkBesideCubic(t *testing.T) {
	const rate = 20_000_000
	link := func(queue int) testbench.LinkParams {
		return testbench.LinkParams{Delay: testbench.Duration(25 * time.Millisecond), Rate: rate, QueueLimit: queue}
	}
	r := newRig(t, link(64<<10), tunnel.ServerConfig{})
	c := r.client(node, func(c *tunnel.ClientConfig) { c.BulkIdle = 300 * time.Millisecond })
	d := 8 * time.Second
	if *full {
		d = 30 * time.Second
	}
	type row struct {
		queue       int
		cubic, lane float64
	}
	var rows []row
	queues := []int{64 << 10, 500 << 10}
	if *full {
		queues = []int{64 << 10, 250 << 10, 500 << 10}
	}
	for _, q := range queues {
		if err := r.lab.Shape(site, link(q)); err != nil {
			t.Fatal(err)
		}
		stopCubic := r.startTLS("cubic")
		time.Sleep(time.Second)
		stopLane := r.startBulk(c)
		time.Sleep(3 * time.Second)
		b0, p0, start := r.bulk.Load(), r.peer.Load(), time.Now()
		time.Sleep(d)
		b1, p1, el := r.bulk.Load(), r.peer.Load(), time.Since(start).Seconds()
		stopLane()
		stopCubic()
		settle(r)
		x := row{queue: q, cubic: float64(p1-p0) * 8 / el / 1e6}
		x.lane = float64(b1-b0)*8/el/1e6 - x.cubic
		rows = append(rows, x)
	}
	t.Logf("TCP+TLS cubic beside a bulk-lane upload (%s), 20 Mbit/s, RTT 50 ms, %v measured", c.Stats().BulkCongestion, d)
	t.Logf("%-10s %12s %12s %12s", "queue", "cubic", "bulk lane", "cubic share")
	for _, x := range rows {
		share := x.cubic / (rate / 1e6)
		t.Logf("%-10s %7.2f Mb/s %7.2f Mb/s %11.2f", fmt.Sprintf("%d KiB", x.queue>>10), x.cubic, x.lane, share)
		target := ""
		if x.queue >= 500<<10 {
			target = ">=0.333"
		}
		benchfmt.Report(t, benchfmt.Figure{Name: fmt.Sprintf("tunnel_bulk_cubic_share_queue%dkib", x.queue>>10), Value: share, Unit: "of_link",
			Target: target, Mode: benchfmt.Mode(*full),
			Extra: []string{fmt.Sprintf("cubic_mbit=%.2f", x.cubic), fmt.Sprintf("lane_mbit=%.2f", x.lane), "rate_mbit=20", "rtt_ms=50"}})
	}
}

// TestInteractiveBesideBulk repeats B1 and B2 on the tunnel's QUIC streams
// while a bulk-lane upload fills the same uplink (RTT 50 ms, 100 Mbit/s,
// the B1 link): small request/responses with one stalled stream, idle and
// loaded (target: loaded p99 ≤ 1.1 × idle), and the first byte of hub→edge
// requests (target: p99 ≤ 1 RTT + 10 ms).
func TestInteractiveBesideBulk(t *testing.T) {
	const rtt = 50 * time.Millisecond
	l := testbench.LinkParams{Delay: testbench.Duration(rtt / 2), Rate: 100_000_000, QueueLimit: 1 << 20}
	r := newRig(t, l, tunnel.ServerConfig{StreamWindow: holWindow})
	c := r.client(node, nil)
	pings0, dials := 100, 20
	if *full {
		pings0, dials = 1000, 100
	}
	var ln net.Listener
	if err := r.inNode(func() (err error) { ln, err = net.Listen("tcp4", "127.0.0.1:9000"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					if _, err := br.ReadString('\n'); err != nil {
						return
					}
					conn.Write([]byte("x"))
				}
			}()
		}
	}()
	firstBytes := func() []time.Duration {
		var out []time.Duration
		for range dials {
			start := time.Now()
			conn, err := r.srv.Dial(context.Background(), node, "tcp:127.0.0.1:9000")
			if err != nil {
				t.Fatal(err)
			}
			conn.Write([]byte("GET\n"))
			if _, err := io.ReadFull(conn, make([]byte, 1)); err != nil {
				t.Fatal(err)
			}
			out = append(out, time.Since(start))
			conn.Close()
		}
		return out
	}
	tr := &http.Transport{DialContext: c.DialContext}
	hc := &http.Client{Transport: tr}
	idlePings := pingLoop(t, hc, "http://hub", pings0)
	idleFirst := firstBytes()

	// loaded runs the checks while bulk uploads on its lane.
	loaded := func(bulk *tunnel.Client) (pings, first []time.Duration, rate float64) {
		stopStall := r.startPost(&http.Client{Transport: &http.Transport{DialContext: c.DialContext}}, "http://hub/stall", nil)
		stopBulk := r.startBulk(bulk)
		time.Sleep(2 * time.Second) // BBR's startup is over
		b0, start := r.bulk.Load(), time.Now()
		pings = pingLoop(t, hc, "http://hub", pings0)
		first = firstBytes()
		rate = float64(r.bulk.Load()-b0) * 8 / time.Since(start).Seconds() / 1e6
		stopBulk()
		stopStall()
		settle(r)
		if bulk.Stats().BulkLanes == 0 {
			t.Fatal("the bulk upload opened no lane")
		}
		return pings, first, rate
	}
	loadedPings, loadedFirst, bulkRate := loaded(c)
	// The same with cubic on the lane, as a loss-based lane would be.
	cubic := r.client("edge-cubic", func(c *tunnel.ClientConfig) { c.BulkCongestion = "cubic" })
	cubicPings, cubicFirst, cubicRate := loaded(cubic)
	// And with the lane's pacing capped a little below the link's rate.
	capped := r.client("edge-capped", func(c *tunnel.ClientConfig) { c.BulkMaxRate = 90_000_000 })
	cappedPings, cappedFirst, cappedRate := loaded(capped)

	growth := float64(percentile(loadedPings, .99)) / float64(percentile(idlePings, .99))
	fb99 := percentile(loadedFirst, .99)
	msf := func(d time.Duration) float64 { return float64(d) / 1e6 }
	t.Logf("B1/B2 beside a bulk-lane upload at %.1f Mbit/s: RTT 50 ms, 100 Mbit/s, 1 MiB queue", bulkRate)
	t.Logf("%-26s %10s %10s %10s %10s", "", "idle p50", "idle p99", "load p50", "load p99")
	t.Logf("%-26s %10s %10s %10s %10s", "request/response (QUIC)", ms(percentile(idlePings, .5)), ms(percentile(idlePings, .99)),
		ms(percentile(loadedPings, .5)), ms(percentile(loadedPings, .99)))
	t.Logf("%-26s %10s %10s %10s %10s", "hub→edge first byte", ms(percentile(idleFirst, .5)), ms(percentile(idleFirst, .99)),
		ms(percentile(loadedFirst, .5)), ms(fb99))
	t.Logf("with cubic on the lane instead (%.1f Mbit/s): request/response p50 %s p99 %s, first byte p50 %s p99 %s", cubicRate,
		ms(percentile(cubicPings, .5)), ms(percentile(cubicPings, .99)), ms(percentile(cubicFirst, .5)), ms(percentile(cubicFirst, .99)))
	t.Logf("with the lane's pacing capped at 90 Mbit/s (BulkMaxRate; %.1f Mbit/s): request/response p50 %s p99 %s, first byte p50 %s p99 %s", cappedRate,
		ms(percentile(cappedPings, .5)), ms(percentile(cappedPings, .99)), ms(percentile(cappedFirst, .5)), ms(percentile(cappedFirst, .99)))
	extra := []string{fmt.Sprintf("bulk_mbit=%.1f", bulkRate), "rtt_ms=50", "rate_mbit=100"}
	benchfmt.Report(t, benchfmt.Figure{Name: "tunnel_hol_beside_bulk_p99_growth", Value: growth, Unit: "x", Target: "<=1.1",
		Mode: benchfmt.Mode(*full), Extra: append(extra, fmt.Sprintf("pings=%d", pings0),
			fmt.Sprintf("cubic_lane_growth=%.2f", float64(percentile(cubicPings, .99))/float64(percentile(idlePings, .99))),
			fmt.Sprintf("capped_lane_growth=%.2f", float64(percentile(cappedPings, .99))/float64(percentile(idlePings, .99))))})
	benchfmt.Report(t, benchfmt.Figure{Name: "tunnel_first_byte_beside_bulk_p99", Value: msf(fb99), Unit: "ms",
		Target: fmt.Sprintf("<=%.0f", msf(rtt+10*time.Millisecond)), Mode: benchfmt.Mode(*full),
		Extra: append(extra, fmt.Sprintf("requests=%d", dials), fmt.Sprintf("idle_p99_ms=%.1f", msf(percentile(idleFirst, .99))),
			fmt.Sprintf("cubic_lane_p99_ms=%.1f", msf(percentile(cubicFirst, .99))),
			fmt.Sprintf("capped_lane_p99_ms=%.1f", msf(percentile(cappedFirst, .99))))})
}
