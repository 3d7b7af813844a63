package watchq

import (
	"iter"

	"github.com/tether-edge/tether/store"
)

// Member is a store's watcher: a *Watcher, or a store's type that embeds
// one and may decline more events in its own Push before calling the
// Watcher's.
type Member interface {
	comparable
	// Push queues one event; see Watcher.Push.
	Push(ev *store.Event) bool
	watcher() *Watcher
}

func (w *Watcher) watcher() *Watcher { return w }

// Set holds the watchers of a store and fans its events out to them. It is
// not safe for concurrent use: the store guards it with its lock.
type Set[W Member] struct {
	all       map[W]struct{}       // every watcher
	unindexed map[W]struct{}       // watchers that see every event of their resource
	routes    map[string]routes[W] // by resource: watchers routed by a field's value
}

// routes holds the watchers of one resource that have an index.
type routes[W Member] map[string]map[string]map[W]struct{} // field → value → watchers

// NewSet returns an empty set.
func NewSet[W Member]() *Set[W] {
	return &Set[W]{
		all:       map[W]struct{}{},
		unindexed: map[W]struct{}{},
		routes:    map[string]routes[W]{},
	}
}

// All yields every watcher of the set; the loop may remove them.
func (s *Set[W]) All() iter.Seq[W] {
	return func(yield func(W) bool) {
		for w := range s.all {
			if !yield(w) {
				return
			}
		}
	}
}

// Add puts w in the set.
func (s *Set[W]) Add(w W) {
	s.all[w] = struct{}{}
	c := w.watcher()
	if c.index == "" {
		s.unindexed[w] = struct{}{}
		return
	}
	r := s.routes[c.opts.Resource]
	if r == nil {
		r = routes[W]{}
		s.routes[c.opts.Resource] = r
	}
	byValue := r[c.index]
	if byValue == nil {
		byValue = map[string]map[W]struct{}{}
		r[c.index] = byValue
	}
	set := byValue[c.value]
	if set == nil {
		set = map[W]struct{}{}
		byValue[c.value] = set
	}
	set[w] = struct{}{}
}

// Remove takes w out of the set, if it is in it.
func (s *Set[W]) Remove(w W) {
	if _, ok := s.all[w]; !ok {
		return
	}
	delete(s.all, w)
	c := w.watcher()
	if c.index == "" {
		delete(s.unindexed, w)
		return
	}
	r := s.routes[c.opts.Resource]
	set := r[c.index][c.value]
	delete(set, w)
	if len(set) == 0 {
		delete(r[c.index], c.value)
		if len(r[c.index]) == 0 {
			delete(r, c.index)
			if len(r) == 0 {
				delete(s.routes, c.opts.Resource)
			}
		}
	}
}

// Publish pushes a committed event to the watchers that may want it, and
// removes those that overflowed.
func (s *Set[W]) Publish(ev *store.Event) {
	for w := range s.unindexed {
		if !w.Push(ev) {
			s.Remove(w)
		}
	}
	for field, byValue := range s.routes[ev.Object.Key.Resource] {
		v := ev.Object.Fields[field]
		for w := range byValue[v] {
			if !w.Push(ev) {
				s.Remove(w)
			}
		}
		// An object that leaves a watch's selection is still its event.
		if ev.Prev != nil {
			if pv := ev.Prev.Fields[field]; pv != v {
				for w := range byValue[pv] {
					if !w.Push(ev) {
						s.Remove(w)
					}
				}
			}
		}
	}
}
