package dataplane

import (
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
	gen    uint8
	flags  uint8
	aff    uint32
	slots  []uint32         // backend ids of the live generation, in slot order
	bes    map[beKey]uint32 // backend → id
	beFlag map[uint32]uint8 // id → flags as written
	broken bool             // adopted with missing slots: rewrite in full
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
	beKeys   []uint32
	beVals   []lbBackend
	slotKeys []lbSlotKey
	slotVals []uint32
	feKeys   []lbFeKey
	feVals   []lbFeVal
	delFE    []lbFeKey
	delSlots []lbSlotKey
	delBE    []uint32
	freeFE   []uint32
	freeBE   []uint32
}

func (b *batch) empty() bool {
	return len(b.beKeys)+len(b.slotKeys)+len(b.feKeys)+len(b.delFE)+len(b.delSlots)+len(b.delBE) == 0
}

// kmaps are the kernel maps the reconciler writes.
type kmaps struct {
	frontends, slots, backends *ebpf.Map
	noBatch                    bool // the kernel lacks batch operations (< 5.6)
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
	case []lbSlotKey:
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

// apply writes a batch: make (backends, slots), switch (frontends), break
// (deletes).
func (k *kmaps) apply(b *batch) error {
	if err := k.put(k.backends, b.beKeys, b.beVals, len(b.beKeys)); err != nil {
		return err
	}
	if err := k.put(k.slots, b.slotKeys, b.slotVals, len(b.slotKeys)); err != nil {
		return err
	}
	if err := k.put(k.frontends, b.feKeys, b.feVals, len(b.feKeys)); err != nil {
		return err
	}
	if err := k.del(k.frontends, b.delFE, len(b.delFE)); err != nil {
		return err
	}
	if err := k.del(k.slots, b.delSlots, len(b.delSlots)); err != nil {
		return err
	}
	return k.del(k.backends, b.delBE, len(b.delBE))
}

// reconciler keeps the kernel maps equal to the desired frontends.
type reconciler struct {
	m     *kmaps
	fes   map[feKey]*feState
	feIDs idAlloc
	beIDs idAlloc
	// garbage found when adopting pinned maps, collected on first sync
	garbageSlots []lbSlotKey
	garbageBEs   []uint32
}

func newReconciler(m *kmaps) *reconciler {
	return &reconciler{m: m, fes: map[feKey]*feState{}, feIDs: newIDAlloc(), beIDs: newIDAlloc()}
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

// upsert adds to b the writes that make frontend d true.
func (r *reconciler) upsert(d desiredFE, b *batch) {
	st := r.fes[d.Key]
	fresh := st == nil
	if fresh {
		st = &feState{id: r.feIDs.alloc(), bes: map[beKey]uint32{}, beFlag: map[uint32]uint8{}}
		r.fes[d.Key] = st
	}
	newBes := make(map[beKey]uint32, len(d.Backends))
	slotIDs := make([]uint32, len(d.Backends))
	for i, be := range d.Backends {
		id, ok := st.bes[be.beKey]
		if !ok {
			id = r.beIDs.alloc()
		}
		if !ok || st.beFlag[id] != be.Flags {
			b.beKeys = append(b.beKeys, id)
			b.beVals = append(b.beVals, lbBackend{Ip: toLbAddr(be.IP), Port: htons(be.Port), Flags: be.Flags})
			st.beFlag[id] = be.Flags
		}
		newBes[be.beKey] = id
		slotIDs[i] = id
	}
	slotsChanged := fresh || st.broken || !slices.Equal(slotIDs, st.slots)
	if slotsChanged || st.flags != d.Flags || st.aff != d.AffinityTimeout {
		gen := st.gen
		if slotsChanged {
			if !fresh {
				gen ^= 1 // write the idle generation, then flip to it
			}
			for i, id := range slotIDs {
				b.slotKeys = append(b.slotKeys, lbSlotKey{Id: st.id, Slot: uint16(i), Gen: gen})
				b.slotVals = append(b.slotVals, id)
			}
			if !fresh {
				for i := range st.slots {
					b.delSlots = append(b.delSlots, lbSlotKey{Id: st.id, Slot: uint16(i), Gen: st.gen})
				}
			}
		}
		b.feKeys = append(b.feKeys, toFeKey(d.Key))
		b.feVals = append(b.feVals, lbFeVal{Id: st.id, Count: uint16(len(slotIDs)), Gen: gen, Flags: d.Flags, AffinityTimeout: d.AffinityTimeout})
		st.gen, st.flags, st.aff, st.slots, st.broken = gen, d.Flags, d.AffinityTimeout, slotIDs, false
	}
	for k, id := range st.bes {
		if _, ok := newBes[k]; !ok {
			b.delBE = append(b.delBE, id)
			b.freeBE = append(b.freeBE, id)
			delete(st.beFlag, id)
		}
	}
	st.bes = newBes
}

// remove adds to b the deletes of frontend k.
func (r *reconciler) remove(k feKey, b *batch) {
	st := r.fes[k]
	if st == nil {
		return
	}
	b.delFE = append(b.delFE, toFeKey(k))
	for i := range st.slots {
		b.delSlots = append(b.delSlots, lbSlotKey{Id: st.id, Slot: uint16(i), Gen: st.gen})
	}
	for _, id := range st.bes {
		b.delBE = append(b.delBE, id)
		b.freeBE = append(b.freeBE, id)
	}
	b.freeFE = append(b.freeFE, st.id)
	delete(r.fes, k)
}

// commit writes b and releases the ids it freed.
func (r *reconciler) commit(b *batch) error {
	if err := r.m.apply(b); err != nil {
		return err
	}
	for _, id := range b.freeBE {
		r.beIDs.free(id)
	}
	for _, id := range b.freeFE {
		r.feIDs.free(id)
	}
	return nil
}

// adopt rebuilds the reconciler's state from the maps as a previous agent
// left them. Entries that no live frontend references are remembered as
// garbage for the first sync.
func (r *reconciler) adopt() error {
	r.fes = map[feKey]*feState{}
	r.feIDs, r.beIDs = newIDAlloc(), newIDAlloc()
	r.garbageSlots, r.garbageBEs = nil, nil

	backends := map[uint32]lbBackend{}
	var bk uint32
	var bv lbBackend
	it := r.m.backends.Iterate()
	for it.Next(&bk, &bv) {
		backends[bk] = bv
		r.beIDs.take(bk)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read pinned backends: %w", err)
	}
	slotMap := map[lbSlotKey]uint32{}
	var sk lbSlotKey
	var sv uint32
	it = r.m.slots.Iterate()
	for it.Next(&sk, &sv) {
		slotMap[sk] = sv
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read pinned slots: %w", err)
	}
	var fk lbFeKey
	var fv lbFeVal
	liveSlots := map[lbSlotKey]bool{}
	liveBEs := map[uint32]bool{}
	it = r.m.frontends.Iterate()
	for it.Next(&fk, &fv) {
		st := &feState{id: fv.Id, gen: fv.Gen, flags: fv.Flags, aff: fv.AffinityTimeout,
			bes: map[beKey]uint32{}, beFlag: map[uint32]uint8{}}
		r.feIDs.take(fv.Id)
		for i := 0; i < int(fv.Count); i++ {
			key := lbSlotKey{Id: fv.Id, Slot: uint16(i), Gen: fv.Gen}
			id, ok := slotMap[key]
			be, bok := backends[id]
			if !ok || !bok {
				st.broken = true
				continue
			}
			liveSlots[key] = true
			liveBEs[id] = true
			st.slots = append(st.slots, id)
			st.bes[beKey{IP: fromLbAddr(be.Ip), Port: htons(be.Port)}] = id
			st.beFlag[id] = be.Flags
		}
		r.fes[fromFeKey(fk)] = st
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read pinned frontends: %w", err)
	}
	for k := range slotMap {
		if !liveSlots[k] {
			r.garbageSlots = append(r.garbageSlots, k)
		}
	}
	for id := range backends {
		if !liveBEs[id] {
			r.garbageBEs = append(r.garbageBEs, id)
			r.beIDs.free(id)
		}
	}
	return nil
}
