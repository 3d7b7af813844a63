package dataplane

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func fastKey(ip string, port uint16) feKey {
	return feKey{IP: as16(netip.MustParseAddr(ip)), Port: port, Proto: protoTCP, Scope: scopeInternal}
}

// TestFastIndexDense: a range of ClusterIPs on one port fills consecutive
// entries, so a dense Service range never collides with itself.
func TestFastIndexDense(t *testing.T) {
	const bits = 12
	seen := map[uint32]bool{}
	base := netip.MustParseAddr("10.96.0.0")
	a := base
	for range 1 << bits {
		i := fastIndex(fastKey(a.String(), 443), bits)
		if seen[i] {
			t.Fatalf("%s collides in a range of %d addresses", a, 1<<bits)
		}
		seen[i] = true
		a = a.Next()
	}
	// TCP and UDP of one port (DNS) land apart.
	tcp := fastKey("10.96.0.10", 53)
	udp := tcp
	udp.Proto = protoUDP
	if fastIndex(tcp, bits) == fastIndex(udp, bits) {
		t.Fatal("53/TCP and 53/UDP of one address share an entry")
	}
}

// TestFastTableChoices follows the lines of keys that share their first
// line: they take its other choices, then spill to lb_frontends; a line a
// key leaves goes to a key that spilled, else to the key furthest on, and
// lines keep FAST_SPILL while a key that passed over them sits further on.
func TestFastTableChoices(t *testing.T) {
	const bits = 10
	// Keys with the same first line: the same address, ports whose
	// Fibonacci hashes differ by a multiple of the table size are rare,
	// so search for them.
	first := fastKey("10.96.0.1", 80)
	idx := fastIndex(first, bits)
	keys := []feKey{first}
	for p := uint16(81); len(keys) < fastChoices+1; p++ {
		if k := fastKey("10.96.0.1", p); fastIndex(k, bits) == idx {
			keys = append(keys, k)
		}
	}
	fes := map[feKey]*feState{}
	for i, k := range keys {
		id := uint32(i + 1)
		fes[k] = &feState{id: id, val: lbFeVal{Id: id, Count: 1},
			bes: []beEntry{{key: beKey{IP: as16(netip.MustParseAddr("10.1.0.1")), Port: 8080}, id: id}}}
	}
	lines := [fastChoices]uint32{}
	for n := range lines {
		lines[n] = fastChoice(idx, n, bits)
	}
	tab := newFastTable(bits)
	written := map[uint32]lbFeFast{}
	commit := func() batch {
		t.Helper()
		var b batch
		tab.flush(fes, &b)
		for i, k := range b.fastKeys {
			written[k] = b.fastVals[i]
		}
		return b
	}
	expect := func(n int, key *feKey, spill bool) {
		t.Helper()
		e := written[lines[n]]
		if key == nil {
			if e.Val.State&fastUsed != 0 {
				t.Fatalf("choice %d holds %v, want no key", n, fromFeKey(e.Key))
			}
		} else if e.Val.State&fastUsed == 0 || fromFeKey(e.Key) != *key || e.Val.Id != fes[*key].id {
			t.Fatalf("choice %d: %+v, want key %v", n, e, *key)
		}
		if got := e.Val.State&fastSpill != 0; got != spill {
			t.Fatalf("choice %d: spill %v, want %v", n, got, spill)
		}
	}
	for _, k := range keys {
		tab.add(k)
	}
	if b := commit(); b.fastGen {
		t.Fatal("adding keys moved none, yet the writes are bracketed")
	}
	expect(0, &keys[0], true)
	expect(1, &keys[1], true)
	expect(2, &keys[2], true)
	if written[lines[0]].Val.Flags&feInline == 0 || written[lines[0]].BePort != htons(8080) {
		t.Fatalf("backends not inline: %+v", written[lines[0]])
	}
	if r, s := tab.stats(); r != [fastChoices]int{1, 1, 1} || s != 1 {
		t.Fatalf("stats %v/%d", r, s)
	}
	// The second leaves: the key in lb_frontends only moves in, and the
	// third choice no longer has a key beyond it.
	tab.remove(keys[1])
	delete(fes, keys[1])
	if b := commit(); !b.fastGen {
		t.Fatal("a key moved without lb_fe_gen around the writes")
	}
	expect(0, &keys[0], true)
	expect(1, &keys[3], true)
	expect(2, &keys[2], false)
	if r, s := tab.stats(); r != [fastChoices]int{1, 1, 1} || s != 0 {
		t.Fatalf("stats %v/%d", r, s)
	}
	// The first leaves: nobody is in lb_frontends only, so the key that
	// sits furthest on moves in, and its line stays free: nobody passed
	// over it.
	tab.remove(keys[0])
	delete(fes, keys[0])
	if b := commit(); !b.fastGen {
		t.Fatal("a key moved without lb_fe_gen around the writes")
	}
	expect(0, &keys[2], true)
	expect(1, &keys[3], false)
	expect(2, nil, false)
	if r, s := tab.stats(); r != [fastChoices]int{1, 1, 0} || s != 0 {
		t.Fatalf("stats %v/%d", r, s)
	}
	for _, k := range []feKey{keys[2], keys[3]} {
		tab.remove(k)
		delete(fes, k)
	}
	commit()
	for n := range lines {
		if e := written[lines[n]]; e != (lbFeFast{}) {
			t.Fatalf("choice %d after all left: %+v", n, e)
		}
	}
	if len(tab.lines) != 0 || len(tab.pos) != 0 {
		t.Fatalf("left: lines %v, keys %v", tab.lines, tab.pos)
	}
}

// TestFastInline: backends are copied into the entry only when the socket
// hooks can use them from there.
func TestFastInline(t *testing.T) {
	be := func(ip string) beEntry {
		return beEntry{key: beKey{IP: as16(netip.MustParseAddr(ip)), Port: 8080}, id: 7}
	}
	for _, c := range []struct {
		name string
		st   feState
		want bool
	}{
		{"ipv4", feState{val: lbFeVal{Count: 3}, bes: []beEntry{be("10.1.0.1"), be("10.1.0.2"), be("10.1.200.3")}}, true},
		{"none", feState{val: lbFeVal{Count: 0}}, false},
		{"affinity", feState{val: lbFeVal{Count: 1, Flags: feAffinity}, bes: []beEntry{be("10.1.0.1")}}, false},
		{"ipv6", feState{val: lbFeVal{Count: 1}, bes: []beEntry{be("fd00::1")}}, false},
		{"too many", feState{val: lbFeVal{Count: fastInline + 1}, bes: make([]beEntry, fastInline+1)}, false},
		{"two /16s", feState{val: lbFeVal{Count: 2}, bes: []beEntry{be("10.1.0.1"), be("10.2.0.1")}}, false},
		{"two ports", feState{val: lbFeVal{Count: 2}, bes: []beEntry{be("10.1.0.1"),
			{key: beKey{IP: as16(netip.MustParseAddr("10.1.0.2")), Port: 8081}, id: 7}}}, false},
	} {
		var v lbFeFast
		v.Val = c.st.val
		inlineBackends(&c.st, &v)
		if got := v.Val.Flags&feInline != 0; got != c.want {
			t.Errorf("%s: inline %v, want %v", c.name, got, c.want)
		}
		if !c.want {
			continue
		}
		// What fast_be_ip reads back: the halves in map byte order.
		for i, e := range c.st.bes {
			w := uint32(v.BeHi) | uint32(v.BeLo[i])<<16
			if want := toLbAddr(e.key.IP).W[3]; w != want || v.BePort != htons(e.key.Port) {
				t.Errorf("%s: backend %d reads as %#x:%d, want %#x:%d", c.name, i, w, v.BePort, want, htons(e.key.Port))
			}
		}
	}
}

// TestFastTableChurn adds and removes random keys in a small table, as
// Services come and go, and checks after every step what readers rely on
// and what keeps the table fast: a key sits in the line of its position
// and every line before it holds another key and says that keys spilled
// past it; no line is free while a key passed over it; and every line
// whose contents changed since the last write is written.
func TestFastTableChurn(t *testing.T) {
	const bits = 10
	rng := rand.New(rand.NewPCG(3, 4))
	tab := newFastTable(bits)
	mirror := map[uint32]fastLine{} // what the last commit wrote
	var live []feKey
	for step := range 20000 {
		// Hover around three quarters full, where all choices are in use.
		if len(live) < 3<<bits/4 && rng.IntN(2) == 0 || len(live) == 0 {
			k := fastKey(netip.AddrFrom4([4]byte{10, 96, byte(rng.IntN(16)), byte(rng.IntN(256))}).String(), uint16(80+rng.IntN(4)))
			if _, ok := tab.pos[k]; ok {
				continue
			}
			tab.add(k)
			live = append(live, k)
		} else {
			j := rng.IntN(len(live))
			tab.remove(live[j])
			live = slices.Delete(live, j, j+1)
		}
		for i := range tab.dirty {
			if l := tab.lines[i]; l != nil {
				mirror[i] = fastLine{resident: l.resident, used: l.used, passed: slices.Clone(l.passed)}
			} else {
				delete(mirror, i)
			}
		}
		tab.dirty = map[uint32]bool{}
		for i, l := range tab.lines {
			if !l.used && len(l.passed) == 0 {
				t.Fatalf("step %d: line %d kept with nothing in it", step, i)
			}
			if !l.used && len(l.passed) > 0 {
				t.Fatalf("step %d: line %d free while %d keys passed over it", step, i, len(l.passed))
			}
			m := mirror[i]
			if m.used != l.used || m.resident != l.resident || len(m.passed) > 0 != (len(l.passed) > 0) {
				t.Fatalf("step %d: line %d changed but was not written", step, i)
			}
		}
		for _, k := range live {
			p := tab.pos[k]
			cs := tab.choices(k)
			end := p
			if p < 0 {
				end = fastChoices
			} else if l := tab.lines[cs[p]]; l == nil || !l.used || l.resident != k {
				t.Fatalf("step %d: %v not in line %d of its position %d", step, k, cs[p], p)
			}
			for n := range end {
				l := tab.lines[cs[n]]
				if l == nil || !l.used || l.resident == k || !slices.Contains(l.passed, k) {
					t.Fatalf("step %d: %v sits at %d but its choice %d is not a taken line that lists it", step, k, p, n)
				}
			}
		}
	}
}
