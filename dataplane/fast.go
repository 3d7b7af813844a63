package dataplane

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Values mirrored from bpf/lb.h.
const (
	fastUsed   uint8 = 0x01
	fastSpill  uint8 = 0x02
	fastInline       = 10
)

// fastIndex is fe_fast_index of bpf/lb.h: the line of lb_fe_fast that key k
// belongs to in a table of 1<<bits lines.
func fastIndex(k feKey, bits uint32) uint32 {
	b := k.IP.As16()
	w := toLbAddr(k.IP)
	x := binary.BigEndian.Uint32(b[12:])
	y := (w.W[0] ^ w.W[1] ^ w.W[2]) + (uint32(k.Port)<<8 | uint32(k.Proto))
	return (x + (y*0x9e3779b1)>>(32-bits)) & (1<<bits - 1)
}

// fastTable mirrors lb_fe_fast, the frontend table the socket hooks read
// before lb_frontends (see bpf/lb.h). Each line holds at most one key (the
// first that came); keys of an index that is taken spill: they are found in
// lb_frontends only, and their line carries FAST_SPILL so that readers look
// there. Only socket-scope frontends are in it.
type fastTable struct {
	bits  uint32
	lines map[uint32]*fastLine // lines in use
	dirty map[uint32]bool      // lines to write with the next commit
	// clear asks the next commit to empty every line it does not write:
	// after rebuild, whatever the table held before is stale.
	clear bool
}

type fastLine struct {
	resident feKey
	used     bool
	spilled  []feKey
}

func newFastTable(bits uint32) fastTable {
	return fastTable{bits: bits, lines: map[uint32]*fastLine{}, dirty: map[uint32]bool{}}
}

// add places a new frontend.
func (t *fastTable) add(k feKey) {
	i := fastIndex(k, t.bits)
	l := t.lines[i]
	if l == nil {
		l = &fastLine{}
		t.lines[i] = l
	}
	if l.used {
		l.spilled = append(l.spilled, k)
	} else {
		l.resident, l.used = k, true
	}
	t.dirty[i] = true
}

// changed notes that the value of frontend k changed.
func (t *fastTable) changed(k feKey) {
	i := fastIndex(k, t.bits)
	if l := t.lines[i]; l != nil && l.used && l.resident == k {
		t.dirty[i] = true
	}
}

// remove takes frontend k out; a spilled key of its line moves in.
func (t *fastTable) remove(k feKey) {
	i := fastIndex(k, t.bits)
	l := t.lines[i]
	if l == nil {
		return
	}
	if l.used && l.resident == k {
		l.used = false
		if len(l.spilled) > 0 {
			l.resident, l.used = l.spilled[0], true
			l.spilled = slices.Delete(l.spilled, 0, 1)
		}
	} else if j := slices.Index(l.spilled, k); j >= 0 {
		l.spilled = slices.Delete(l.spilled, j, j+1)
	} else {
		return
	}
	if !l.used && len(l.spilled) == 0 {
		delete(t.lines, i)
	}
	t.dirty[i] = true
}

// rebuild places every socket-scope frontend of fes anew, so that the next
// commit writes their lines and empties all others.
func (t *fastTable) rebuild(fes map[feKey]*feState) {
	t.lines = map[uint32]*fastLine{}
	keys := make([]feKey, 0, len(fes))
	for k := range fes {
		if k.Scope == scopeInternal {
			keys = append(keys, k)
		}
	}
	// In frontend id order: which key of a shared index holds the line
	// then does not depend on map iteration.
	slices.SortFunc(keys, func(a, b feKey) int { return int(int64(fes[a].id) - int64(fes[b].id)) })
	t.dirty = map[uint32]bool{}
	for _, k := range keys {
		t.add(k)
	}
	t.clear = true
}

// flush adds the writes of the dirty lines to b, values as in fes.
func (t *fastTable) flush(fes map[feKey]*feState, b *batch) {
	b.fastClear = b.fastClear || t.clear
	t.clear = false
	if len(t.dirty) == 0 {
		return
	}
	idx := make([]uint32, 0, len(t.dirty))
	for i := range t.dirty {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	for _, i := range idx {
		var v lbFeFast
		if l := t.lines[i]; l != nil {
			if l.used {
				if st := fes[l.resident]; st != nil {
					v.State = fastUsed
					v.Key = toFeKey(l.resident)
					v.Val = st.val
					inlineBackends(st, &v)
				}
			}
			if len(l.spilled) > 0 {
				v.State |= fastSpill
			}
		}
		b.fastKeys = append(b.fastKeys, i)
		b.fastVals = append(b.fastVals, v)
	}
	t.dirty = map[uint32]bool{}
}

// inlineBackends copies the backends of st into its fast entry v when they
// fit: at most fastInline, all IPv4, no session affinity (which needs the
// backend ids of lb_slots).
func inlineBackends(st *feState, v *lbFeFast) {
	n := len(st.bes)
	if n == 0 || n > fastInline || st.broken || int(st.val.Count) != n || st.val.Flags&feAffinity != 0 {
		return
	}
	for _, e := range st.bes {
		if !e.key.IP.Is4In6() {
			return
		}
	}
	for i, e := range st.bes {
		v.Be[i] = lbBe4{Ip: toLbAddr(e.key.IP).W[3], Port: htons(e.key.Port)}
	}
	v.Val.Flags |= feInline
}

// stats reports how many socket-scope frontends the table serves from
// their line and how many spilled to lb_frontends.
func (t *fastTable) stats() (resident, spilled int) {
	for _, l := range t.lines {
		if l.used {
			resident++
		}
		spilled += len(l.spilled)
	}
	return resident, spilled
}

// fastMem is lb_fe_fast mapped into the agent, which writes its lines in
// place under their sequence counts (see bpf/lb.h): the count is made odd
// with an atomic swap (a full fence, so no write of the line becomes
// visible before it), the line is copied, and a release store makes the
// count even again. Programs that read a line around a write see the count
// odd or changed and take the frontend from lb_frontends. There is one
// writer, the reconciler.
//
// The table is mapped only while a batch writes it (see mapped): the
// kernel maps all of its pages at once, and megabytes of table kept mapped
// would count in the agent's resident memory for nothing between changes.
type fastMem struct {
	m    *ebpf.Map
	size int
	mem  []byte // while mapped
}

const fastLineSize = int(unsafe.Sizeof(lbFeFast{}))

// mapFast prepares m, an mmapable lb_fe_fast, for writes, and checks once
// that it can be mapped.
func mapFast(m *ebpf.Map) (*fastMem, error) {
	if int(m.ValueSize()) != fastLineSize {
		return nil, fmt.Errorf("map lb_fe_fast: value size %d, want %d", m.ValueSize(), fastLineSize)
	}
	size := int(m.MaxEntries()) * fastLineSize
	page := unix.Getpagesize()
	f := &fastMem{m: m, size: (size + page - 1) / page * page}
	return f, f.mapped(func() error { return nil })
}

// mapped runs fn with the table mapped.
func (f *fastMem) mapped(fn func() error) error {
	if f.mem != nil {
		return fn()
	}
	mem, err := unix.Mmap(f.m.FD(), 0, f.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map lb_fe_fast into memory: %w", err)
	}
	f.mem = mem
	defer func() {
		_ = unix.Munmap(mem)
		f.mem = nil
	}()
	return fn()
}

// write stores vals at lines idx; the table must be mapped.
func (f *fastMem) write(idx []uint32, vals []lbFeFast) error {
	for i, n := range idx {
		if err := f.writeLine(n, &vals[i]); err != nil {
			return err
		}
	}
	return nil
}

// writeLine stores v at line n.
func (f *fastMem) writeLine(n uint32, v *lbFeFast) error {
	off := int(n) * fastLineSize
	if off < 0 || off+fastLineSize > len(f.mem) {
		return fmt.Errorf("write lb_fe_fast: line %d out of range", n)
	}
	line := f.mem[off : off+fastLineSize : off+fastLineSize]
	seq := (*uint32)(unsafe.Pointer(&line[0]))
	src := unsafe.Slice((*byte)(unsafe.Pointer(v)), fastLineSize)
	cur := atomic.LoadUint32(seq)
	if cur&1 == 0 && bytes.Equal(line[4:], src[4:]) {
		// Unchanged (most lines when an agent restarts, or when a new
		// table's empty lines are written): readers are left alone.
		return nil
	}
	// A count left odd by an agent that died mid-write stays odd.
	s := cur | 1
	atomic.SwapUint32(seq, s)
	copy(line[4:], src[4:])
	atomic.StoreUint32(seq, s+1)
	return nil
}

// clearExcept empties every line but those in keep (sorted), leaving lines
// that are empty already alone; the table must be mapped.
func (f *fastMem) clearExcept(keep []uint32) {
	var empty lbFeFast
	n := uint32(len(f.mem) / fastLineSize)
	for i, k := uint32(0), 0; i < n; i++ {
		for k < len(keep) && keep[k] < i {
			k++
		}
		if k < len(keep) && keep[k] == i {
			continue
		}
		// writeLine skips lines that are empty already.
		f.writeLine(i, &empty)
	}
}

// close lets the table go; it is mapped only while written.
func (f *fastMem) close() error { return nil }
