package tunnel

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
)

// Forward error correction below QUIC.
//
// The links edges live on (radio, long copper, satellite) lose packets that
// no queue dropped. QUIC's congestion controller takes every loss for
// congestion and shrinks its window, so one random loss in a hundred
// packets holds a transfer to a few Mbit/s whatever the link's capacity.
//
// fecConn is the UDP socket under a QUIC transport. For a peer whose path
// loses packets it sends, after every k QUIC packets (or after a short
// wait, whichever comes first), one parity packet: the XOR of the group's
// packets, each zero-padded to the longest. The receiver keeps copies of
// the last packets from such a peer; when a parity packet finds exactly
// one packet of its group missing, the receiver rebuilds it and hands it
// to QUIC as if it had arrived, a little late. QUIC then either never
// declares the loss or, finding the packet acknowledged after all, undoes
// the window reduction (quic-go detects spurious losses and relaxes its
// loss thresholds when they happen). Losses XOR parity cannot repair, two
// or more in a group, still reach the congestion controller: bursts of
// loss, which is what an overflowing queue produces, are still taken for
// congestion.
//
// QUIC packets travel unchanged; a packet is named by the last four bytes
// of its AEAD tag, which are as good as random. A parity packet is
//
//	0x21               type; the fixed bit (0x40) is clear, so no QUIC
//	                   version 1 packet starts like it
//	k                  one byte, the group's size (2..fecMaxK)
//	uint16 lengths     XOR of the group's packet lengths, big-endian
//	k × uint32         the group's packet names, in sending order
//	payload            XOR of the group's packets
//
// Each side sends parity only to a peer that said it decodes it: the hub in
// its welcome, the edge in a features frame on the control stream.
//
// Whether a peer gets parity, and how much, follows the loss QUIC reports
// for the connection, sampled every fecTick: parity starts when a window
// of at least fecMinSamples packets lost fecStartLoss or more while the
// round trip stayed near its minimum (no queue building: the losses are
// the link's, not congestion); more parity (smaller k) while QUIC still
// sees fecMoreLoss; less when losses come with a queue, or after
// fecRelaxAfter below fecHoldLoss, and none again below the smallest rate.
const (
	fecTypeParity = 0x21
	fecHeader     = 4
	fecMaxK       = 16
	// fecMaxDatagram is the largest datagram quic-go sends and the size
	// of its read buffer, which a parity packet must fit.
	fecMaxDatagram = 1452
	// fecMaxProtected is the largest packet a group takes: its parity must
	// fit in one datagram.
	fecMaxProtected = fecMaxDatagram - fecHeader - 4*fecMaxK
	fecMinProtected = 24 // shorter packets are not worth it, and too short to name
	fecRingSize     = 64
	fecMaxHeld      = 4                // groups a ring holds for late packets
	fecHoldPackets  = 32               // and for how many packets after their parity
	fecRxIdle       = 30 * time.Second // a receive ring unused this long is freed

	fecTick        = 500 * time.Millisecond
	fecIdleWindow  = 10 * time.Second // a window this old with too few packets is dropped
	fecMinSamples  = 200
	fecStartLoss   = 0.005                // parity starts at this loss rate
	fecMoreLoss    = 0.01                 // with parity on, losses QUIC still sees that ask for more
	fecHoldLoss    = 0.002                // and below which parity may be relaxed
	fecQueueSlack  = 5 * time.Millisecond // RTT above the minimum that is not yet a queue
	fecRelaxAfter  = 30 * time.Second
	fecMinWait     = 5 * time.Millisecond
	fecMaxWait     = 50 * time.Millisecond
	fecDefaultWait = 25 * time.Millisecond
)

// FECStats counts what forward error correction did on one socket.
type FECStats struct {
	ParityPackets  uint64 // parity packets sent
	ParityBytes    uint64 // their UDP payload bytes
	Protected      uint64 // QUIC packets sent in a group with parity
	ParityReceived uint64 // parity packets received
	ParityRxBytes  uint64 // their UDP payload bytes
	Recovered      uint64 // lost packets rebuilt from parity and handed to QUIC
	RecoveredBytes uint64 // their bytes
	Unrecoverable  uint64 // groups that arrived with two or more packets missing
}

func (s *FECStats) add(o FECStats) {
	s.ParityPackets += o.ParityPackets
	s.ParityBytes += o.ParityBytes
	s.Protected += o.Protected
	s.ParityReceived += o.ParityReceived
	s.ParityRxBytes += o.ParityRxBytes
	s.Recovered += o.Recovered
	s.RecoveredBytes += o.RecoveredBytes
	s.Unrecoverable += o.Unrecoverable
}

// fecConn wraps a UDP socket for a quic.Transport. It offers SyscallConn
// and the buffer setters, so quic-go still sets the don't-fragment bit and
// its buffer sizes, but not the batch interfaces, which would bypass it.
type fecConn struct {
	pc net.PacketConn

	mu     sync.RWMutex
	tx     map[netip.AddrPort]*fecSender // peers that get parity now
	rx     map[netip.AddrPort]*fecRing   // peers that send parity
	peers  map[netip.AddrPort]bool       // addresses of tracked connections: who may send parity
	closed bool
	done   chan struct{} // closed by Close; ends the ticker
	nTx    atomic.Int32  // len(tx), read without the lock on every write
	nRx    atomic.Int32  // len(rx), read without the lock on every read

	// A packet rebuilt while ReadFrom returned another waits here for
	// the next call; quic-go reads from one goroutine.
	late     []byte
	lateFrom net.Addr

	trackMu sync.Mutex // guards tracked and ticking
	tracked map[*quic.Conn]*fecTrack
	ticking bool
	parked  atomic.Bool // !ticking, for the write path
	writes  atomic.Uint64

	parityPackets, parityBytes, protected    atomic.Uint64
	parityRx, parityRxBytes                  atomic.Uint64
	recovered, recoveredBytes, unrecoverable atomic.Uint64
}

func newFECConn(pc net.PacketConn) *fecConn {
	return &fecConn{
		pc:      pc,
		tx:      make(map[netip.AddrPort]*fecSender),
		rx:      make(map[netip.AddrPort]*fecRing),
		peers:   make(map[netip.AddrPort]bool),
		tracked: make(map[*quic.Conn]*fecTrack),
		done:    make(chan struct{}),
	}
}

func (c *fecConn) LocalAddr() net.Addr                { return c.pc.LocalAddr() }
func (c *fecConn) SetDeadline(t time.Time) error      { return c.pc.SetDeadline(t) }
func (c *fecConn) SetReadDeadline(t time.Time) error  { return c.pc.SetReadDeadline(t) }
func (c *fecConn) SetWriteDeadline(t time.Time) error { return c.pc.SetWriteDeadline(t) }

func (c *fecConn) Close() error {
	c.mu.Lock()
	if !c.closed {
		close(c.done)
	}
	c.closed = true
	for _, s := range c.tx {
		s.stop()
	}
	c.mu.Unlock()
	return c.pc.Close()
}

// SyscallConn lets quic-go set the don't-fragment bit and read the buffer
// sizes of the socket.
func (c *fecConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.pc.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.New("tunnel: socket has no syscall.RawConn")
}

func (c *fecConn) SetReadBuffer(n int) error {
	if s, ok := c.pc.(interface{ SetReadBuffer(int) error }); ok {
		return s.SetReadBuffer(n)
	}
	return errors.New("tunnel: socket has no SetReadBuffer")
}

func (c *fecConn) SetWriteBuffer(n int) error {
	if s, ok := c.pc.(interface{ SetWriteBuffer(int) error }); ok {
		return s.SetWriteBuffer(n)
	}
	return errors.New("tunnel: socket has no SetWriteBuffer")
}

// Stats returns the socket's counters.
func (c *fecConn) Stats() FECStats {
	return FECStats{
		ParityPackets:  c.parityPackets.Load(),
		ParityBytes:    c.parityBytes.Load(),
		Protected:      c.protected.Load(),
		ParityReceived: c.parityRx.Load(),
		ParityRxBytes:  c.parityRxBytes.Load(),
		Recovered:      c.recovered.Load(),
		RecoveredBytes: c.recoveredBytes.Load(),
		Unrecoverable:  c.unrecoverable.Load(),
	}
}

func addrPortOf(a net.Addr) (netip.AddrPort, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
	default:
		return netip.AddrPort{}, false
	}
}

// fecName is a packet's name: the last four bytes of its AEAD tag.
func fecName(p []byte) uint32 { return binary.BigEndian.Uint32(p[len(p)-4:]) }

// ReadFrom reads the next QUIC packet. Parity packets are consumed here;
// a packet one rebuilds is returned in its place.
func (c *fecConn) ReadFrom(b []byte) (int, net.Addr, error) {
	if c.late != nil {
		// A packet rebuilt when the one read before it completed a group.
		n, from := copy(b, c.late), c.lateFrom
		c.late, c.lateFrom = nil, nil
		return n, from, nil
	}
	for {
		n, from, err := c.pc.ReadFrom(b)
		if err != nil {
			return n, from, err
		}
		if n > 0 && b[0] == fecTypeParity {
			c.parityRx.Add(1)
			c.parityRxBytes.Add(uint64(n))
			if p, ok := c.onParity(b[:n], from); ok {
				return copy(b, p), from, nil
			}
			continue
		}
		if c.nRx.Load() > 0 && n >= fecMinProtected {
			c.late = c.remember(b[:n], from)
			if c.late != nil {
				c.lateFrom = from
			}
		}
		return n, from, nil
	}
}

// remember keeps a copy of a packet from a peer that sends parity. A
// packet that arrives after its group's parity may let that parity
// rebuild another; that one is returned.
func (c *fecConn) remember(p []byte, from net.Addr) []byte {
	ap, ok := addrPortOf(from)
	if !ok {
		return nil
	}
	c.mu.RLock()
	r := c.rx[ap]
	c.mu.RUnlock()
	if r == nil {
		return nil
	}
	out, expired := r.add(p)
	c.unrecoverable.Add(uint64(expired))
	if out != nil {
		c.recovered.Add(1)
		c.recoveredBytes.Add(uint64(len(out)))
	}
	return out
}

// onParity handles a parity packet and returns the packet it rebuilt, if
// any.
func (c *fecConn) onParity(p []byte, from net.Addr) ([]byte, bool) {
	g, ok := parseParity(p)
	if !ok {
		return nil, false
	}
	ap, ok := addrPortOf(from)
	if !ok {
		return nil, false
	}
	now := time.Now()
	c.mu.Lock()
	r := c.rx[ap]
	if r == nil {
		// The first parity from a peer starts its ring; that group is
		// lost. Only the peers of our own connections get one, so that
		// forged parity cannot make us keep copies for arbitrary senders.
		if c.closed || !c.peers[ap] {
			c.mu.Unlock()
			return nil, false
		}
		r = &fecRing{}
		c.rx[ap] = r
		c.nRx.Store(int32(len(c.rx)))
	}
	r.lastParity = now
	c.mu.Unlock()
	if c.parked.Load() {
		c.wake() // to free the ring once the parity stops
	}
	out, res := r.rebuild(g)
	switch res {
	case fecRebuilt:
		c.recovered.Add(1)
		c.recoveredBytes.Add(uint64(len(out)))
		return out, true
	case fecTooMany:
		// Kept for a while: a late packet may still complete it.
		c.unrecoverable.Add(uint64(r.hold(g)))
	}
	return nil, false
}

// parityGroup is a parsed parity packet.
type parityGroup struct {
	names   []uint32
	lenXor  uint16
	payload []byte
}

func parseParity(p []byte) (parityGroup, bool) {
	if len(p) < fecHeader || p[0] != fecTypeParity {
		return parityGroup{}, false
	}
	k := int(p[1])
	if k < 2 || k > fecMaxK || len(p) < fecHeader+4*k+1 {
		return parityGroup{}, false
	}
	g := parityGroup{names: make([]uint32, k), lenXor: binary.BigEndian.Uint16(p[2:4])}
	for i := range k {
		g.names[i] = binary.BigEndian.Uint32(p[fecHeader+4*i:])
	}
	g.payload = p[fecHeader+4*k:]
	return g, true
}

// fecRing holds copies of the last packets from one peer.
type fecRing struct {
	mu         sync.Mutex
	names      [fecRingSize]uint32
	bufs       [fecRingSize][]byte
	next       int
	held       []heldGroup // groups missing two or more, waiting for late packets
	seen       uint64      // packets added while groups were held
	lastParity time.Time   // guarded by fecConn.mu
}

type heldGroup struct {
	g    parityGroup
	seen uint64 // fecRing.seen when it was held
}

// add keeps p. If p is one a held group was missing and the group now
// misses one packet, that packet is rebuilt and returned. expired counts
// held groups given up.
func (r *fecRing) add(p []byte) (rebuilt []byte, expired int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.next
	r.next = (r.next + 1) % fecRingSize
	name := fecName(p)
	r.names[i] = name
	r.bufs[i] = append(r.bufs[i][:0], p...)
	if len(r.held) == 0 {
		return nil, 0
	}
	r.seen++
	kept := r.held[:0]
	for _, h := range r.held {
		if rebuilt == nil && slices.Contains(h.g.names, name) {
			out, res := r.rebuildLocked(h.g)
			switch res {
			case fecRebuilt:
				rebuilt = out
				continue
			case fecTooMany:
			default:
				continue // complete after all, or does not add up
			}
		}
		if r.seen-h.seen > fecHoldPackets {
			expired++
			continue
		}
		kept = append(kept, h)
	}
	clear(r.held[len(kept):])
	r.held = kept
	return rebuilt, expired
}

// hold keeps a group with two or more packets missing until a late packet
// completes it or fecHoldPackets more arrive; it returns how many held
// groups it pushed out.
func (r *fecRing) hold(g parityGroup) (dropped int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.held) == fecMaxHeld {
		r.held = append(r.held[:0], r.held[1:]...)
		dropped = 1
	}
	g.names = slices.Clone(g.names)
	g.payload = slices.Clone(g.payload) // it lives in quic-go's read buffer
	r.held = append(r.held, heldGroup{g: g, seen: r.seen})
	return dropped
}

// find returns the kept packet named n, or nil.
func (r *fecRing) find(n uint32) []byte {
	// Newest first: a group's packets arrived just before its parity.
	for j := range fecRingSize {
		i := (r.next - 1 - j + fecRingSize) % fecRingSize
		if r.bufs[i] != nil && r.names[i] == n {
			return r.bufs[i]
		}
	}
	return nil
}

type fecResult int

const (
	fecComplete fecResult = iota // nothing was missing
	fecRebuilt                   // one packet was missing and is rebuilt
	fecTooMany                   // two or more were missing
	fecInvalid                   // the parity does not add up
)

// rebuild XORs the parity with the group's kept packets. The rebuilt packet
// is checked against its name before it is returned.
func (r *fecRing) rebuild(g parityGroup) ([]byte, fecResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rebuildLocked(g)
}

func (r *fecRing) rebuildLocked(g parityGroup) ([]byte, fecResult) {
	missing := -1
	have := make([][]byte, len(g.names))
	for i, n := range g.names {
		if have[i] = r.find(n); have[i] == nil {
			if missing >= 0 {
				return nil, fecTooMany
			}
			missing = i
		}
	}
	if missing < 0 {
		return nil, fecComplete
	}
	out := append([]byte(nil), g.payload...)
	length := g.lenXor
	for i, p := range have {
		if i == missing {
			continue
		}
		if len(p) > len(out) {
			return nil, fecInvalid
		}
		xorInto(out, p)
		length ^= uint16(len(p))
	}
	if int(length) < fecMinProtected || int(length) > len(out) {
		return nil, fecInvalid
	}
	out = out[:length]
	if fecName(out) != g.names[missing] {
		return nil, fecInvalid
	}
	// Keep it, so a later group that names it does not count it missing.
	i := r.next
	r.next = (r.next + 1) % fecRingSize
	r.names[i] = g.names[missing]
	r.bufs[i] = append(r.bufs[i][:0], out...)
	return out, fecRebuilt
}

func xorInto(dst, src []byte) {
	i := 0
	for ; i+8 <= len(src); i += 8 {
		v := binary.LittleEndian.Uint64(dst[i:]) ^ binary.LittleEndian.Uint64(src[i:])
		binary.LittleEndian.PutUint64(dst[i:], v)
	}
	for ; i < len(src); i++ {
		dst[i] ^= src[i]
	}
}

// WriteTo sends a QUIC packet and, for a peer that gets parity, adds it to
// the current group.
func (c *fecConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	n, err := c.pc.WriteTo(b, addr)
	if c.parked.Load() && c.writes.Add(1)%64 == 0 {
		c.wake()
	}
	if err != nil || c.nTx.Load() == 0 || len(b) < fecMinProtected || len(b) > fecMaxProtected {
		return n, err
	}
	ap, ok := addrPortOf(addr)
	if !ok {
		return n, err
	}
	c.mu.RLock()
	s := c.tx[ap]
	c.mu.RUnlock()
	if s != nil {
		s.add(b)
	}
	return n, err
}

// fecSender builds the groups for one peer.
type fecSender struct {
	c    *fecConn
	addr net.Addr

	mu      sync.Mutex
	k       int
	wait    time.Duration
	n       int
	started time.Time // when the group's first packet went out
	maxLen  int
	lenXor  uint16
	names   [fecMaxK]uint32
	xor     [fecMaxProtected]byte
	timer   *time.Timer
	stopped bool
}

func (s *fecSender) add(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.k < 2 {
		return
	}
	if s.n == 0 {
		s.started = time.Now()
		if s.timer == nil {
			s.timer = time.AfterFunc(s.wait, s.flush)
		} else {
			s.timer.Reset(s.wait)
		}
	}
	xorInto(s.xor[:], p)
	s.maxLen = max(s.maxLen, len(p))
	s.lenXor ^= uint16(len(p))
	s.names[s.n] = fecName(p)
	s.n++
	if s.n >= s.k {
		s.sendLocked()
	}
}

// flush sends the parity of a group the wait ran out on. A timer armed for
// an earlier group may fire for a younger one: it is armed again for the
// rest of that group's wait.
func (s *fecSender) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.n == 0 {
		return
	}
	if left := s.wait - time.Since(s.started); left > 0 {
		s.timer.Reset(left)
		return
	}
	if s.n >= 2 {
		s.sendLocked()
		return
	}
	// A group of one would be a copy of its packet: not worth sending.
	clear(s.xor[:s.maxLen])
	s.n, s.maxLen, s.lenXor = 0, 0, 0
}

func (s *fecSender) sendLocked() {
	pkt := make([]byte, 0, fecHeader+4*s.n+s.maxLen)
	pkt = append(pkt, fecTypeParity, byte(s.n))
	pkt = binary.BigEndian.AppendUint16(pkt, s.lenXor)
	for _, n := range s.names[:s.n] {
		pkt = binary.BigEndian.AppendUint32(pkt, n)
	}
	pkt = append(pkt, s.xor[:s.maxLen]...)
	if _, err := s.c.pc.WriteTo(pkt, s.addr); err == nil {
		s.c.parityPackets.Add(1)
		s.c.parityBytes.Add(uint64(len(pkt)))
		s.c.protected.Add(uint64(s.n))
	}
	clear(s.xor[:s.maxLen])
	s.n, s.maxLen, s.lenXor = 0, 0, 0
}

func (s *fecSender) set(k int, wait time.Duration) {
	s.mu.Lock()
	s.k, s.wait = k, wait
	s.mu.Unlock()
}

func (s *fecSender) stop() {
	s.mu.Lock()
	s.stopped = true
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
}

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
