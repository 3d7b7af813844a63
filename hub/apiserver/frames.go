package apiserver

import (
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

// sharedFrames is how many recently encoded watch events watches can find.
// Watches of one kind write a change at about the same time, so a short
// window is enough; a watch further behind encodes on its own.
const sharedFrames = 256

// frameKey names one watch event as one output encodes it. The object is
// compared by identity: storage hands every shared watch of a kind the same
// object for a change (storage.WatchOptions.Shared), and an object held
// here cannot be freed and its address reused.
type frameKey struct {
	obj   runtime.Object
	typ   watch.EventType
	media string
	gv    schema.GroupVersion
}

// frame is one watch event, WatchEvent envelope included, encoded once for
// every watch with the same output.
type frame struct {
	once sync.Once
	b    []byte
	err  error
}

// frameCache shares the encoding of watch events among watches.
type frameCache struct {
	mu sync.Mutex
	// guards the following fields
	byKey map[frameKey]*frame
	ring  [sharedFrames]frameKey
	next  int
}

// get returns the frame of key, encoding it with enc only if no other watch
// did so recently. The bytes must not be modified.
func (c *frameCache) get(key frameKey, enc func() ([]byte, error)) ([]byte, error) {
	c.mu.Lock()
	f := c.byKey[key]
	if f == nil {
		if c.byKey == nil {
			c.byKey = make(map[frameKey]*frame, sharedFrames)
		}
		if old := c.ring[c.next]; old.obj != nil {
			delete(c.byKey, old)
		}
		f = &frame{}
		c.byKey[key] = f
		c.ring[c.next] = key
		c.next = (c.next + 1) % sharedFrames
	}
	c.mu.Unlock()
	f.once.Do(func() { f.b, f.err = enc() })
	return f.b, f.err
}
