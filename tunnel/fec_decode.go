package tunnel

import (
	"encoding/binary"
	"slices"
	"sync"
	"time"
)

// The receiving side of forward error correction: parity packets parsed,
// the last packets of each peer kept in a ring, and a lost packet rebuilt
// from its group's parity (see fecConn).

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
