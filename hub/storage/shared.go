package storage

import (
	"bytes"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// sharedEvents is how many recently decoded states shared watches and
// writes can find. Watches of one kind receive a change at about the same
// time, but a write starts from the state the previous write of the object
// stored, which under a burst (a ReplicaSet of thousands of pods being
// created, bound and started) is thousands of changes back. A miss only
// costs a decode.
const sharedEvents = 4096

// sharedTTL bounds how long a decoded state is kept: an idle hub holds none
// of them, whatever the burst before.
const sharedTTL = 10 * time.Second

// decodedKey names one change as one kind sees it: the store gives every
// change its own revision, so key and revision fix the stored bytes. The
// kind is the served kind itself: a custom kind replaced by another of
// the same GVK (new defaults) decodes afresh.
type decodedKey struct {
	kind *registry.Kind
	key  store.Key
	rev  int64
}

// decoded is one change decoded once for every shared watch.
type decoded struct {
	once sync.Once
	obj  runtime.Object
	err  error
	at   time.Time
}

// decodeCache shares the decoding of change events among the watches that
// asked for shared objects (WatchOptions.Shared) and the writes that start
// from a stored state.
type decodeCache struct {
	mu sync.Mutex
	// guards the following fields
	byKey   map[decodedKey]*decoded
	ring    [sharedEvents]decodedKey
	next    int
	sweep   *time.Timer // runs while the cache holds entries
	pending map[pendingKey]*pendingState
}

// pendingKey names an object as one kind sees it.
type pendingKey struct {
	kind *registry.Kind
	key  store.Key
}

// pendingState is a state a write is about to store, already in the typed
// form decoding its value gives (see expectWrite).
type pendingState struct {
	value []byte
	obj   runtime.Object
	// same: the kind's DefaultOnRead leaves the stored state as it is
	// (see readDefaults).
	same bool
}

// decodeShared returns the typed object of a change, decoding it only if
// no other shared watch did so recently. The result must not be modified.
func (s *Storage) decodeShared(k *registry.Kind, o store.Object) (runtime.Object, error) {
	c := &s.shared
	key := decodedKey{kind: k, key: o.Key, rev: o.Revision}
	c.mu.Lock()
	d := c.byKey[key]
	if d == nil {
		d = c.insertLocked(key)
		pk := pendingKey{kind: k, key: o.Key}
		if p := c.pending[pk]; p != nil && bytes.Equal(p.value, o.Value) {
			// The write that stored this state made its typed form; no
			// one has seen it yet, so it gets its resourceVersion here.
			delete(c.pending, pk)
			if m, err := meta.Accessor(p.obj); err == nil {
				m.SetResourceVersion(strconv.FormatInt(o.Revision, 10))
				d.once.Do(func() { d.obj = p.obj })
				if p.same {
					s.rdefaults.note(k, o.Key, o.Revision)
				}
			}
		}
	}
	c.mu.Unlock()
	d.once.Do(func() { d.obj, d.err = s.decodeState(k, o) })
	return d.obj, d.err
}

// insertLocked adds an empty entry for key, evicting the oldest if the
// cache is full.
func (c *decodeCache) insertLocked(key decodedKey) *decoded {
	if c.byKey == nil {
		c.byKey = make(map[decodedKey]*decoded)
	}
	if old := c.ring[c.next]; old.rev != 0 {
		delete(c.byKey, old)
	}
	d := &decoded{at: time.Now()}
	c.byKey[key] = d
	c.ring[c.next] = key
	c.next = (c.next + 1) % sharedEvents
	if c.sweep == nil {
		c.sweep = time.AfterFunc(sharedTTL, c.expire)
	}
	return d
}

// expectWrite tells the cache that a write is about to store enc, whose
// value decodes to obj (resourceVersion aside): the first watch or write
// that needs the stored state, at whatever revision the store gives it,
// takes obj instead of decoding the value. obj must not be modified by
// anyone from now on. same says that the kind's DefaultOnRead leaves the
// stored state as it is. The returned function ends the expectation; call
// it once the write returned, whether it stored anything or not.
func (s *Storage) expectWrite(k *registry.Kind, enc store.Object, obj runtime.Object, same bool) (forget func()) {
	c := &s.shared
	pk := pendingKey{kind: k, key: enc.Key}
	p := &pendingState{value: enc.Value, obj: obj, same: same}
	c.mu.Lock()
	if c.pending == nil {
		c.pending = make(map[pendingKey]*pendingState)
	}
	c.pending[pk] = p
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		if c.pending[pk] == p {
			delete(c.pending, pk)
		}
		c.mu.Unlock()
	}
}

// decodeStored decodes the stored state a write starts from, for the
// write to modify. The state the previous write stored is usually still
// decoded (the watches of the kind decoded it too) and is copied; a state
// no longer in the cache is decoded for this write alone: the next write
// starts from the state this one stores, so keeping the old one would only
// push out states that watches still need.
func (s *Storage) decodeStored(k *registry.Kind, o store.Object) (runtime.Object, error) {
	obj, shared, err := s.decodeForRead(k, o)
	if err != nil || !shared {
		return obj, err
	}
	return obj.DeepCopyObject(), nil
}

// decodeForRead returns the typed form of a stored state: the shared
// decoding when a watch or a write made one recently (shared is true; it
// must not be modified), else one decoded for the caller alone. It adds
// nothing to the cache.
func (s *Storage) decodeForRead(k *registry.Kind, o store.Object) (obj runtime.Object, shared bool, err error) {
	d := s.shared.find(k, o)
	if d == nil {
		obj, err = s.decode(k, o)
		return obj, false, err
	}
	d.once.Do(func() { d.obj, d.err = s.decodeState(k, o) })
	return d.obj, d.err == nil, d.err
}

// find returns the entry of a stored state as kind k sees it, or nil; it
// adds none.
func (c *decodeCache) find(k *registry.Kind, o store.Object) *decoded {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byKey[decodedKey{kind: k, key: o.Key, rev: o.Revision}]
}

// expire drops the entries older than sharedTTL, oldest first, and comes
// back while any are left.
func (c *decodeCache) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	cutoff := time.Now().Add(-sharedTTL)
	for i := range sharedEvents {
		j := (c.next + i) % sharedEvents
		key := c.ring[j]
		if key.rev == 0 {
			continue
		}
		if d := c.byKey[key]; d != nil && d.at.After(cutoff) {
			break
		}
		delete(c.byKey, key)
		c.ring[j] = decodedKey{}
	}
	if len(c.byKey) == 0 {
		c.byKey = nil // let the map's memory go too
		c.sweep = nil
		return
	}
	c.sweep.Reset(sharedTTL / 2)
}

// decodeOwned decodes a stored state the caller may modify. A write
// decodes the state it stored, and the next write of the same object the
// state it starts from, while the watches of the kind decode each change:
// going through the shared decoding, each state is decoded once and every
// owner gets a deep copy. o must be stored state (never a dry run's).
func (s *Storage) decodeOwned(k *registry.Kind, o store.Object) (runtime.Object, error) {
	obj, err := s.decodeShared(k, o)
	if err != nil {
		return nil, err
	}
	return obj.DeepCopyObject(), nil
}
