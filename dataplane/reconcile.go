package dataplane

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// feState is the reconciler's copy of one frontend as it is in the kernel.
type feState struct {
	id     uint32
	base   uint32 // first slot of its range in lb_slots
	held   uint32 // length of the range it holds
	flags  uint8
	aff    uint32
	val    lbFeVal   // its lb_frontends value, which fast lines copy
	bes    []beEntry // the live slots in slot order, which is beKey order
	broken bool      // adopted with missing or foreign slots: rewrite in full
}

// beEntry is one backend of a frontend as written to its slot.
type beEntry struct {
	key   beKey
	id    uint32
	flags uint8
}

// find returns the entry of backend k (entries are sorted by key).
func (st *feState) find(k beKey) (beEntry, bool) {
	i, ok := slices.BinarySearchFunc(st.bes, k, func(e beEntry, k beKey) int { return compareBeKey(e.key, k) })
	if !ok {
		return beEntry{}, false
	}
	return st.bes[i], true
}

func compareBeKey(a, b beKey) int {
	if c := a.IP.Compare(b.IP); c != 0 {
		return c
	}
	return cmp.Compare(a.Port, b.Port)
}

// idAlloc hands out ids that are not reused until the 32-bit space wraps, so
// that a stale affinity entry can never point at a recycled backend id.
type idAlloc struct {
	next uint32
	used map[uint32]struct{}
}

func newIDAlloc() idAlloc { return idAlloc{next: 1, used: map[uint32]struct{}{}} }

func (a *idAlloc) take(id uint32) {
	a.used[id] = struct{}{}
	if id >= a.next {
		a.next = id + 1
	}
}

func (a *idAlloc) alloc() uint32 {
	for {
		id := a.next
		a.next++
		if id == 0 {
			continue
		}
		if _, ok := a.used[id]; !ok {
			a.used[id] = struct{}{}
			return id
		}
	}
}

func (a *idAlloc) free(id uint32) { delete(a.used, id) }

// batch collects the map writes of one reconciliation step in the order that
// keeps readers safe: new backends and slots, then frontends, then deletes.
type batch struct {
	beKeys    []uint32
	beVals    []lbBackend
	slotKeys  []uint32
	slotVals  []lbSlot
	feKeys    []lbFeKey
	feVals    []lbFeVal
	fastKeys  []uint32
	fastVals  []lbFeFast
	fastClear bool // empty the fast lines not in fastKeys
	fastGen   bool // keys move between lines: bracket the writes by lb_fe_gen
	delFE     []lbFeKey
	delBE     []uint32
	freeFE    []uint32
	freeBE    []uint32
	freeSlots []extent
}

// kmaps are the kernel maps the reconciler writes.
type kmaps struct {
	frontends, slots, backends *ebpf.Map
	fast                       *fastWriter // the fast frontend table
	noBatch                    bool        // the kernel lacks batch operations (< 5.6)
}

// batchMin is the size from which a batch syscall beats element updates.
const batchMin = 8

func (k *kmaps) put(m *ebpf.Map, keys, vals any, n int) error {
	if n == 0 {
		return nil
	}
	if n >= batchMin && !k.noBatch {
		_, err := m.BatchUpdate(keys, vals, nil)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("batch update %s: %w", mapName(m), err)
		}
		k.noBatch = true
	}
	kv, vv := sliceAt(keys), sliceAt(vals)
	for i := 0; i < n; i++ {
		if err := m.Put(kv(i), vv(i)); err != nil {
			return fmt.Errorf("update %s: %w", mapName(m), err)
		}
	}
	return nil
}

func (k *kmaps) del(m *ebpf.Map, keys any, n int) error {
	if n == 0 {
		return nil
	}
	if n >= batchMin && !k.noBatch {
		// A batch delete stops at the first missing key; fall back to
		// single deletes then, which tolerate missing keys.
		if c, err := m.BatchDelete(keys, nil); err == nil && c == n {
			return nil
		}
	}
	kv := sliceAt(keys)
	for i := 0; i < n; i++ {
		if err := m.Delete(kv(i)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from %s: %w", mapName(m), err)
		}
	}
	return nil
}

func sliceAt(s any) func(int) any {
	switch v := s.(type) {
	case []uint32:
		return func(i int) any { return &v[i] }
	case []lbBackend:
		return func(i int) any { return &v[i] }
	case []lbSlot:
		return func(i int) any { return &v[i] }
	case []lbFeKey:
		return func(i int) any { return &v[i] }
	case []lbFeVal:
		return func(i int) any { return &v[i] }
	}
	panic(fmt.Sprintf("dataplane: no element accessor for %T", s))
}

func mapName(m *ebpf.Map) string {
	if info, err := m.Info(); err == nil {
		return info.Name
	}
	return "map"
}

// apply writes a batch: make (backends, slots), switch (fast lines, then
// frontends), break (deletes). Fast lines go first so that a new frontend
// whose line is taken has FAST_SPILL set before it is in lb_frontends;
// readers never use a line while it is being written (see fastWriter).
func (k *kmaps) apply(b *batch) error {
	if err := k.put(k.backends, b.beKeys, b.beVals, len(b.beKeys)); err != nil {
		return err
	}
	if err := k.put(k.slots, b.slotKeys, b.slotVals, len(b.slotKeys)); err != nil {
		return err
	}
	if err := k.fast.apply(b); err != nil {
		return err
	}
	if err := k.put(k.frontends, b.feKeys, b.feVals, len(b.feKeys)); err != nil {
		return err
	}
	if err := k.del(k.frontends, b.delFE, len(b.delFE)); err != nil {
		return err
	}
	// Slots need no delete: a range no frontend refers to is free space.
	return k.del(k.backends, b.delBE, len(b.delBE))
}

// reconciler keeps the kernel maps equal to the desired frontends.
type reconciler struct {
	m     *kmaps
	fes   map[feKey]*feState
	fast  fastTable
	feIDs idAlloc
	beIDs idAlloc
	slots rangeAlloc
	// backends found when adopting pinned maps that no frontend with
	// affinity uses, deleted on the first sync
	garbageBEs []uint32
}

func newReconciler(m *kmaps, slotCap, fastBits uint32) *reconciler {
	return &reconciler{m: m, fes: map[feKey]*feState{}, fast: newFastTable(fastBits), feIDs: newIDAlloc(),
		beIDs: newIDAlloc(), slots: rangeAlloc{size: slotCap}}
}

// Conversions between the Go and the map forms.

func toLbAddr(a netip.Addr) lbLbAddr {
	b := a.As16()
	var out lbLbAddr
	for i := range 4 {
		// The words hold network-order bytes; the map stores them
		// verbatim, so read them in host (little-endian) order.
		out.W[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

func fromLbAddr(w lbLbAddr) netip.Addr {
	var b [16]byte
	for i := range 4 {
		binary.LittleEndian.PutUint32(b[4*i:], w.W[i])
	}
	return netip.AddrFrom16(b)
}

func htons(p uint16) uint16 { return p<<8 | p>>8 }

func toFeKey(k feKey) lbFeKey {
	return lbFeKey{Ip: toLbAddr(k.IP), Port: htons(k.Port), Proto: k.Proto, Scope: k.Scope}
}

func fromFeKey(k lbFeKey) feKey {
	return feKey{IP: fromLbAddr(k.Ip), Port: htons(k.Port), Proto: k.Proto, Scope: k.Scope}
}

// errSlotsFull means lb_slots has no free range for a frontend's backends.
var errSlotsFull = errors.New("no free range in lb_slots (raise MapSizes.Backends)")

// upsert adds to b the writes that make frontend d true. It leaves the
// frontend as it was when its backends do not fit into lb_slots.
func (r *reconciler) upsert(d desiredFE, b *batch) error {
	st := r.fes[d.Key]
	fresh := st == nil
	if fresh {
		st = &feState{}
	}
	// lb_backends holds the backends of frontends with affinity only.
	affNow := d.Flags&feAffinity != 0
	affWas := !fresh && st.flags&feAffinity != 0
	newBes := make([]beEntry, len(d.Backends))
	changed := fresh || st.broken || len(st.bes) != len(d.Backends)
	var newIDs int
	for i, be := range d.Backends {
		old, ok := st.find(be.beKey)
		e := beEntry{key: be.beKey, id: old.id, flags: be.Flags}
		if !ok {
			newIDs++
		}
		if !ok || old.flags != be.Flags || (!changed && st.bes[i].id != old.id) {
			changed = true
		}
		newBes[i] = e
	}
	var base uint32
	if changed && len(newBes) > 0 {
		var ok bool
		if base, ok = r.slots.alloc(uint32(len(newBes))); !ok {
			return errSlotsFull
		}
	} else if !changed {
		base = st.base
	}
	if fresh {
		st.id = r.feIDs.alloc()
		r.fes[d.Key] = st
	}
	if newIDs > 0 {
		for i := range newBes {
			if newBes[i].id == 0 {
				newBes[i].id = r.beIDs.alloc()
			}
		}
	}
	for _, e := range newBes {
		if !affNow {
			continue
		}
		if old, ok := st.find(e.key); !affWas || !ok || old.flags != e.flags {
			b.beKeys = append(b.beKeys, e.id)
			b.beVals = append(b.beVals, lbBackend{Ip: toLbAddr(e.key.IP), Port: htons(e.key.Port), Flags: e.flags})
		}
	}
	if changed {
		for i, e := range newBes {
			b.slotKeys = append(b.slotKeys, base+uint32(i))
			b.slotVals = append(b.slotVals, lbSlot{Ip: toLbAddr(e.key.IP), Port: htons(e.key.Port), Flags: e.flags,
				BackendId: e.id, FeId: st.id})
		}
		if st.held > 0 {
			b.freeSlots = append(b.freeSlots, extent{st.base, st.held})
		}
		st.held = uint32(len(newBes))
	}
	if changed || st.flags != d.Flags || st.aff != d.AffinityTimeout {
		st.val = lbFeVal{Id: st.id, Base: base, Count: uint16(len(newBes)), Flags: d.Flags,
			AffinityTimeout: d.AffinityTimeout}
		b.feKeys = append(b.feKeys, toFeKey(d.Key))
		b.feVals = append(b.feVals, st.val)
		if d.Key.Scope == scopeInternal {
			if fresh {
				r.fast.add(d.Key)
			} else {
				r.fast.changed(d.Key)
			}
		}
	}
	// Backends that left the frontend, or all of them when affinity was
	// switched off.
	for _, old := range st.bes {
		i, kept := slices.BinarySearchFunc(newBes, old.key, func(e beEntry, k beKey) int { return compareBeKey(e.key, k) })
		if kept && newBes[i].id == old.id {
			if affWas && !affNow {
				b.delBE = append(b.delBE, old.id)
			}
			continue
		}
		if affWas {
			b.delBE = append(b.delBE, old.id)
		}
		b.freeBE = append(b.freeBE, old.id)
	}
	st.base, st.flags, st.aff, st.bes, st.broken = base, d.Flags, d.AffinityTimeout, newBes, false
	return nil
}

// remove adds to b the deletes of frontend k.
func (r *reconciler) remove(k feKey, b *batch) {
	st := r.fes[k]
	if st == nil {
		return
	}
	b.delFE = append(b.delFE, toFeKey(k))
	if st.held > 0 {
		b.freeSlots = append(b.freeSlots, extent{st.base, st.held})
	}
	for _, e := range st.bes {
		if st.flags&feAffinity != 0 {
			b.delBE = append(b.delBE, e.id)
		}
		b.freeBE = append(b.freeBE, e.id)
	}
	b.freeFE = append(b.freeFE, st.id)
	delete(r.fes, k)
	if k.Scope == scopeInternal {
		r.fast.remove(k)
	}
}

// commit writes b, with the fast lines the batch changed, and releases the
// ids and slot ranges it freed.
func (r *reconciler) commit(b *batch) error {
	r.fast.flush(r.fes, b)
	if err := r.m.apply(b); err != nil {
		return err
	}
	for _, id := range b.freeBE {
		r.beIDs.free(id)
	}
	for _, id := range b.freeFE {
		r.feIDs.free(id)
	}
	r.slots.retire(b.freeSlots)
	return nil
}

// adopt rebuilds the reconciler's state from the maps as a previous agent
// left them. Backends that no frontend with affinity references are
// remembered as garbage for the first sync.
func (r *reconciler) adopt() error {
	r.fes = map[feKey]*feState{}
	r.feIDs, r.beIDs = newIDAlloc(), newIDAlloc()
	r.slots = rangeAlloc{size: r.slots.size}
	r.garbageBEs = nil

	var fk lbFeKey
	var fv lbFeVal
	type adopted struct {
		key feKey
		val lbFeVal
	}
	var fes []adopted
	var end uint32
	it := r.m.frontends.Iterate()
	for it.Next(&fk, &fv) {
		fes = append(fes, adopted{fromFeKey(fk), fv})
		if e := fv.Base + uint32(fv.Count); fv.Count > 0 && e > end {
			end = e
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read pinned frontends: %w", err)
	}
	slotVals, err := r.readSlots(end)
	if err != nil {
		return err
	}
	backends := map[uint32]lbBackend{}
	var bk uint32
	var bv lbBackend
	it = r.m.backends.Iterate()
	for it.Next(&bk, &bv) {
		backends[bk] = bv
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read pinned backends: %w", err)
	}
	liveBEs := map[uint32]bool{}
	var used []extent
	for _, a := range fes {
		fv := a.val
		st := &feState{id: fv.Id, base: fv.Base, flags: fv.Flags, aff: fv.AffinityTimeout, val: fv}
		r.feIDs.take(fv.Id)
		n := uint32(fv.Count)
		if fv.Base+n > uint32(len(slotVals)) || fv.Base+n < fv.Base {
			st.broken = true
			n = 0
		}
		if n > 0 {
			used = append(used, extent{fv.Base, n})
			st.held = n
		}
		for i := range n {
			s := slotVals[fv.Base+i]
			if s.FeId != fv.Id {
				st.broken = true
				continue
			}
			if fv.Flags&feAffinity != 0 {
				if _, ok := backends[s.BackendId]; !ok {
					st.broken = true
				}
				liveBEs[s.BackendId] = true
			}
			r.beIDs.take(s.BackendId)
			st.bes = append(st.bes, beEntry{key: beKey{IP: fromLbAddr(s.Ip), Port: htons(s.Port)}, id: s.BackendId, flags: s.Flags})
		}
		if !slices.IsSortedFunc(st.bes, func(a, b beEntry) int { return compareBeKey(a.key, b.key) }) {
			slices.SortFunc(st.bes, func(a, b beEntry) int { return compareBeKey(a.key, b.key) })
			st.broken = true
		}
		r.fes[a.key] = st
	}
	if err := r.slots.reserve(used); err != nil {
		// Overlapping ranges: rewrite everything into fresh ranges.
		for _, st := range r.fes {
			st.broken, st.held = true, 0
		}
		r.slots = rangeAlloc{size: r.slots.size}
		r.slots.reserve(nil)
	}
	for id := range backends {
		if !liveBEs[id] {
			r.garbageBEs = append(r.garbageBEs, id)
		}
	}
	// The fast table is derived from the frontends: the next commit
	// rewrites all of it.
	r.fast.rebuild(r.fes)
	return nil
}

// readSlotsChunk is how many slots one batch lookup reads when adopting.
const readSlotsChunk = 4096

// readSlots reads lb_slots[0:end).
func (r *reconciler) readSlots(end uint32) ([]lbSlot, error) {
	out := make([]lbSlot, 0, end)
	if end == 0 {
		return out, nil
	}
	if !r.m.noBatch {
		var cursor ebpf.MapBatchCursor
		keys := make([]uint32, readSlotsChunk)
		vals := make([]lbSlot, readSlotsChunk)
		for uint32(len(out)) < end {
			n, err := r.m.slots.BatchLookup(&cursor, keys, vals, nil)
			out = append(out, vals[:n]...)
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			}
			if errors.Is(err, ebpf.ErrNotSupported) && len(out) == 0 {
				r.m.noBatch = true
				break
			}
			if err != nil {
				return nil, fmt.Errorf("read pinned slots: %w", err)
			}
		}
		if !r.m.noBatch {
			if uint32(len(out)) > end {
				out = out[:end]
			}
			return out, nil
		}
	}
	for i := uint32(0); i < end; i++ {
		var v lbSlot
		if err := r.m.slots.Lookup(i, &v); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			}
			return nil, fmt.Errorf("read pinned slots: %w", err)
		}
		out = append(out, v)
	}
	return out, nil
}
