package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/registry"
)

// Follower keeps a view of stored objects that Follow feeds. Follow calls
// its methods from one goroutine, never two at once.
type Follower interface {
	// Replace is handed a typed list (e.g. *corev1.NodeList) of every
	// selected object as stored at the list's resourceVersion: the view
	// becomes exactly that, dropping what the list does not hold. An
	// error makes Follow list again after a pause.
	Replace(list runtime.Object) error
	// Apply is handed one change after the last Replace: watch.Added,
	// watch.Modified or watch.Deleted, with the object as stored then
	// (its last state, for Deleted).
	Apply(ev watch.EventType, obj runtime.Object)
}

// FollowFuncs is a Follower made of two functions.
type FollowFuncs struct {
	ReplaceFunc func(list runtime.Object) error
	ApplyFunc   func(ev watch.EventType, obj runtime.Object)
}

// Replace calls f.ReplaceFunc.
func (f FollowFuncs) Replace(list runtime.Object) error { return f.ReplaceFunc(list) }

// Apply calls f.ApplyFunc.
func (f FollowFuncs) Apply(ev watch.EventType, obj runtime.Object) { f.ApplyFunc(ev, obj) }

// FollowOptions select what Follow follows and how it reports.
type FollowOptions struct {
	// Label and Field select the objects; nil selects all.
	Label labels.Selector
	Field fields.Selector
	// Shared lets the watch's objects be shared with other watches (see
	// WatchOptions.Shared): Apply must then keep nothing of them it
	// could change, and must not change them. Replace's list always
	// belongs to the follower.
	Shared bool
	// Synced, if set, is called once, after the first Replace has
	// returned without error and before the first Apply.
	Synced func()
	// Logger receives a warning for each failure; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Follow's pauses after a failure: each failure in a row doubles the
// pause from followMinBackoff up to followMaxBackoff, and a random part
// of up to half of it is taken off so that followers that failed
// together do not start again together.
const (
	followMinBackoff = 100 * time.Millisecond
	followMaxBackoff = 5 * time.Second
)

// Follow keeps f's view equal to the objects of kind k in namespace (""
// for all namespaces, or a cluster-scoped kind) that opts selects, until
// ctx ends; then it returns. It lists them (Replace), then watches from
// the list's resourceVersion (Apply), and lists again whenever the watch
// ends.
//
// It guarantees that:
//   - Apply sees every change after the last Replace, in store order, and
//     none twice: f's view is the stored state at some revision, never
//     older than the last change Apply saw;
//   - after a failure (a list or watch error, an error event, a watch
//     that closes, Replace's error) the view is replaced by a new list, so
//     objects deleted while the watch was down leave it;
//   - failures in a row are spaced by a jittered back-off from 100 ms to
//     5 s, so a failing store is not spun on; a watch that stays up past
//     the longest pause resets it;
//   - a watch whose resourceVersion was compacted away (410 Gone or
//     Expired) lists again at once, the first time in a row;
//   - no method of f is called after Follow returns.
func Follow(ctx context.Context, s API, k *registry.Kind, namespace string, opts FollowOptions, f Follower) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	synced := opts.Synced
	failures := 0
	gone := false // the last attempt ended with 410: the next one too lists at once
	for ctx.Err() == nil {
		start := time.Now()
		err := followOnce(ctx, s, k, namespace, opts, f, &synced)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) >= followMaxBackoff {
			failures = 0
		}
		if isGone(err) && !gone {
			gone = true
			log.Debug("follow: resourceVersion compacted; listing again", "resource", k.QualifiedResource(), "err", err)
			continue
		}
		gone = isGone(err)
		pause := backoff(failures)
		failures++
		log.Warn("follow: watch ended; starting again", "resource", k.QualifiedResource(), "namespace", namespace,
			"err", err, "pause", pause)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// backoff returns the pause after failures earlier failures in a row.
func backoff(failures int) time.Duration {
	d := followMaxBackoff
	if failures < 16 {
		d = min(followMinBackoff<<failures, followMaxBackoff)
	}
	return d - rand.N(d/2)
}

// isGone reports whether err says a resourceVersion is no longer kept.
func isGone(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// followOnce lists, hands the list to f and watches from its revision
// until the watch fails or ctx ends. It returns why the watch ended (nil
// when ctx did).
func followOnce(ctx context.Context, s API, k *registry.Kind, namespace string, opts FollowOptions, f Follower, synced *func()) error {
	list, err := s.List(ctx, k, namespace, ListOptions{Label: opts.Label, Field: opts.Field})
	if err != nil {
		return fmt.Errorf("list %s: %w", k.QualifiedResource(), err)
	}
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return fmt.Errorf("list %s: %w", k.QualifiedResource(), err)
	}
	rv := lm.GetResourceVersion()
	if err := f.Replace(list); err != nil {
		return fmt.Errorf("replace %s: %w", k.QualifiedResource(), err)
	}
	if *synced != nil {
		(*synced)()
		*synced = nil
	}
	w, err := s.Watch(ctx, k, namespace, WatchOptions{Label: opts.Label, Field: opts.Field, ResourceVersion: rv, Shared: opts.Shared})
	if err != nil {
		return fmt.Errorf("watch %s from %s: %w", k.QualifiedResource(), rv, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("watch %s: %w", k.QualifiedResource(), errWatchClosed)
			}
			switch ev.Type {
			case watch.Added, watch.Modified, watch.Deleted:
				f.Apply(ev.Type, ev.Object)
			case watch.Error:
				return fmt.Errorf("watch %s: %w", k.QualifiedResource(), apierrors.FromObject(ev.Object))
			}
		}
	}
}

// errWatchClosed is why a watch that closed without an error event ended.
var errWatchClosed = errors.New("watch closed")
