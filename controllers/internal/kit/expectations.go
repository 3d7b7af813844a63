package kit

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// DefaultExpectationsTTL is how long unmet expectations hold a controller
// back before it syncs anyway, assuming an event was lost.
const DefaultExpectationsTTL = 5 * time.Minute

// Expectations counts, per controller key, the pod (or other dependent)
// creations and deletions a controller has sent but not yet observed
// through its informer. A controller syncs a key only when its
// expectations are satisfied; otherwise its cache may not reflect its own
// writes and it would create or delete too much.
//
// Deletions are tracked by UID so that seeing the same object deleted twice
// (first its deletionTimestamp, then its removal) counts once.
type Expectations struct {
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex // guards m
	m  map[string]*expectation
}

type expectation struct {
	adds    int
	deletes map[types.UID]struct{}
	set     time.Time
}

// NewExpectations returns empty expectations; ttl <= 0 means
// [DefaultExpectationsTTL]. now may be nil for time.Now.
func NewExpectations(ttl time.Duration, now func() time.Time) *Expectations {
	if ttl <= 0 {
		ttl = DefaultExpectationsTTL
	}
	if now == nil {
		now = time.Now
	}
	return &Expectations{ttl: ttl, now: now, m: map[string]*expectation{}}
}

// ExpectCreations records that n creations for key are about to be sent.
// It replaces any earlier record for key: call it only when the earlier one
// was satisfied.
func (e *Expectations) ExpectCreations(key string, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.m[key] = &expectation{adds: n, set: e.now()}
}

// ExpectDeletions records that the objects with the given UIDs are about
// to be deleted, replacing any earlier record for key.
func (e *Expectations) ExpectDeletions(key string, uids []types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := &expectation{deletes: make(map[types.UID]struct{}, len(uids)), set: e.now()}
	for _, u := range uids {
		x.deletes[u] = struct{}{}
	}
	e.m[key] = x
}

// Expect records n creations and the deletions of uids together, for a
// sync that does both, replacing any earlier record for key.
func (e *Expectations) Expect(key string, n int, uids []types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := &expectation{adds: n, deletes: make(map[types.UID]struct{}, len(uids)), set: e.now()}
	for _, u := range uids {
		x.deletes[u] = struct{}{}
	}
	e.m[key] = x
}

// CreationObserved lowers key's expected creations by one: call it when
// the informer shows a new dependent, and when a create failed (it will
// never be observed).
func (e *Expectations) CreationObserved(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x := e.m[key]; x != nil && x.adds > 0 {
		x.adds--
	}
}

// DeletionObserved marks uid's deletion as seen for key: call it when the
// informer shows the object deleted or being deleted, and when a delete
// failed.
func (e *Expectations) DeletionObserved(key string, uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x := e.m[key]; x != nil {
		delete(x.deletes, uid)
	}
}

// Satisfied reports whether key may sync: it has no record, its record is
// fulfilled, or the record is older than the TTL.
func (e *Expectations) Satisfied(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.m[key]
	if x == nil {
		return true
	}
	if x.adds <= 0 && len(x.deletes) == 0 {
		return true
	}
	return e.now().Sub(x.set) > e.ttl
}

// Forget drops key's record, for an owner that was deleted.
func (e *Expectations) Forget(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m, key)
}

// Pending returns the creations and deletions still expected for key.
func (e *Expectations) Pending(key string) (adds, deletes int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x := e.m[key]; x != nil {
		return max(x.adds, 0), len(x.deletes)
	}
	return 0, 0
}
