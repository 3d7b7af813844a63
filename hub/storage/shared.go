package storage

import (
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// sharedEvents is how many recently decoded change events shared watches
// can find. Watches of one kind receive a change at about the same time,
// so a short window is enough; a watch that falls further behind decodes
// on its own, which is only slower.
const sharedEvents = 256

// decodedKey names one change as one kind sees it: the store gives every
// change its own revision, so key and revision fix the stored bytes.
type decodedKey struct {
	gvk schema.GroupVersionKind
	key store.Key
	rev int64
}

// decoded is one change decoded once for every shared watch.
type decoded struct {
	once sync.Once
	obj  runtime.Object
	err  error
}

// decodeCache shares the decoding of change events among the watches that
// asked for shared objects (WatchOptions.Shared).
type decodeCache struct {
	mu sync.Mutex
	// guards the following fields
	byKey map[decodedKey]*decoded
	ring  [sharedEvents]decodedKey
	next  int
}

// decodeShared returns the typed object of a change, decoding it only if
// no other shared watch did so recently. The result must not be modified.
func (s *Storage) decodeShared(k *registry.Kind, o store.Object) (runtime.Object, error) {
	c := &s.shared
	key := decodedKey{gvk: k.GVK, key: o.Key, rev: o.Revision}
	c.mu.Lock()
	d := c.byKey[key]
	if d == nil {
		if c.byKey == nil {
			c.byKey = make(map[decodedKey]*decoded, sharedEvents)
		}
		if old := c.ring[c.next]; old.rev != 0 {
			delete(c.byKey, old)
		}
		d = &decoded{}
		c.byKey[key] = d
		c.ring[c.next] = key
		c.next = (c.next + 1) % sharedEvents
	}
	c.mu.Unlock()
	d.once.Do(func() { d.obj, d.err = s.decode(k, o) })
	return d.obj, d.err
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
