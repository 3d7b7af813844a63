package tunnel

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// dropConn drops the QUIC packets its drop function picks by their index;
// parity always goes out.
type dropConn struct {
	net.PacketConn
	n    atomic.Int64
	drop func(i int64) bool
}

func (d *dropConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if b[0] != fecTypeParity && d.drop(d.n.Add(1)-1) {
		return len(b), nil
	}
	return d.PacketConn.WriteTo(b, addr)
}

func udpPair(t *testing.T) (a, b net.PacketConn) {
	t.Helper()
	var err error
	if a, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if b, err = net.ListenPacket("udp4", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// fakePacket is a random packet of n bytes that starts like a QUIC short
// header packet.
func fakePacket(n int) []byte {
	p := make([]byte, n)
	rand.Read(p)
	p[0] = 0x40 | p[0]&0x3f
	return p
}

// pairForParity makes snd send parity in groups of four to recvAP and rcv
// keep packets from sendAP, as two connected tunnel ends would.
func pairForParity(snd, rcv *fecConn, sendAP, recvAP netip.AddrPort) {
	snd.mu.Lock()
	snd.setLocked(&fecTrack{addr: recvAP}, 4, time.Second)
	snd.mu.Unlock()
	keepFor(rcv, sendAP)
}

// keepFor makes c keep the packets from ap, as it does once ap sent parity.
func keepFor(c *fecConn, ap netip.AddrPort) {
	c.mu.Lock()
	c.peers[ap] = true
	c.rx[ap] = &fecRing{lastParity: time.Now()}
	c.nRx.Store(int32(len(c.rx)))
	c.mu.Unlock()
}

// TestFECRebuildsLostPackets sends groups of four with parity over a path
// that drops one packet of most groups and two of some: every single loss
// comes back, byte for byte, and double losses are counted, not guessed.
func TestFECRebuildsLostPackets(t *testing.T) {
	sa, ra := udpPair(t)
	recvAP, _ := addrPortOf(ra.LocalAddr())
	sendAP, _ := addrPortOf(sa.LocalAddr())
	// Group g (packets 4g..4g+3) loses packet 4g+g%4; every tenth group
	// also loses its next packet, so it cannot be rebuilt.
	lost := func(i int64) bool {
		g := i / 4
		j := i % 4
		return j == g%4 || (g%10 == 9 && j == (g+1)%4)
	}
	drop := &dropConn{PacketConn: sa, drop: lost}
	snd := newFECConn(drop)
	rcv := newFECConn(ra)
	pairForParity(snd, rcv, sendAP, recvAP)

	const groups = 101
	sent := make([][]byte, groups*4)
	for i := range sent {
		// Lengths vary within a group, so the rebuilt length matters.
		sent[i] = fakePacket(fecMinProtected + mrand.IntN(fecMaxProtected-fecMinProtected+1))
	}
	werr := make(chan error, 1)
	go func() {
		for i, p := range sent {
			if _, err := snd.WriteTo(p, ra.LocalAddr()); err != nil {
				werr <- err
				return
			}
			if i%8 == 7 {
				time.Sleep(time.Millisecond) // within the socket buffer
			}
		}
		werr <- nil
	}()
	want := map[[32]byte]bool{}
	wantLost := 0
	for i, p := range sent {
		g := int64(i) / 4
		if !lost(int64(i)) || g%10 != 9 {
			want[sha256.Sum256(p)] = true
		} else {
			wantLost++
		}
	}
	got := map[[32]byte]bool{}
	buf := make([]byte, 2048)
	ra.SetReadDeadline(time.Now().Add(5 * time.Second))
	for len(got) < len(want) {
		n, from, err := rcv.ReadFrom(buf)
		if err != nil {
			t.Fatalf("read after %d of %d packets: %v", len(got), len(want), err)
		}
		if from.String() != sa.LocalAddr().String() {
			t.Fatalf("packet from %v", from)
		}
		h := sha256.Sum256(buf[:n])
		if !want[h] {
			t.Fatalf("received a packet that was never sent (%d bytes)", n)
		}
		got[h] = true
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	st, rs := snd.Stats(), rcv.Stats()
	if st.ParityPackets != groups || st.Protected != groups*4 {
		t.Errorf("sender: %+v, want %d parity packets covering %d", st, groups, groups*4)
	}
	// Groups missing two are held for late packets and counted once more
	// than fecHoldPackets packets arrived after them.
	wantGivenUp := 0
	for g := 9; g < groups; g += 10 {
		after := 0
		for i := int64(4 * (g + 1)); i < int64(len(sent)); i++ {
			if !lost(i) {
				after++
			}
		}
		if after > fecHoldPackets {
			wantGivenUp++
		}
	}
	if rs.Recovered != groups-groups/10 || rs.Unrecoverable != uint64(wantGivenUp) {
		t.Errorf("receiver: %+v, want %d rebuilt and %d unrecoverable", rs, groups-groups/10, wantGivenUp)
	}
	t.Logf("sent %d packets, path lost %d, rebuilt %d, lost for good %d", len(sent), int(rs.Recovered)+wantLost, rs.Recovered, wantLost)
}

// lateConn sends the packet with index late only after the next parity
// packet, and drops the packet with index lost.
type lateConn struct {
	net.PacketConn
	n          int
	late, lost int
	held       []byte
}

func (l *lateConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if b[0] == fecTypeParity {
		n, err := l.PacketConn.WriteTo(b, addr)
		if l.held != nil {
			l.PacketConn.WriteTo(l.held, addr)
			l.held = nil
		}
		return n, err
	}
	i := l.n
	l.n++
	switch i {
	case l.lost:
		return len(b), nil
	case l.late:
		l.held = append([]byte(nil), b...)
		return len(b), nil
	}
	return l.PacketConn.WriteTo(b, addr)
}

// TestFECLatePacketCompletesGroup: a group loses one packet and another
// arrives after the parity (reordered). The parity finds two missing and
// waits; the late packet makes the loss repairable.
func TestFECLatePacketCompletesGroup(t *testing.T) {
	sa, ra := udpPair(t)
	recvAP, _ := addrPortOf(ra.LocalAddr())
	sendAP, _ := addrPortOf(sa.LocalAddr())
	snd := newFECConn(&lateConn{PacketConn: sa, late: 2, lost: 1})
	rcv := newFECConn(ra)
	pairForParity(snd, rcv, sendAP, recvAP)
	sent := make([][]byte, 4)
	for i := range sent {
		sent[i] = fakePacket(100 + 10*i)
		snd.WriteTo(sent[i], ra.LocalAddr())
	}
	buf := make([]byte, 2048)
	ra.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got [][]byte
	for len(got) < 4 {
		n, _, err := rcv.ReadFrom(buf)
		if err != nil {
			t.Fatalf("after %d packets: %v", len(got), err)
		}
		got = append(got, append([]byte(nil), buf[:n]...))
	}
	// Order on arrival: 0, 3, (parity), 2 late, then 1 rebuilt.
	for i, want := range []int{0, 3, 2, 1} {
		if !bytes.Equal(got[i], sent[want]) {
			t.Fatalf("packet %d read is not packet %d", i, want)
		}
	}
	if st := rcv.Stats(); st.Recovered != 1 || st.Unrecoverable != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestFECIgnoresStrangers checks that parity from an address without a
// connection keeps nothing, and that parity that does not add up rebuilds
// nothing.
func TestFECIgnoresStrangers(t *testing.T) {
	sa, ra := udpPair(t)
	sendAP, _ := addrPortOf(sa.LocalAddr())
	rcv := newFECConn(ra)
	p1, p2 := fakePacket(100), fakePacket(200)
	parity := func(names []uint32, lenXor uint16, payload []byte) []byte {
		b := []byte{fecTypeParity, byte(len(names)), byte(lenXor >> 8), byte(lenXor)}
		for _, n := range names {
			b = append(b, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
		}
		return append(b, payload...)
	}
	x := make([]byte, 200)
	xorInto(x, p1)
	xorInto(x, p2)
	good := parity([]uint32{fecName(p1), fecName(p2)}, 100^200, x)

	// A stranger: parity is consumed, no ring is made.
	sa.WriteTo(good, ra.LocalAddr())
	sa.WriteTo(p1, ra.LocalAddr())
	buf := make([]byte, 2048)
	ra.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, _, err := rcv.ReadFrom(buf)
	if err != nil || !bytes.Equal(buf[:n], p1) {
		t.Fatalf("read %d bytes, %v; want the data packet", n, err)
	}
	if len(rcv.rx) != 0 {
		t.Fatal("parity from a stranger made a receive ring")
	}

	// A peer, but a parity whose payload is damaged: the rebuilt packet
	// does not carry its name, so nothing is handed to QUIC.
	keepFor(rcv, sendAP)
	bad := append([]byte(nil), good...)
	bad[len(bad)-1] ^= 0xff
	sa.WriteTo(p1, ra.LocalAddr())
	sa.WriteTo(bad, ra.LocalAddr())
	sa.WriteTo(good, ra.LocalAddr())
	var got [][]byte
	for len(got) < 2 {
		n, _, err := rcv.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, append([]byte(nil), buf[:n]...))
	}
	if !bytes.Equal(got[0], p1) || !bytes.Equal(got[1], p2) {
		t.Fatalf("got packets of %d and %d bytes, want p1 then p2 rebuilt by the good parity", len(got[0]), len(got[1]))
	}
	if st := rcv.Stats(); st.Recovered != 1 {
		t.Fatalf("stats %+v, want one rebuilt packet", st)
	}
}

// lossyRelay forwards UDP between one client and a server with a one-way
// delay and random loss in both directions.
type lossyRelay struct {
	front, back net.PacketConn
	loss        atomic.Uint64 // math.Float64bits of the loss probability
	dropped     atomic.Int64
}

func newLossyRelay(t *testing.T, server string, delay time.Duration, loss float64) *lossyRelay {
	t.Helper()
	front, back := udpPair(t)
	target, err := net.ResolveUDPAddr("udp4", server)
	if err != nil {
		t.Fatal(err)
	}
	r := &lossyRelay{front: front, back: back}
	r.setLoss(loss)
	var mu sync.Mutex
	var client net.Addr
	type delayed struct {
		at time.Time
		b  []byte
		to net.Addr
	}
	forward := func(in, out net.PacketConn, to func() net.Addr, learn bool) {
		// One queue per direction keeps the packets in order.
		q := make(chan delayed, 4096)
		defer close(q)
		go func() {
			for d := range q {
				time.Sleep(time.Until(d.at))
				out.WriteTo(d.b, d.to)
			}
		}()
		rng := mrand.New(mrand.NewPCG(mrand.Uint64(), mrand.Uint64()))
		buf := make([]byte, 64<<10)
		for {
			n, from, err := in.ReadFrom(buf)
			if err != nil {
				return
			}
			if learn {
				mu.Lock()
				client = from
				mu.Unlock()
			}
			if rng.Float64() < r.lossRate() {
				r.dropped.Add(1)
				continue
			}
			dst := to()
			if dst == nil {
				continue
			}
			q <- delayed{at: time.Now().Add(delay), b: append([]byte(nil), buf[:n]...), to: dst}
		}
	}
	go forward(front, back, func() net.Addr { return target }, true)
	go forward(back, front, func() net.Addr { mu.Lock(); defer mu.Unlock(); return client }, false)
	return r
}

func (r *lossyRelay) setLoss(p float64) { r.loss.Store(uint64(p * 1e9)) }
func (r *lossyRelay) lossRate() float64 { return float64(r.loss.Load()) / 1e9 }

// TestFECOverLossyPath uploads through a path that loses 3 % of packets
// each way: the edge turns parity on by itself, the hub rebuilds lost
// packets, and the data arrives intact.
func TestFECOverLossyPath(t *testing.T) {
	// In fake time: the round trip is the path's alone, never the
	// machine's scheduling, which a loaded machine would add to it and
	// make parity look like congestion.
	fakeTime(t, func(t *testing.T) {
		n := newMemNet(20 * time.Millisecond)
		n.deep = true
		p := newPKI(t)
		h := startMemHub(t, n, p, ServerConfig{}, memHubAddr)
		c := startMemClient(t, n, p, h.addr, "n1", nil)
		waitConnected(t, c, 10*time.Second)
		n.setLoss(0.03)

		const size = 4 << 20
		data := make([]byte, size)
		rand.Read(data)
		want := sha256.Sum256(data)
		start := time.Now()
		werr := upload(c, data, 1)
		conn, err := h.srv.Listener().Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		hash := sha256.New()
		got, err := io.Copy(hash, conn)
		if err != nil {
			t.Fatalf("transfer broke after %d bytes: %v", got, err)
		}
		if err := <-werr; err != nil {
			t.Fatalf("edge side: %v", err)
		}
		took := time.Since(start)
		if [32]byte(hash.Sum(nil)) != want || got != size {
			t.Fatalf("data differs (%d bytes)", got)
		}
		cs, hs := c.Stats().FEC, h.srv.Stats().FEC
		t.Logf("4 MiB in %v at 3%% loss; edge sent %d parity packets covering %d, hub rebuilt %d (%d groups unrecoverable)",
			took.Round(time.Millisecond), cs.ParityPackets, cs.Protected, hs.Recovered, hs.Unrecoverable)
		if cs.ParityPackets == 0 || hs.Recovered == 0 {
			t.Fatalf("no forward error correction happened: edge %+v, hub %+v", cs, hs)
		}
		if hs.ParityReceived > cs.ParityPackets {
			t.Fatalf("hub counted %d parity packets, edge sent %d", hs.ParityReceived, cs.ParityPackets)
		}
	})
}

// TestFECOffOnCleanPath checks that a loss-free path gets no parity.
func TestFECOffOnCleanPath(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	relay := newLossyRelay(t, h.addr, 2*time.Millisecond, 0)
	c := startClient(t, p, relay.front.LocalAddr().String(), "n1", nil)
	waitConnected(t, c, 10*time.Second)
	data := make([]byte, 4<<20)
	done, conn := acceptUpload(t, h, c, data, 3) // long enough for a few loss samples
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The path itself loses nothing, but a slow machine can overflow a
	// socket buffer: parity is only allowed after QUIC saw losses.
	st := c.Stats().FEC
	c.mu.Lock()
	lost := c.cur.qconn.ConnectionStats().PacketsLost
	c.mu.Unlock()
	if st.ParityPackets != 0 && lost == 0 {
		t.Fatalf("a clean path got parity: %+v", st)
	}
	t.Logf("parity packets %d, QUIC packets lost %d", st.ParityPackets, lost)
}

// TestFECRateControl walks the parity through a link that turns lossy,
// worse, better and clean.
func TestFECRateControl(t *testing.T) {
	now := time.Now()
	var last time.Time
	k := 0
	step := func(rate float64, d time.Duration) int {
		now = now.Add(d)
		k = nextK(k, rate, false, now, &last)
		return k
	}
	for _, s := range []struct {
		rate  float64
		after time.Duration
		want  int
	}{
		{0, time.Second, 0},          // clean: nothing
		{0.004, time.Second, 0},      // below the start
		{0.01, time.Second, 8},       // 1 %: one parity per 8
		{0.003, time.Second, 8},      // residual loss in the hold band
		{0.012, time.Second, 4},      // losses still get through: more
		{0.015, time.Second, 2},      // and more
		{0.02, time.Second, 2},       // but never below groups of two
		{0, 20 * time.Second, 2},     // clean, not yet for long
		{0, 11 * time.Second, 4},     // clean for 31 s: less
		{0.001, 31 * time.Second, 8}, // a trickle of loss is clean enough
		{0, 31 * time.Second, 16},
		{0, 31 * time.Second, 0}, // off again
		{0.05, time.Second, 2},   // heavy loss starts at groups of two
	} {
		if got := step(s.rate, s.after); got != s.want {
			t.Fatalf("loss %.1f%% after %v: k = %d, want %d", s.rate*100, s.after, got, s.want)
		}
	}
	if startK(0.03) != 4 {
		t.Fatalf("3 %% loss starts at k = %d, want 4", startK(0.03))
	}

	// Losses that come with a queue are congestion: no parity for them,
	// and less parity when they show up with it on.
	last = time.Time{}
	if k := nextK(0, 0.03, true, now, &last); k != 0 {
		t.Fatalf("congestion loss started parity, k = %d", k)
	}
	if k := nextK(4, 0.02, true, now, &last); k != 8 {
		t.Fatalf("congestion loss with parity on: k = %d, want 8", k)
	}
	if k := nextK(16, 0.02, true, now, &last); k != 0 {
		t.Fatalf("congestion loss at the least parity: k = %d, want 0", k)
	}
	var b baseRTT
	at := time.Now()
	quicMin := 300 * time.Microsecond // before the path got longer
	b.add(quicMin, at)
	b.add(50*time.Millisecond, at.Add(time.Minute))
	if b.over(quicMin) != quicMin {
		t.Fatalf("base RTT %v", b.over(quicMin))
	}
	b.add(51*time.Millisecond, at.Add(3*time.Minute))
	b.add(52*time.Millisecond, at.Add(6*time.Minute))
	if b.over(quicMin) != 51*time.Millisecond {
		t.Fatalf("base RTT %v after the longer path settled, want 51ms", b.over(quicMin))
	}
	// Early samples of a busy connection are all queued: QUIC's minimum
	// stands until a whole period has been seen.
	var fresh baseRTT
	fresh.add(110*time.Millisecond, at)
	if fresh.over(52*time.Millisecond) != 52*time.Millisecond {
		t.Fatalf("fresh base RTT %v, want QUIC's 52ms", fresh.over(52*time.Millisecond))
	}
	if !congested(80*time.Millisecond, 50*time.Millisecond) || congested(54*time.Millisecond, 50*time.Millisecond) ||
		congested(3*time.Millisecond, time.Millisecond) || !congested(7*time.Millisecond, time.Millisecond) {
		t.Fatal("congested() misjudges")
	}
}

// FuzzParity feeds arbitrary parity packets to a receive ring holding a few
// packets: nothing may panic, and whatever is handed to QUIC must carry the
// name the parity gave it.
func FuzzParity(f *testing.F) {
	p1, p2 := fakePacket(60), fakePacket(90)
	x := make([]byte, 90)
	xorInto(x, p1)
	xorInto(x, p2)
	good := []byte{fecTypeParity, 2, 0, byte(60 ^ 90)}
	for _, n := range []uint32{fecName(p1), fecName(p2)} {
		good = append(good, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	good = append(good, x...)
	f.Add(good)
	f.Add([]byte{fecTypeParity, 16, 0xff, 0xff})
	f.Add([]byte{fecTypeParity, 2, 0, 0, 1, 2, 3, 4, 1, 2, 3, 4, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		g, ok := parseParity(b)
		if !ok {
			return
		}
		if len(g.names) < 2 || len(g.names) > fecMaxK || len(g.payload) == 0 {
			t.Fatalf("parsed a group of %d with %d payload bytes", len(g.names), len(g.payload))
		}
		r := &fecRing{}
		r.add(p1)
		out, res := r.rebuild(g)
		if res == fecRebuilt {
			if len(out) < fecMinProtected || len(out) > len(g.payload) {
				t.Fatalf("rebuilt %d bytes from a payload of %d", len(out), len(g.payload))
			}
			found := false
			for _, n := range g.names {
				found = found || fecName(out) == n
			}
			if !found {
				t.Fatal("rebuilt packet carries no name of its group")
			}
		}
	})
}
