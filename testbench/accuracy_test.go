package testbench

import (
	"context"
	"fmt"
	"net"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/benchfmt"
)

// BenchmarkLinkAccuracy measures delay, loss and rate of a shaped uplink
// against their configured values. Run it with
//
//	go test -run '^$' -bench LinkAccuracy -benchtime 1x ./testbench/
func BenchmarkLinkAccuracy(b *testing.B) {
	if !isRoot() {
		b.Skip("testbench needs root to create network namespaces")
	}
	l, err := Up(context.Background(), Config{Spec: Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 1}}}})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	hub := l.Hub().Addr
	var pc net.PacketConn
	l.InHost("hub", func() (err error) { pc, err = net.ListenPacket("udp4", hub+":7001"); return })
	defer pc.Close()
	pc.(*net.UDPConn).SetReadBuffer(4 << 20)
	var recv atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			n, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			recv.Add(1)
			if n > 1 && buf[0] == 'p' {
				pc.WriteTo(buf[:n], a)
			}
		}
	}()
	c, err := dialIn(l, "shop-n1", "udp4", hub+":7001", time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	rtt := func(n int) (p10, p50, p90 time.Duration, lost int) {
		var rs []time.Duration
		buf := make([]byte, 64)
		for i := range n {
			start := time.Now()
			fmt.Fprintf(c, "p%d", i)
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			for {
				m, err := c.Read(buf)
				if err != nil {
					lost++
					break
				}
				if string(buf[:m]) == fmt.Sprintf("p%d", i) {
					rs = append(rs, time.Since(start))
					break
				}
			}
		}
		sort.Slice(rs, func(i, j int) bool { return rs[i] < rs[j] })
		return rs[len(rs)/10], rs[len(rs)/2], rs[len(rs)*9/10], lost
	}
	for range b.N {
		for _, d := range []time.Duration{0, 10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond} {
			l.Shape("shop", LinkParams{Delay: Duration(d)})
			rtt(1)
			p10, p50, p90, _ := rtt(30)
			b.Logf("delay %v one-way: RTT p10 %v p50 %v p90 %v (want %v)", d, p10.Round(10*time.Microsecond),
				p50.Round(10*time.Microsecond), p90.Round(10*time.Microsecond), 2*d)
			if d > 0 {
				benchfmt.Report(b, benchfmt.Figure{Name: fmt.Sprintf("linklab_rtt_p50_delay_%dms", d.Milliseconds()), Value: float64(p50) / 1e6, Unit: "ms",
					Extra: []string{fmt.Sprintf("configured_rtt_ms=%d", 2*d.Milliseconds())}})
			}
		}
		l.Shape("shop", LinkParams{Delay: Duration(50 * time.Millisecond), Jitter: Duration(20 * time.Millisecond)})
		p10, p50, p90, _ := rtt(100)
		b.Logf("delay 50ms jitter 20ms: RTT p10 %v p50 %v p90 %v (want 100-140ms, mean 120ms)", p10.Round(10*time.Microsecond),
			p50.Round(10*time.Microsecond), p90.Round(10*time.Microsecond))
		for _, loss := range []float64{0.01, 0.05, 0.2} {
			l.Shape("shop", LinkParams{Loss: loss})
			recv.Store(0)
			const n = 20000
			for i := range n {
				c.Write([]byte("x"))
				if i%10 == 9 {
					time.Sleep(time.Millisecond)
				}
			}
			time.Sleep(300 * time.Millisecond)
			b.Logf("loss %.0f%% configured: %.2f%% measured over %d packets", loss*100, 100*(1-float64(recv.Load())/n), n)
			benchfmt.Report(b, benchfmt.Figure{Name: fmt.Sprintf("linklab_loss_%.0fpct", loss*100), Value: 100 * (1 - float64(recv.Load())/n), Unit: "%",
				Extra: []string{fmt.Sprintf("configured_pct=%.0f", loss*100), fmt.Sprintf("packets=%d", n)}})
		}
		for _, rate := range []int64{256_000, 1_000_000, 10_000_000} {
			l.Shape("shop", LinkParams{Rate: rate, QueueLimit: 256 << 10})
			// Offer 1000-byte datagrams (1028 bytes on the link) at 1.3x
			// the rate and count what arrives between 1s and 3s.
			pkt := make([]byte, 1000)
			pkt[0] = 'x'
			stop := make(chan struct{})
			go func() {
				per := time.Duration(float64(time.Second) * 1028 * 8 / (1.3 * float64(rate)))
				next := time.Now()
				for {
					select {
					case <-stop:
						return
					default:
					}
					c.Write(pkt)
					next = next.Add(per)
					time.Sleep(time.Until(next))
				}
			}()
			time.Sleep(time.Second)
			r0, t0 := recv.Load(), time.Now()
			time.Sleep(2 * time.Second)
			r1, t1 := recv.Load(), time.Now()
			close(stop)
			got := float64(r1-r0) * 1028 * 8 / t1.Sub(t0).Seconds()
			b.Logf("rate %d bit/s configured: %.0f bit/s measured (%.1f%%)", rate, got, 100*got/float64(rate))
			benchfmt.Report(b, benchfmt.Figure{Name: fmt.Sprintf("linklab_rate_%dkbit_of_configured", rate/1000), Value: 100 * got / float64(rate), Unit: "%",
				Extra: []string{fmt.Sprintf("configured_bit_s=%d", rate)}})
			l.Shape("shop", LinkParams{})
			time.Sleep(500 * time.Millisecond)
		}
	}
}
