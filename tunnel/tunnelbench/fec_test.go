package tunnelbench

import (
	"fmt"
	"testing"
	"time"

	"github.com/tether-edge/tether/testbench"
	"github.com/tether-edge/tether/tunnel"
)

// TestParityOnThinLink (B3, the other side): a thin link whose only losses
// are its own queue overflowing. Parity there would be traffic the link has
// no room for, so the tunnel must not turn it on, and its goodput must be
// what it is without forward error correction. TCP cubic through the same
// link for reference.
func TestParityOnThinLink(t *testing.T) {
	link := testbench.LinkParams{Delay: testbench.Duration(25 * time.Millisecond), Rate: 4_000_000, QueueLimit: 32 << 10}
	r := newRig(t, link, tunnel.ServerConfig{})
	d := 6 * time.Second
	if *full {
		d = 30 * time.Second
	}
	dropped := func(f func()) string {
		before := r.lab.Stats().Links[site].Up
		f()
		after := r.lab.Stats().Links[site].Up
		pk, dr := after.Packets-before.Packets, after.Dropped-before.Dropped
		return fmt.Sprintf("%.2f%% of %d packets dropped by the queue", 100*float64(dr)/float64(max(pk, 1)), pk)
	}
	withFEC := r.client(node, nil)
	withoutFEC := r.client("edge-n2", func(c *tunnel.ClientConfig) { c.DisableFEC = true })
	for _, loss := range []float64{0, 0.01} {
		l := link
		l.Loss = loss
		if err := r.lab.Shape(site, l); err != nil {
			t.Fatal(err)
		}
		var (
			on, off, tcp float64
			parity       tunnel.FECStats
		)
		dOn := dropped(func() { on, parity = r.tunnelUpload(withFEC, d) })
		dOff := dropped(func() { off, _ = r.tunnelUpload(withoutFEC, d) })
		dTCP := dropped(func() { tcp = r.tlsUpload("cubic", d) })
		t.Logf("thin link: 4 Mbit/s, RTT 50 ms, 32 KiB queue, %.0f%% random loss each way, %v per run", loss*100, d)
		t.Logf("  tunnel with FEC:    %5.2f Mbit/s, %d parity packets for %d sent in groups (%s)", on, parity.ParityPackets, parity.Protected, dOn)
		t.Logf("  tunnel without FEC: %5.2f Mbit/s (%s)", off, dOff)
		t.Logf("  TCP+TLS cubic:      %5.2f Mbit/s (%s)", tcp, dTCP)
		t.Logf("  with / without FEC: %.2fx", on/off)
		// Parity on a link that loses only to its own queue would crowd
		// out data; an occasional group while the estimate settles is noise.
		if loss == 0 && parity.ParityPackets > parity.Protected/50+10 {
			t.Errorf("parity on a congested, loss-free link: %d parity packets", parity.ParityPackets)
		}
	}
}
