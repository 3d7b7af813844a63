package kit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// TypedQueue is a rate-limited, deduplicating work queue of keys of type
// K. A key added many times before a worker takes it is synced once; a key
// is never synced by two workers at once. Controllers keyed by
// namespace/name use [Queue]; TypedQueue serves those with a key of their
// own, such as the garbage collector's resource-qualified one.
type TypedQueue[K comparable] struct {
	name    string
	limiter workqueue.TypedRateLimiter[K]
	q       workqueue.TypedRateLimitingInterface[K]
	// ownClock is set when the queue's delays run on a clock other than
	// the real one; failures then back off on timers of their own.
	ownClock bool
}

// QueueOption configures a queue made by [NewQueue] or [NewTypedQueue].
type QueueOption func(*queueOptions)

type queueOptions struct {
	base, max time.Duration
	clock     clock.WithTicker
}

// WithBackoff retries a failed key after base, doubling for each further
// failure up to max, with no overall rate limit: the per-key back-off of
// upstream controllers that choose their own (the namespace, volume and
// EndpointSlice controllers, say).
func WithBackoff(base, max time.Duration) QueueOption {
	return func(o *queueOptions) { o.base, o.max = base, max }
}

// WithClock runs the queue's delays, [TypedQueue.AddAfter] and
// [RequeueAfter], on clk, so a controller whose schedule follows a clock of
// its own (a test's fake clock) is requeued on it. Back-off after a failed
// sync still waits in real time: a test clock held still never wedges a
// failing key.
func WithClock(clk clock.WithTicker) QueueOption {
	return func(o *queueOptions) { o.clock = clk }
}

// NewTypedQueue returns a queue of K keys. By default a failed key is
// retried with per-key exponential back-off (5ms doubling to 1000s) under
// an overall 10 qps, burst 100 limit, as upstream controllers do;
// [WithBackoff] and [WithClock] change that.
func NewTypedQueue[K comparable](name string, opts ...QueueOption) *TypedQueue[K] {
	var o queueOptions
	for _, opt := range opts {
		opt(&o)
	}
	limiter := workqueue.DefaultTypedControllerRateLimiter[K]()
	if o.base > 0 {
		limiter = workqueue.NewTypedItemExponentialFailureRateLimiter[K](o.base, o.max)
	}
	cfg := workqueue.TypedRateLimitingQueueConfig[K]{Name: name}
	if o.clock != nil {
		cfg.Clock = o.clock
	}
	return &TypedQueue[K]{
		name:     name,
		limiter:  limiter,
		q:        workqueue.NewTypedRateLimitingQueueWithConfig(limiter, cfg),
		ownClock: o.clock != nil,
	}
}

// Add queues key now.
func (q *TypedQueue[K]) Add(key K) { q.q.Add(key) }

// AddAfter queues key after d, e.g. when a pod becomes available once its
// minReadySeconds pass.
func (q *TypedQueue[K]) AddAfter(key K, d time.Duration) { q.q.AddAfter(key, d) }

// AddRateLimited queues key after its back-off, as a failed sync does.
func (q *TypedQueue[K]) AddRateLimited(key K) {
	if !q.ownClock {
		q.q.AddRateLimited(key)
		return
	}
	time.AfterFunc(q.limiter.When(key), func() { q.q.Add(key) })
}

// Len returns the number of queued keys.
func (q *TypedQueue[K]) Len() int { return q.q.Len() }

// ShutDown stops a queue that is not to be run, or no longer, and the
// timers of its delayed keys. Run shuts its queue down itself.
func (q *TypedQueue[K]) ShutDown() { q.q.ShutDown() }

// Run runs workers workers, each taking a key and calling fn with it,
// until ctx ends; it then shuts the queue down and waits for them.
//
// What fn returns decides what becomes of the key: nil forgets its
// back-off; [RequeueAfter] forgets it too and syncs the key again after
// the delay; any other error is a failure, retried after the key's
// back-off, which grows with each failure in a row.
func (q *TypedQueue[K]) Run(ctx context.Context, workers int, log *slog.Logger, fn func(ctx context.Context, key K) error) {
	if workers <= 0 {
		workers = 1
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for q.next(ctx, log, fn) {
			}
		})
	}
	<-ctx.Done()
	q.q.ShutDown()
	wg.Wait()
}

func (q *TypedQueue[K]) next(ctx context.Context, log *slog.Logger, fn func(context.Context, K) error) bool {
	key, quit := q.q.Get()
	if quit {
		return false
	}
	defer q.q.Done(key)
	err := fn(ctx, key)
	var again requeueAfter
	switch {
	case err == nil:
		q.q.Forget(key)
		return true
	case errors.As(err, &again):
		q.q.Forget(key)
		q.q.AddAfter(key, time.Duration(again))
		return true
	case ctx.Err() != nil:
		return true
	}
	retries := q.q.NumRequeues(key)
	log.Debug("sync failed, retrying", "key", fmt.Sprint(key), "retries", retries, "err", err)
	if retries == 15 {
		log.Warn("sync keeps failing", "key", fmt.Sprint(key), "err", err)
	}
	q.AddRateLimited(key)
	return true
}

// requeueAfter is the error [RequeueAfter] returns.
type requeueAfter time.Duration

func (r requeueAfter) Error() string {
	return fmt.Sprintf("sync again after %v", time.Duration(r))
}

// RequeueAfter is what a sync returns when it succeeded but must look at
// its key again after d: a CronJob's next start time, a namespace whose
// content is still going away. It is not a failure: the key's back-off is
// reset. A d of zero or less means no requeue, as a nil error does.
func RequeueAfter(d time.Duration) error {
	if d <= 0 {
		return nil
	}
	return requeueAfter(d)
}

// Queue is a [TypedQueue] of namespace/name keys, the key of an informer
// object, which it can take as it comes ([Queue.Enqueue]).
type Queue struct {
	*TypedQueue[string]
}

// NewQueue returns a queue of namespace/name keys; see [NewTypedQueue].
func NewQueue(name string, opts ...QueueOption) *Queue {
	return &Queue{NewTypedQueue[string](name, opts...)}
}

// Enqueue queues the key of an informer object (or tombstone).
func (q *Queue) Enqueue(obj any) {
	if key, ok := Key(obj); ok {
		q.Add(key)
	}
}

// Key returns the namespace/name key of an informer object or tombstone.
func Key(obj any) (string, bool) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	return key, err == nil
}

// SplitKey is the inverse of Key.
func SplitKey(key string) (namespace, name string) {
	ns, n, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return "", key
	}
	return ns, n
}

// Tombstone unwraps a deleted object the informer missed the final state
// of; it returns obj unchanged otherwise.
func Tombstone(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}
