package store

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
)

// The closed set of error kinds. Wrapped errors carry the key or revision
// involved; match them with errors.Is.
var (
	// ErrNotFound: the key does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: Create of a key that already exists.
	ErrExists = errors.New("already exists")
	// ErrConflict: the expected revision is not the key's current revision.
	ErrConflict = errors.New("revision conflict")
	// ErrCompacted: a watch or continued list starts below the oldest
	// revision the change log still holds.
	ErrCompacted = errors.New("revision compacted")
	// ErrFutureRevision: a watch starts above the current revision.
	ErrFutureRevision = errors.New("revision is in the future")
	// ErrTooLarge: the value exceeds the store's size limit.
	ErrTooLarge = errors.New("value too large")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("store closed")
	// ErrUnavailable: the backend's database cannot be reached for now; the
	// operation may be retried once it is back. A write that fails with it
	// may or may not have been committed.
	ErrUnavailable = errors.New("database unavailable")
	// ErrWatchOverflow ends a watch whose consumer fell too far behind; the
	// consumer may watch again from the last revision it received.
	ErrWatchOverflow = errors.New("watch consumer too slow")
)

// Key names one object.
type Key struct {
	// Resource is the group-qualified plural resource: "pods",
	// "deployments.apps", "leases.coordination.k8s.io".
	Resource string
	// Namespace is empty for cluster-scoped objects.
	Namespace string
	// Name is the object's name; never empty.
	Name string
}

func (k Key) String() string {
	if k.Namespace == "" {
		return k.Resource + "/" + k.Name
	}
	return k.Resource + "/" + k.Namespace + "/" + k.Name
}

// Object is one stored object.
type Object struct {
	Key
	// Value is the encoded object, stored and returned byte for byte.
	Value []byte
	// Labels are matched by label selectors.
	Labels map[string]string
	// Fields are matched by field selectors. The store matches only what is
	// here: the hub puts metadata.name and metadata.namespace in as well as
	// any kind-specific fields.
	Fields map[string]string
	// Revision is the revision of the write that produced this state (for a
	// deleted object returned by Delete or a Deleted event, the revision of
	// the deletion).
	Revision int64
}

// ListOptions selects objects of one resource.
type ListOptions struct {
	// Resource is required.
	Resource string
	// Namespace limits the list to one namespace; empty lists all.
	Namespace string
	// Label and Field filter the result; nil matches everything.
	Label labels.Selector
	Field fields.Selector
	// Limit caps the number of objects returned; 0 means no limit.
	Limit int64
	// Continue resumes a limited list from a previous ListResult.Continue.
	// A token from before the compacted revision yields ErrCompacted.
	Continue string
	// ReadOnly promises that the caller neither modifies the returned
	// values, labels and fields nor keeps them beyond its request. A
	// backend may then hand out its own immutable copies instead of
	// copying every object; it may also ignore the flag.
	ReadOnly bool
}

// ListResult is one page of a list.
type ListResult struct {
	// Objects are ordered by namespace, then name.
	Objects []Object
	// Revision is the store revision the list reflects: at least the
	// revision of every object in it, and the revision to watch from.
	Revision int64
	// Continue is non-empty when more objects remain.
	Continue string
	// Remaining estimates how many objects follow; set only with Continue.
	Remaining int64
}

// EventType says what a watch event reports.
type EventType int

const (
	Added EventType = iota + 1
	Modified
	Deleted
)

func (t EventType) String() string {
	switch t {
	case Added:
		return "ADDED"
	case Modified:
		return "MODIFIED"
	case Deleted:
		return "DELETED"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one change seen by a watch.
type Event struct {
	Type EventType
	// Object is the state after the change. For Deleted it is the last
	// state before deletion, with Revision set to the deletion revision.
	// For a filtered watch, an update that takes an object out of the
	// selection is delivered as Deleted carrying the previous state with
	// the update's revision; one that brings an object into the selection
	// is delivered as Added.
	Object Object
	// Prev is the state before the change; nil for Added events.
	Prev *Object
}

// WatchOptions selects the changes a watch delivers.
type WatchOptions struct {
	// Resource limits the watch to one resource; empty watches all.
	Resource string
	// Namespace limits the watch to one namespace; empty watches all.
	Namespace string
	// Label and Field filter events as described at Event.
	Label labels.Selector
	Field fields.Selector
	// Revision: deliver every change with a revision greater than this one,
	// replaying from the change log what already happened. Below the
	// compacted revision Watch fails with ErrCompacted; above the current
	// revision with ErrFutureRevision.
	Revision int64
	// ReadOnly promises that the consumer neither modifies the values,
	// labels and fields of the events it receives nor keeps them beyond
	// handling each event. A backend may then hand out its own immutable
	// copies instead of copying every event for every watch; it may also
	// ignore the flag.
	ReadOnly bool
}

// Watcher is a running watch.
type Watcher interface {
	// Events delivers changes in revision order, each exactly once. The
	// channel is closed when the watch ends.
	Events() <-chan Event
	// Err says why the watch ended: nil after Stop or the end of the
	// context given to Watch, ErrWatchOverflow, ErrClosed, or another
	// failure. Valid once Events is closed.
	Err() error
	// Stop ends the watch and releases its resources; safe to call more
	// than once.
	Stop()
}

// Batcher is implemented by watchers that can hand their events to the
// consumer's goroutine in batches instead of through Events: such a watch
// costs the store no goroutine and no channel buffer, which matters with
// thousands of watches, a few for each node. A consumer takes events
// either through Events or through Next, never both; the watch still ends
// with the context given to Watch.
type Batcher interface {
	// Batches reports whether the watch can be consumed through Next. It
	// cannot while it must replay the change log first, which it does
	// through Events.
	Batches() bool
	// Ready is signalled when events may be pending or the watch ended.
	Ready() <-chan struct{}
	// Next returns the pending events, oldest first, without waiting.
	// ended says the watch is over (see Err): no event follows these.
	Next() (events []Event, ended bool)
}

// Store is a revisioned object store with watches. See the package
// documentation for errors and concurrency.
type Store interface {
	// Create stores a new object and returns its revision. ErrExists if
	// the key exists.
	Create(ctx context.Context, obj Object) (int64, error)
	// Update replaces an existing object. If expected is non-zero it must
	// equal the object's current revision, else ErrConflict. An update
	// whose value, labels and fields equal the current ones writes nothing,
	// emits no event and returns the current revision. ErrNotFound if the
	// key does not exist.
	Update(ctx context.Context, obj Object, expected int64) (int64, error)
	// Delete removes an object and returns its last state with Revision
	// set to the deletion revision. If expected is non-zero it must equal
	// the current revision, else ErrConflict.
	Delete(ctx context.Context, key Key, expected int64) (Object, error)
	// Get returns the current state of one object.
	Get(ctx context.Context, key Key) (Object, error)
	// List returns current state only, never history.
	List(ctx context.Context, opts ListOptions) (ListResult, error)
	// Watch starts a watch; see WatchOptions.
	Watch(ctx context.Context, opts WatchOptions) (Watcher, error)
	// Revision returns the current revision: the revision of the newest
	// acknowledged write. It never goes backwards, also across restarts
	// and compaction.
	Revision() int64
	// CompactedRevision returns the newest revision no longer in the change
	// log; watches must start at or above it.
	CompactedRevision() int64
	// Close stops background work, ends all watches and closes the backend.
	Close() error
}
