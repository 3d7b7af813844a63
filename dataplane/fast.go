package dataplane

import (
	"encoding/binary"
	"fmt"
	"slices"
	"unsafe"

	"github.com/cilium/ebpf"
)

// Values mirrored from bpf/lb.h.
const (
	fastUsed   uint8 = 0x01
	fastSpill  uint8 = 0x02
	fastInline       = 10
)

// fastIndex is fe_fast_index of bpf/lb.h: the line of the fast table that key k
// belongs to in a table of 1<<bits lines.
func fastIndex(k feKey, bits uint32) uint32 {
	b := k.IP.As16()
	w := toLbAddr(k.IP)
	x := binary.BigEndian.Uint32(b[12:])
	y := (w.W[0] ^ w.W[1] ^ w.W[2]) + (uint32(k.Port)<<8 | uint32(k.Proto))
	return (x + (y*0x9e3779b1)>>(32-bits)) & (1<<bits - 1)
}

// fastChoices is FAST_CHOICES of bpf/lb.h: the lines a key may sit in.
const fastChoices = 3

// fastChoice is fast_choice of bpf/lb.c: choice n of a key whose first line
// is first, in a table of 1<<bits lines.
func fastChoice(first uint32, n int, bits uint32) uint32 {
	if n == 0 {
		return first
	}
	return (first + 1<<(bits-uint32(n))) & (1<<bits - 1)
}

// fastTable mirrors the fast frontend table (lb_fe_fast), which the socket
// hooks read before lb_frontends (see bpf/lb.h). A key sits in the first of
// its choices that was free when it came; the lines it passed over carry
// FAST_SPILL so that readers look further, and a key whose choices were all
// taken is found in lb_frontends only. A line that a key leaves goes to a
// key that passed over it, one in lb_frontends only first, so that no line
// stays free while a key looks for it first and finds it further on: the
// table does not get slower as Services come and go. Only socket-scope
// frontends are in it.
type fastTable struct {
	bits  uint32
	lines map[uint32]*fastLine // lines in use or passed over
	pos   map[feKey]int        // the choice a key sits in; -1: lb_frontends only
	dirty map[uint32]bool      // lines to write with the next commit
	// moved: a key moved to another line since the last commit, whose
	// writes are therefore bracketed by lb_fe_gen.
	moved bool
	// clear asks the next commit to empty every line it does not write:
	// after rebuild, whatever the table held before is stale.
	clear bool
}

type fastLine struct {
	resident feKey
	used     bool
	passed   []feKey // keys that have this line among their choices and sit further on
}

func newFastTable(bits uint32) fastTable {
	return fastTable{bits: bits, lines: map[uint32]*fastLine{}, pos: map[feKey]int{}, dirty: map[uint32]bool{}}
}

// choices returns the lines of key k, in the order readers try them.
func (t *fastTable) choices(k feKey) [fastChoices]uint32 {
	var cs [fastChoices]uint32
	first := fastIndex(k, t.bits)
	for n := range cs {
		cs[n] = fastChoice(first, n, t.bits)
	}
	return cs
}

func (t *fastTable) line(i uint32) *fastLine {
	l := t.lines[i]
	if l == nil {
		l = &fastLine{}
		t.lines[i] = l
	}
	return l
}

// add places a new frontend.
func (t *fastTable) add(k feKey) {
	if _, ok := t.pos[k]; ok {
		return
	}
	t.pos[k] = -1
	for n, i := range t.choices(k) {
		l := t.line(i)
		t.dirty[i] = true
		if !l.used {
			l.resident, l.used = k, true
			t.pos[k] = n
			return
		}
		l.passed = append(l.passed, k)
	}
}

// changed notes that the value of frontend k changed.
func (t *fastTable) changed(k feKey) {
	if n, ok := t.pos[k]; ok && n >= 0 {
		t.dirty[t.choices(k)[n]] = true
	}
}

// remove takes frontend k out; the line it leaves goes to a key that
// passed over it (fill).
func (t *fastTable) remove(k feKey) {
	p, ok := t.pos[k]
	if !ok {
		return
	}
	delete(t.pos, k)
	cs := t.choices(k)
	end := p
	if p < 0 {
		end = fastChoices
	}
	for n := range end {
		t.unpass(cs[n], k)
	}
	if p >= 0 {
		l := t.lines[cs[p]]
		l.resident, l.used = feKey{}, false
		t.dirty[cs[p]] = true
		t.fill(cs[p])
	}
}

// fill gives free line i to the key that passed over it and gains most: one
// in lb_frontends only, else the one that sits furthest on. The line that
// key leaves is filled in turn. Every move brings a key nearer its first
// line, so the chain ends.
func (t *fastTable) fill(i uint32) {
	for {
		l := t.lines[i]
		var k feKey
		best := -1
		for _, c := range l.passed {
			p := t.pos[c]
			if p < 0 {
				p = fastChoices
			}
			if p > best {
				k, best = c, p
			}
		}
		if best < 0 {
			t.tidy(i)
			return
		}
		cs := t.choices(k)
		q := slices.Index(cs[:], i)
		l.resident, l.used = k, true
		t.pos[k] = q
		// k no longer passes over the lines from its new one to its old.
		for n := q; n < min(best, fastChoices); n++ {
			t.unpass(cs[n], k)
		}
		t.moved = true
		if best == fastChoices {
			return
		}
		old := t.lines[cs[best]]
		old.resident, old.used = feKey{}, false
		t.dirty[cs[best]] = true
		i = cs[best]
	}
}

// unpass removes k from the keys that passed over line i.
func (t *fastTable) unpass(i uint32, k feKey) {
	l := t.lines[i]
	if l == nil {
		return
	}
	if j := slices.Index(l.passed, k); j >= 0 {
		l.passed = slices.Delete(l.passed, j, j+1)
		t.dirty[i] = true
	}
	t.tidy(i)
}

// tidy forgets line i when nothing uses it.
func (t *fastTable) tidy(i uint32) {
	if l := t.lines[i]; l != nil && !l.used && len(l.passed) == 0 {
		delete(t.lines, i)
	}
}

// rebuild places every socket-scope frontend of fes anew, so that the next
// commit writes their lines and empties all others.
func (t *fastTable) rebuild(fes map[feKey]*feState) {
	t.lines, t.pos = map[uint32]*fastLine{}, map[feKey]int{}
	keys := make([]feKey, 0, len(fes))
	for k := range fes {
		if k.Scope == scopeInternal {
			keys = append(keys, k)
		}
	}
	// In frontend id order: which key of a shared line holds it then
	// does not depend on map iteration.
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
	b.fastGen = b.fastGen || t.clear || t.moved
	t.clear, t.moved = false, false
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
					v.Key = toFeKey(l.resident)
					v.Val = st.val
					v.Val.State = fastUsed
					inlineBackends(st, &v)
				}
			}
			if len(l.passed) > 0 {
				v.Val.State |= fastSpill
			}
		}
		b.fastKeys = append(b.fastKeys, i)
		b.fastVals = append(b.fastVals, v)
	}
	t.dirty = map[uint32]bool{}
}

// inlineBackends copies the backends of st into its fast entry v when they
// fit: at most fastInline, all IPv4 on one port with the same first two
// address bytes, no session affinity (which needs the backend ids of
// lb_slots).
func inlineBackends(st *feState, v *lbFeFast) {
	n := len(st.bes)
	if n == 0 || n > fastInline || st.broken || int(st.val.Count) != n || st.val.Flags&feAffinity != 0 {
		return
	}
	first := st.bes[0].key
	hi := first.IP.As16()
	for _, e := range st.bes {
		b := e.key.IP.As16()
		if !e.key.IP.Is4In6() || e.key.Port != first.Port || b[12] != hi[12] || b[13] != hi[13] {
			return
		}
	}
	// The halves hold network-order bytes; the map stores them verbatim,
	// so read them in host (little-endian) order, as toLbAddr does.
	v.BeHi = binary.LittleEndian.Uint16(hi[12:])
	v.BePort = htons(first.Port)
	for i, e := range st.bes {
		b := e.key.IP.As16()
		v.BeLo[i] = binary.LittleEndian.Uint16(b[14:])
	}
	v.Val.Flags |= feInline
}

// stats reports how many socket-scope frontends the table serves from
// each of their choices of line and how many are in lb_frontends only.
func (t *fastTable) stats() (byChoice [fastChoices]int, spilled int) {
	for _, p := range t.pos {
		if p >= 0 {
			byChoice[p]++
		} else {
			spilled++
		}
	}
	return byChoice, spilled
}

// fastWriter writes lines of the fast table through fast_write, a program
// the agent runs with BPF_PROG_TEST_RUN (see bpf/lb.c): a map update from
// user space would copy a line in no particular order under its sequence
// count. The program rewrites
// a line only when it changes, with the count odd meanwhile; programs that
// read a line around a write see the count odd or changed and take the
// frontend from lb_frontends. There is one writer, the reconciler.
type fastWriter struct {
	prog  *ebpf.Program
	lines uint32
	buf   []byte
}

// fastRecSize is the size of struct fast_rec of bpf/lb.h: the line number,
// padding, and the line.
const (
	fastLineSize = int(unsafe.Sizeof(lbFeFast{}))
	fastRecSize  = 8 + fastLineSize
	fastRecs     = 24 // FAST_RECS
)

func newFastWriter(prog *ebpf.Program, lines uint32) *fastWriter {
	return &fastWriter{prog: prog, lines: lines, buf: make([]byte, 0, fastRecs*fastRecSize)}
}

// apply writes the fast lines of b: its lines, then, when b asks for it,
// empties all others; bracketed by lb_fe_gen when keys moved.
func (f *fastWriter) apply(b *batch) error {
	var mark lbFeFast
	if b.fastGen {
		if err := f.add(fastGenBegin, &mark); err != nil {
			return err
		}
	}
	for i, n := range b.fastKeys {
		if err := f.add(n, &b.fastVals[i]); err != nil {
			return err
		}
	}
	if b.fastClear {
		// Every line but those just written; the program leaves lines
		// that are empty already alone.
		var empty lbFeFast
		keep := b.fastKeys
		for i, k := uint32(0), 0; i < f.lines; i++ {
			for k < len(keep) && keep[k] < i {
				k++
			}
			if k < len(keep) && keep[k] == i {
				continue
			}
			if err := f.add(i, &empty); err != nil {
				return err
			}
		}
	}
	if b.fastGen {
		if err := f.add(fastGenEnd, &mark); err != nil {
			return err
		}
	}
	return f.flush()
}

// Record lines of fast_write that are no line (FAST_GEN_BEGIN/END).
const (
	fastGenBegin uint32 = 0xffffffff
	fastGenEnd   uint32 = 0xfffffffe
)

// add queues v for line n, running the program when a run is full.
func (f *fastWriter) add(n uint32, v *lbFeFast) error {
	if n >= f.lines && n != fastGenBegin && n != fastGenEnd {
		return fmt.Errorf("write fast frontend table: line %d out of range", n)
	}
	f.buf = binary.LittleEndian.AppendUint32(f.buf, n)
	f.buf = binary.LittleEndian.AppendUint32(f.buf, 0)
	f.buf = append(f.buf, unsafe.Slice((*byte)(unsafe.Pointer(v)), fastLineSize)...)
	if len(f.buf) == cap(f.buf) {
		return f.flush()
	}
	return nil
}

// flush runs the program over the queued lines.
func (f *fastWriter) flush() error {
	if len(f.buf) == 0 {
		return nil
	}
	ret, err := f.prog.Run(&ebpf.RunOptions{Data: f.buf})
	f.buf = f.buf[:0]
	if err != nil {
		return fmt.Errorf("write fast frontend table: %w", err)
	}
	if ret != xdpPass {
		return fmt.Errorf("write fast frontend table: writer returned %d", ret)
	}
	return nil
}

const xdpPass = 2
