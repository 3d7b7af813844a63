package scheduler

import (
	"container/heap"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Back-off bounds for pods that failed to schedule, upstream's defaults.
const (
	initialBackoff = time.Second
	maxBackoff     = 10 * time.Second
	// maxUnschedulableWait: a pod no event has woken up is retried anyway
	// after this long, in case an event that mattered was not foreseen.
	maxUnschedulableWait = 5 * time.Minute
)

// queuedPod is a pending pod and its scheduling history.
type queuedPod struct {
	pi       *PodInfo
	attempts int
	// added orders pods of equal priority (first come, first served).
	added time.Time
	// failedAt is when the last attempt failed; back-off runs from it.
	failedAt time.Time
	helps    eventMask
	where    int // one of in*
	index    int // heap index
}

const (
	inNone = iota
	inActive
	inBackoff
	inUnschedulable
	inFlight
)

func (q *queuedPod) backoffUntil() time.Time {
	d := initialBackoff
	for i := 1; i < q.attempts; i++ {
		d *= 2
		if d >= maxBackoff {
			d = maxBackoff
			break
		}
	}
	return q.failedAt.Add(d)
}

// queue orders pending pods: active (ready to try, by priority then
// arrival), backoff (failed recently, by expiry) and unschedulable
// (waiting for a cluster change that may help). It is owned by the loop
// goroutine and takes the time as an argument.
type queue struct {
	pods    map[types.UID]*queuedPod
	active  podHeap
	backoff podHeap
	unsched map[types.UID]*queuedPod
}

func newQueue() *queue {
	q := &queue{pods: map[types.UID]*queuedPod{}, unsched: map[types.UID]*queuedPod{}}
	q.active.less = func(a, b *queuedPod) bool {
		if a.pi.Priority != b.pi.Priority {
			return a.pi.Priority > b.pi.Priority
		}
		return a.added.Before(b.added)
	}
	q.backoff.less = func(a, b *queuedPod) bool { return a.backoffUntil().Before(b.backoffUntil()) }
	return q
}

// add queues a new pending pod, or refreshes one already queued. A pod
// whose spec changed while it waited is tried again as soon as its
// back-off allows.
func (q *queue) add(pi *PodInfo, now time.Time, changed bool) {
	if e := q.pods[pi.UID]; e != nil {
		e.pi = pi
		switch e.where {
		case inActive:
			heap.Fix(&q.active, e.index)
		case inBackoff:
			heap.Fix(&q.backoff, e.index)
		case inUnschedulable:
			if changed {
				q.move(e, now)
			}
		}
		return
	}
	e := &queuedPod{pi: pi, added: now}
	q.pods[pi.UID] = e
	q.push(e, inActive)
}

func (q *queue) push(e *queuedPod, where int) {
	e.where = where
	switch where {
	case inActive:
		heap.Push(&q.active, e)
	case inBackoff:
		heap.Push(&q.backoff, e)
	case inUnschedulable:
		q.unsched[e.pi.UID] = e
	}
}

func (q *queue) detach(e *queuedPod) {
	switch e.where {
	case inActive:
		heap.Remove(&q.active, e.index)
	case inBackoff:
		heap.Remove(&q.backoff, e.index)
	case inUnschedulable:
		delete(q.unsched, e.pi.UID)
	}
	e.where = inNone
}

// remove forgets a pod (deleted, bound, or no longer ours).
func (q *queue) remove(uid types.UID) {
	if e := q.pods[uid]; e != nil {
		q.detach(e)
		delete(q.pods, uid)
	}
}

// pop returns the most important active pod, marking it in flight.
func (q *queue) pop() *queuedPod {
	if q.active.Len() == 0 {
		return nil
	}
	e := heap.Pop(&q.active).(*queuedPod)
	e.where = inFlight
	e.attempts++
	return e
}

// assumed records that a popped pod was placed and its binding is in
// flight; it stays known, so informer updates do not queue it again, until
// the binding is confirmed (remove) or fails (retry).
func (q *queue) assumed(e *queuedPod) { e.where = inFlight }

// failed parks a pod that did not fit until one of helps happens.
func (q *queue) failed(e *queuedPod, helps eventMask, now time.Time) {
	if q.pods[e.pi.UID] != e {
		return // deleted or bound meanwhile
	}
	e.failedAt = now
	e.helps = helps
	q.push(e, inUnschedulable)
}

// retry puts a pod whose binding failed back with back-off.
func (q *queue) retry(e *queuedPod, now time.Time) {
	if q.pods[e.pi.UID] != e {
		return // deleted meanwhile
	}
	e.failedAt = now
	q.detach(e)
	q.push(e, inBackoff)
}

// move sends a parked pod to active, or to backoff if its back-off has
// not run out.
func (q *queue) move(e *queuedPod, now time.Time) {
	q.detach(e)
	if now.Before(e.backoffUntil()) {
		q.push(e, inBackoff)
	} else {
		q.push(e, inActive)
	}
}

// event moves every parked pod that ev may help.
func (q *queue) event(ev eventMask, now time.Time) {
	if ev == 0 {
		return
	}
	for _, e := range q.unsched {
		if e.helps&ev != 0 {
			q.move(e, now)
		}
	}
}

// flushBackoff moves pods whose back-off ran out to active and returns
// when the next back-off ends (zero if none).
func (q *queue) flushBackoff(now time.Time) time.Time {
	for q.backoff.Len() > 0 {
		e := q.backoff.items[0]
		if now.Before(e.backoffUntil()) {
			return e.backoffUntil()
		}
		heap.Pop(&q.backoff)
		q.push(e, inActive)
	}
	return time.Time{}
}

// flushLeftovers retries pods parked for too long.
func (q *queue) flushLeftovers(now time.Time) {
	for _, e := range q.unsched {
		if now.Sub(e.failedAt) >= maxUnschedulableWait {
			q.move(e, now)
		}
	}
}

type podHeap struct {
	items []*queuedPod
	less  func(a, b *queuedPod) bool
}

func (h *podHeap) Len() int           { return len(h.items) }
func (h *podHeap) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }
func (h *podHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].index = i
	h.items[j].index = j
}
func (h *podHeap) Push(x any) {
	e := x.(*queuedPod)
	e.index = len(h.items)
	h.items = append(h.items, e)
}
func (h *podHeap) Pop() any {
	n := len(h.items) - 1
	e := h.items[n]
	h.items[n] = nil
	h.items = h.items[:n]
	return e
}
