package dataplane

import (
	"errors"
	"slices"
)

// extent is a range of consecutive slots in lb_slots.
type extent struct {
	start, n uint32
}

// rangeAlloc hands out ranges of lb_slots, an array map: every frontend's
// backends occupy one range, so picking a backend is one array access.
//
// A range given up by a commit is not handed out again before the commit
// after next has been written. A program that read the old frontend value
// just before the switch is long done with the range by then; should one
// ever be that late, the owner id in each slot sends it back to the
// frontend map for another try instead of to a foreign backend.
type rangeAlloc struct {
	size    uint32
	next    uint32   // everything from next on has never been used
	free    []extent // sorted by start, adjacent ranges merged
	cooling []extent // given up by the last commit
}

// alloc returns the start of a free range of n slots (first fit).
func (a *rangeAlloc) alloc(n uint32) (uint32, bool) {
	for i, e := range a.free {
		if e.n < n {
			continue
		}
		if e.n == n {
			a.free = slices.Delete(a.free, i, i+1)
		} else {
			a.free[i] = extent{e.start + n, e.n - n}
		}
		return e.start, true
	}
	if a.size-a.next < n {
		return 0, false
	}
	s := a.next
	a.next += n
	return s, true
}

// put returns a range to the free list.
func (a *rangeAlloc) put(e extent) {
	if e.n == 0 {
		return
	}
	if e.start+e.n == a.next {
		a.next = e.start
		// The free range just below the new end joins the unused tail.
		if k := len(a.free); k > 0 && a.free[k-1].start+a.free[k-1].n == a.next {
			a.next = a.free[k-1].start
			a.free = a.free[:k-1]
		}
		return
	}
	i, _ := slices.BinarySearchFunc(a.free, e.start, func(x extent, s uint32) int {
		switch {
		case x.start < s:
			return -1
		case x.start > s:
			return 1
		}
		return 0
	})
	if i > 0 && a.free[i-1].start+a.free[i-1].n == e.start {
		a.free[i-1].n += e.n
		if i < len(a.free) && a.free[i-1].start+a.free[i-1].n == a.free[i].start {
			a.free[i-1].n += a.free[i].n
			a.free = slices.Delete(a.free, i, i+1)
		}
		return
	}
	if i < len(a.free) && e.start+e.n == a.free[i].start {
		a.free[i] = extent{e.start, e.n + a.free[i].n}
		return
	}
	a.free = slices.Insert(a.free, i, e)
}

// retire takes the ranges a commit gave up and frees those of the commit
// before it.
func (a *rangeAlloc) retire(gone []extent) {
	for _, e := range a.cooling {
		a.put(e)
	}
	a.cooling = slices.Clone(gone)
}

var errOverlap = errors.New("slot ranges overlap")

// reserve rebuilds the allocator from the ranges in use (adopted from the
// kernel): the gaps between them are free.
func (a *rangeAlloc) reserve(used []extent) error {
	a.free, a.cooling, a.next = nil, nil, 0
	slices.SortFunc(used, func(x, y extent) int {
		switch {
		case x.start < y.start:
			return -1
		case x.start > y.start:
			return 1
		}
		return 0
	})
	var pos uint32
	for _, e := range used {
		if e.start < pos || e.start+e.n > a.size {
			a.free, a.next = nil, 0
			return errOverlap
		}
		if e.start > pos {
			a.free = append(a.free, extent{pos, e.start - pos})
		}
		pos = e.start + e.n
	}
	a.next = pos
	return nil
}
