// Package eventring keeps the recent events of a store in memory, so that a
// watch resuming from a recent revision starts without reading the change
// log. The SQL store backends share it.
//
// The ring is bounded twice: by a number of events and by the bytes of the
// object states they hold. An event of a large kind (a pod with its status
// and managed fields is about 5 KB, and a modification holds the states
// before and after it) costs its size, so a burst of pod changes cannot pin
// tens of thousands of old states in the hub's memory; a watch that resumes
// from further back replays the change log instead, which is slower but
// returns the same events. Events leave the ring as soon as a bound is
// passed, and their states are released then, not at the next compaction
// of the slice.
package eventring

import (
	"sort"

	"github.com/tether-edge/tether/store"
)

// Ring holds events in ascending revision order. It is not safe for
// concurrent use: the stores guard it with their own lock.
type Ring struct {
	maxEvents int
	maxBytes  int64
	events    []*store.Event // events[head:] are kept; the rest are nil
	head      int
	bytes     int64
	base      int64
}

// New returns an empty ring that covers revisions after base and keeps at
// most maxEvents events and, beyond its newest event, at most maxBytes of
// their states (see Cost).
func New(maxEvents int, maxBytes int64, base int64) *Ring {
	return &Ring{maxEvents: max(maxEvents, 1), maxBytes: maxBytes, base: base}
}

// Add records ev, newer than every event in the ring, and lets the oldest
// events go while a bound is passed. The newest event always stays.
func (r *Ring) Add(ev *store.Event) {
	r.events = append(r.events, ev)
	r.bytes += Cost(ev)
	for r.Len() > 1 && (r.Len() > r.maxEvents || r.bytes > r.maxBytes) {
		old := r.events[r.head]
		r.bytes -= Cost(old)
		r.base = old.Object.Revision
		r.events[r.head] = nil
		r.head++
	}
	// Move the kept events to the front once the dropped ones are the
	// larger part: amortized constant work per event, and the backing
	// array never grows past twice what the ring keeps.
	if r.head > 0 && r.head >= len(r.events)-r.head {
		n := copy(r.events, r.events[r.head:])
		clear(r.events[n:])
		r.events = r.events[:n]
		r.head = 0
	}
}

// Since returns the events after rev, oldest first, and true; false when
// the ring no longer covers rev (rev is older than Base). The slice is the
// ring's own: read it under the store's lock and keep none of it.
func (r *Ring) Since(rev int64) ([]*store.Event, bool) {
	if rev < r.base {
		return nil, false
	}
	kept := r.events[r.head:]
	i := sort.Search(len(kept), func(i int) bool { return kept[i].Object.Revision > rev })
	return kept[i:], true
}

// Base returns the revision the ring covers changes after.
func (r *Ring) Base() int64 { return r.base }

// Len returns the number of events kept.
func (r *Ring) Len() int { return len(r.events) - r.head }

// Bytes returns the cost of the events kept (see Cost).
func (r *Ring) Bytes() int64 { return r.bytes }

// Reset drops every event; the ring then covers revisions after base.
func (r *Ring) Reset(base int64) {
	r.events, r.head, r.bytes, r.base = nil, 0, 0, base
}

// Cost is what an event counts against the byte bound: the values, labels
// and fields of the states it holds. An event's new state may also be the
// object's current state, which the store keeps anyway; counting it all
// the same keeps the bound simple and errs on the side of memory.
func Cost(ev *store.Event) int64 {
	n := objectCost(&ev.Object)
	if ev.Prev != nil {
		n += objectCost(ev.Prev)
	}
	return n
}

func objectCost(o *store.Object) int64 {
	n := int64(len(o.Value))
	for k, v := range o.Labels {
		n += int64(len(k) + len(v))
	}
	for k, v := range o.Fields {
		n += int64(len(k) + len(v))
	}
	return n
}
