package tunnel

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
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
