package tunnel

import (
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// How much parity a peer gets: each connection's loss and round trip
// sampled every fecTick, and the group size k chosen from them (see
// fecConn).

// fecTrack follows one QUIC connection's loss and sets its peer's parity.
type fecTrack struct {
	conn    *quic.Conn
	decodes atomic.Bool // the peer said it decodes parity

	// Touched by track and then the ticker only.
	addr        netip.AddrPort
	sent, lost  uint64 // counters at the start of the window
	windowStart time.Time
	rttSum      time.Duration // smoothed RTTs sampled in the window
	rttN        int
	base        baseRTT
	k           int // 0: no parity
	lastLossy   time.Time
}

// track starts following conn. decodes says whether the peer is known to
// decode parity; setDecodes can change it later.
func (c *fecConn) track(conn *quic.Conn, decodes bool) *fecTrack {
	t := &fecTrack{conn: conn}
	t.decodes.Store(decodes)
	st := conn.ConnectionStats()
	t.newWindow(st, time.Now())
	t.addr, _ = addrPortOf(conn.RemoteAddr())
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.peers[t.addr] = true
	}
	c.mu.Unlock()
	if closed {
		return t
	}
	c.trackMu.Lock()
	c.tracked[conn] = t
	c.trackMu.Unlock()
	c.wake()
	return t
}

func (t *fecTrack) setDecodes(v bool) { t.decodes.Store(v) }

// tickLoop samples the tracked connections' loss and frees idle receive
// rings; it ends when no connection is left to follow, or at Close.
func (c *fecConn) tickLoop() {
	tk := time.NewTicker(fecTick)
	defer tk.Stop()
	for {
		select {
		case <-tk.C:
			if !c.tick(time.Now()) {
				return
			}
		case <-c.done:
			c.trackMu.Lock()
			c.ticking = false
			c.parked.Store(true)
			c.trackMu.Unlock()
			return
		}
	}
}

func (c *fecConn) tick(now time.Time) (more bool) {
	c.trackMu.Lock()
	ts := make([]*fecTrack, 0, len(c.tracked))
	for conn, t := range c.tracked {
		if conn.Context().Err() != nil {
			delete(c.tracked, conn)
			c.mu.Lock()
			c.setLocked(t, 0, 0)
			c.mu.Unlock()
			continue
		}
		ts = append(ts, t)
	}
	c.trackMu.Unlock()

	busy := false
	peers := make(map[netip.AddrPort]bool, len(ts))
	for _, t := range ts {
		if c.sample(t, now) {
			busy = true
		}
		peers[t.addr] = true
	}
	c.mu.Lock()
	c.peers = peers
	for ap, r := range c.rx {
		if !peers[ap] || now.Sub(r.lastParity) > fecRxIdle {
			delete(c.rx, ap)
		}
	}
	c.nRx.Store(int32(len(c.rx)))
	busy = busy || len(c.rx) > 0
	closed := c.closed
	c.mu.Unlock()

	// An idle connection is not sampled: the ticker parks, and the next
	// burst of writes (or parity from the peer) wakes it.
	c.trackMu.Lock()
	defer c.trackMu.Unlock()
	if closed || !busy {
		c.ticking = false
		c.parked.Store(true)
		return false
	}
	return true
}

// wake restarts a parked ticker.
func (c *fecConn) wake() {
	c.trackMu.Lock()
	defer c.trackMu.Unlock()
	if c.ticking || len(c.tracked) == 0 {
		return
	}
	c.ticking = true
	c.parked.Store(false)
	go c.tickLoop()
}

// sample applies one connection's loss over its last window to its peer's
// parity, and says whether the connection is busy enough to keep sampling.
// Only the ticker calls it.
func (c *fecConn) sample(t *fecTrack, now time.Time) (busy bool) {
	st := t.conn.ConnectionStats()
	wait := groupWait(st.SmoothedRTT)
	if ap, ok := addrPortOf(t.conn.RemoteAddr()); ok && ap != t.addr {
		// The peer moved (NAT rebinding): its parity follows it.
		k := t.k
		c.mu.Lock()
		c.setLocked(t, 0, 0)
		t.addr = ap
		c.setLocked(t, k, wait)
		c.mu.Unlock()
	}
	if !t.decodes.Load() {
		return false
	}
	t.rttSum += st.SmoothedRTT
	t.rttN++
	t.base.add(st.LatestRTT, now)
	sent := st.PacketsSent - t.sent
	if sent < fecMinSamples {
		if now.Sub(t.windowStart) > fecIdleWindow {
			// Too little traffic to judge: start a fresh window.
			t.newWindow(st, now)
			return t.k > 0
		}
		return true
	}
	// PacketsLost goes down when a packet declared lost is acknowledged
	// after all.
	var lost uint64
	if st.PacketsLost > t.lost {
		lost = st.PacketsLost - t.lost
	}
	rate := float64(lost) / float64(sent)
	queued := congested(t.rttSum/time.Duration(t.rttN), t.base.over(st.MinRTT))
	t.newWindow(st, now)
	k := nextK(t.k, rate, queued, now, &t.lastLossy)
	c.mu.Lock()
	c.setLocked(t, k, wait)
	c.mu.Unlock()
	return true
}

func (t *fecTrack) newWindow(st quic.ConnectionStats, now time.Time) {
	t.sent, t.lost, t.windowStart = st.PacketsSent, st.PacketsLost, now
	t.rttSum, t.rttN = 0, 0
}

// baseRTT is the smallest RTT sampled over the last two to four minutes.
// QUIC's own minimum is kept for the connection's life, so a path that
// got longer (a failover to another uplink) would look queued forever;
// once a whole period has been sampled, its minimum may raise QUIC's.
type baseRTT struct {
	cur, prev time.Duration // minima of the current and the previous period
	start     time.Time     // of the current period
}

const baseRTTPeriod = 2 * time.Minute

func (b *baseRTT) add(rtt time.Duration, now time.Time) {
	if rtt <= 0 {
		return
	}
	if now.Sub(b.start) > baseRTTPeriod {
		b.prev, b.cur, b.start = b.cur, 0, now
	}
	if b.cur == 0 || rtt < b.cur {
		b.cur = rtt
	}
}

// over returns the path's base RTT given QUIC's minimum.
func (b *baseRTT) over(quicMin time.Duration) time.Duration {
	if b.prev == 0 {
		return quicMin // too few samples yet: early ones may all be queued
	}
	return max(quicMin, b.get())
}

func (b *baseRTT) get() time.Duration {
	switch {
	case b.prev == 0:
		return b.cur
	case b.cur == 0:
		return b.prev
	}
	return min(b.cur, b.prev)
}

// congested says whether a window's mean smoothed RTT stood well above the
// path's minimum: a queue was building, and losses then are the queue's
// overflow rather than the link's.
func congested(mean, min time.Duration) bool {
	return min > 0 && mean-min > max(min/5, fecQueueSlack)
}

// nextK is the group size (0: no parity) after a window that lost rate of
// its packets, given the current size k and whether a queue was building;
// lastLossy is when a window last lost enough to keep the parity where it
// is. Losses to a full queue get no parity: it would be traffic the link
// has no room for, and the lost packets are the congestion signal QUIC
// needs.
func nextK(k int, rate float64, queued bool, now time.Time, lastLossy *time.Time) int {
	switch {
	case k == 0:
		if rate >= fecStartLoss && !queued {
			k, *lastLossy = startK(rate), now
		}
	case queued && rate >= fecHoldLoss:
		// Parity filled the link, or the link filled anyway: less of it.
		if k *= 2; k > fecMaxK {
			k = 0
		}
	case rate >= fecMoreLoss:
		k, *lastLossy = max(2, k/2), now // losses still get through: more parity
	case rate >= fecHoldLoss:
		*lastLossy = now
	case now.Sub(*lastLossy) > fecRelaxAfter:
		*lastLossy = now
		if k *= 2; k > fecMaxK {
			k = 0
		}
	}
	return k
}

// startK picks the group size for a raw loss rate: about one unrepairable
// loss in ten or fewer, for at most a quarter more packets.
func startK(rate float64) int {
	switch {
	case rate < 0.015:
		return 8
	case rate < 0.04:
		return 4
	default:
		return 2
	}
}

// groupWait is how long a group may wait for its k-th packet: a fraction of
// the round trip, so a rebuilt packet still arrives before QUIC gives it up.
func groupWait(rtt time.Duration) time.Duration {
	if rtt <= 0 {
		return fecDefaultWait
	}
	return min(max(rtt/2, fecMinWait), fecMaxWait)
}

// setLocked gives t's peer groups of k (0: none) with the given wait; c.mu
// must be held.
func (c *fecConn) setLocked(t *fecTrack, k int, wait time.Duration) {
	t.k = k
	s := c.tx[t.addr]
	if k == 0 || c.closed {
		if s != nil {
			s.stop()
			delete(c.tx, t.addr)
		}
	} else {
		if s == nil {
			s = &fecSender{c: c, addr: net.UDPAddrFromAddrPort(t.addr)}
			c.tx[t.addr] = s
		}
		s.set(k, wait)
	}
	c.nTx.Store(int32(len(c.tx)))
}
