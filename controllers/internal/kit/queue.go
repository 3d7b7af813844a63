package kit

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Queue is a rate-limited, deduplicating work queue of namespace/name keys.
// A key added many times before a worker takes it is synced once; a key is
// never synced by two workers at once.
type Queue struct {
	name string
	q    workqueue.TypedRateLimitingInterface[string]
}

// NewQueue returns a queue whose failed keys are retried with per-key
// exponential back-off (5ms doubling to 1000s) under an overall 10 qps,
// burst 100 limit, as upstream controllers do.
func NewQueue(name string) *Queue {
	return &Queue{
		name: name,
		q: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name}),
	}
}

// Add queues key now.
func (q *Queue) Add(key string) { q.q.Add(key) }

// AddAfter queues key after d, e.g. when a pod becomes available once its
// minReadySeconds pass.
func (q *Queue) AddAfter(key string, d time.Duration) { q.q.AddAfter(key, d) }

// AddRateLimited queues key after its back-off.
func (q *Queue) AddRateLimited(key string) { q.q.AddRateLimited(key) }

// Enqueue queues the key of an informer object (or tombstone).
func (q *Queue) Enqueue(obj any) {
	if key, ok := Key(obj); ok {
		q.q.Add(key)
	}
}

// Len returns the number of queued keys.
func (q *Queue) Len() int { return q.q.Len() }

// SyncFunc converges one key. An error retries the key with back-off.
type SyncFunc func(ctx context.Context, key string) error

// Run runs workers workers calling fn until ctx ends, then shuts the
// queue down and waits for them.
func (q *Queue) Run(ctx context.Context, workers int, log *slog.Logger, fn SyncFunc) {
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

func (q *Queue) next(ctx context.Context, log *slog.Logger, fn SyncFunc) bool {
	key, quit := q.q.Get()
	if quit {
		return false
	}
	defer q.q.Done(key)
	err := fn(ctx, key)
	if err == nil {
		q.q.Forget(key)
		return true
	}
	if ctx.Err() != nil {
		return true
	}
	log.Debug("sync failed, retrying", "key", key, "retries", q.q.NumRequeues(key), "err", err)
	if q.q.NumRequeues(key) == 15 {
		log.Warn("sync keeps failing", "key", key, "err", err)
	}
	q.q.AddRateLimited(key)
	return true
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
