package localstate

import (
	"log/slog"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/edge/state"
)

// Options configure a State.
type Options struct {
	// Log receives what goes wrong reading or writing the local state;
	// each kept informer logs under its watch's name. Nil discards it.
	Log *slog.Logger
	// AfterPersist, when set, is called after a kept informer wrote an
	// event to the local state and before its store and handlers see the
	// event. Tests use it to stop an agent between the two.
	AfterPersist func(kind string, ev watch.EventType, obj metav1.Object)
}

// State is an agent's handle on its local state file: the store its kept
// informers write to, and the signal that wakes those waiting to retry
// when the tunnel connects again.
type State struct {
	db           *state.Store
	log          *slog.Logger
	afterPersist func(kind string, ev watch.EventType, obj metav1.Object)

	mu        sync.Mutex
	connected chan struct{} // closed and replaced at every Reconnected
}

// Open opens the local state file at path, creating it if missing.
func Open(path string, opts Options) (*State, error) {
	db, err := state.Open(path)
	if err != nil {
		return nil, err
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &State{db: db, log: log, afterPersist: opts.AfterPersist, connected: make(chan struct{})}, nil
}

// Close closes the file. Kept informers must no longer run.
func (s *State) Close() error { return s.db.Close() }

// DB is the file, for the agent's own records beside the kept informers'.
func (s *State) DB() *state.Store { return s.db }

// Reconnected wakes the kept informers waiting to retry: the hub is back.
func (s *State) Reconnected() {
	s.mu.Lock()
	close(s.connected)
	s.connected = make(chan struct{})
	s.mu.Unlock()
}

// Connected returns a channel closed at the next Reconnected.
func (s *State) Connected() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.connected
}

// Forget removes a watch of one object and its object from the local
// state, once nothing needs them.
func (s *State) Forget(kind, watchName, namespace, name string) {
	rows, err := s.db.List(kind, namespace, name)
	if err != nil {
		s.log.Warn("forget watch", "watch", watchName, "err", err)
		return
	}
	var ops []state.Op
	for _, r := range rows {
		ops = append(ops, state.Op{Key: r.Key, Delete: true})
	}
	if err := s.db.Commit(ops, map[string]string{watchName: ""}); err != nil {
		s.log.Warn("forget watch", "watch", watchName, "err", err)
	}
}

// persisted calls the AfterPersist hook, if any.
func (s *State) persisted(kind string, ev watch.EventType, obj metav1.Object) {
	if s.afterPersist != nil {
		s.afterPersist(kind, ev, obj)
	}
}
