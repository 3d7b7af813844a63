package endpoints

import (
	"strconv"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// tracker remembers the slice writes the informer has not shown yet, so a
// sync never plans from a cache that misses its own last writes (which
// would create duplicate slices or undo an update).
type tracker struct {
	mu sync.Mutex // guards the following fields
	// by Service key: slice name → the write.
	pending map[string]map[string]write
}

// write is one slice write not yet seen in the cache.
type write struct {
	rv string // the resourceVersion written; "" for a deletion
	at time.Time
}

// trackTimeout is how long a write is waited for. A slice created and at
// once deleted by someone else never shows up; after this the cache is
// trusted again.
const trackTimeout = 10 * time.Second

func newTracker() *tracker { return &tracker{pending: map[string]map[string]write{}} }

// wrote records a create or update of a slice, as the hub returned it.
func (t *tracker) wrote(svcKey string, s *discoveryv1.EndpointSlice) {
	t.set(svcKey, s.Name, s.ResourceVersion)
}

// deleted records a deletion.
func (t *tracker) deleted(svcKey, name string) { t.set(svcKey, name, "") }

func (t *tracker) set(svcKey, name, rv string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.pending[svcKey]
	if m == nil {
		m = map[string]write{}
		t.pending[svcKey] = m
	}
	m[name] = write{rv: rv, at: time.Now()}
}

// forget drops what is known of a Service.
func (t *tracker) forget(svcKey string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.pending, svcKey)
}

// fresh says whether the cached slices of a Service include every write
// made for it; the writes they include are forgotten.
func (t *tracker) fresh(svcKey string, cached []*discoveryv1.EndpointSlice) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.pending[svcKey]
	if len(m) == 0 {
		return true
	}
	byName := make(map[string]*discoveryv1.EndpointSlice, len(cached))
	for _, s := range cached {
		byName[s.Name] = s
	}
	for name, w := range m {
		s, ok := byName[name]
		switch {
		case w.rv == "" && !ok, w.rv != "" && ok && !olderRV(s.ResourceVersion, w.rv), time.Since(w.at) > trackTimeout:
			delete(m, name)
		}
	}
	if len(m) == 0 {
		delete(t.pending, svcKey)
		return true
	}
	return false
}

// olderRV says whether resourceVersion a is older than b. The hub's are
// increasing integers; anything else compares by equality only.
func olderRV(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil {
		return a != b
	}
	return x < y
}
