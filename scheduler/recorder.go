package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Events are written at most eventQPS a second with bursts of eventBurst,
// and at most eventQueue wait; an event that finds the queue full is
// dropped. These are kube-scheduler's defaults: its event client shares
// the client connection's 50 QPS and burst of 100, and its broadcaster
// queues 1,000 events and drops the rest. Events are a record for people,
// not state: at a burst of thousands of bindings a second, an event per
// binding would double the hub's writes, so most of a burst's Scheduled
// events are not written, as upstream does not write them either.
const (
	eventQPS   = 50
	eventBurst = 100
	eventQueue = 1000
)

// recorder writes core/v1 Events. Like upstream's broadcaster it never
// slows the scheduler down: when its queue is full, events are dropped.
// A repeat of the last event for the same pod and reason with the same
// message bumps that event's count instead of creating another.
type recorder struct {
	cs        kubernetes.Interface
	component string
	instance  string
	log       *slog.Logger
	ch        chan pendingEvent
	limit     *rate.Limiter
	dropped   atomic.Int64

	mu   sync.Mutex
	last map[lastKey]*lastEvent
}

type pendingEvent struct {
	pod                  *corev1.Pod
	typ, reason, message string
	at                   time.Time
}

type lastKey struct {
	uid    types.UID
	reason string
}

type lastEvent struct {
	name, message string
	count         int32
	first         metav1.Time
}

func newRecorder(cs kubernetes.Interface, component, instance string, log *slog.Logger) *recorder {
	return &recorder{cs: cs, component: component, instance: instance, log: log,
		ch: make(chan pendingEvent, eventQueue), last: map[lastKey]*lastEvent{},
		limit: rate.NewLimiter(eventQPS, eventBurst)}
}

func (r *recorder) event(pod *corev1.Pod, typ, reason, message string) {
	select {
	case r.ch <- pendingEvent{pod: pod, typ: typ, reason: reason, message: message, at: time.Now()}:
	default:
		if n := r.dropped.Add(1); n&(n-1) == 0 {
			r.log.Info("event queue full, dropping events", "dropped", n)
		}
	}
}

// rememberedReasons are the reasons whose last event per pod is kept, to
// count repeats.
var rememberedReasons = []string{"FailedScheduling", "Preempted"}

// forget drops what the recorder remembers of a pod that is gone.
func (r *recorder) forget(uid types.UID) {
	r.mu.Lock()
	for _, reason := range rememberedReasons {
		delete(r.last, lastKey{uid, reason})
	}
	r.mu.Unlock()
}

func (r *recorder) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case e := <-r.ch:
					if r.limit.Wait(ctx) != nil {
						return
					}
					r.write(ctx, e)
				}
			}
		})
	}
	wg.Wait()
}

func (r *recorder) write(ctx context.Context, e pendingEvent) {
	now := metav1.NewTime(e.at)
	key := lastKey{e.pod.UID, e.reason}
	r.mu.Lock()
	prev := r.last[key]
	if prev != nil && prev.message == e.message {
		prev.count++
		name, count := prev.name, prev.count
		r.mu.Unlock()
		body, _ := json.Marshal(map[string]any{"count": count, "lastTimestamp": now.Rfc3339Copy()})
		if _, err := r.cs.CoreV1().Events(e.pod.Namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{}); err == nil {
			return
		}
		r.mu.Lock()
	}
	name := fmt.Sprintf("%s.%x", e.pod.Name, e.at.UnixNano())
	if e.reason != "Scheduled" {
		// Successful bindings happen once per pod; remembering them would
		// only grow the map.
		r.last[key] = &lastEvent{name: name, message: e.message, count: 1, first: now}
	}
	if e.reason == "Scheduled" {
		delete(r.last, lastKey{e.pod.UID, "FailedScheduling"})
	}
	r.mu.Unlock()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.pod.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: e.pod.Namespace,
			Name: e.pod.Name, UID: e.pod.UID, ResourceVersion: e.pod.ResourceVersion},
		Reason: e.reason, Message: e.message, Type: e.typ,
		Source:         corev1.EventSource{Component: r.component},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: r.component, ReportingInstance: r.instance,
	}
	if _, err := r.cs.CoreV1().Events(e.pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
		r.log.Debug("cannot record event", "reason", e.reason, "pod", e.pod.Namespace+"/"+e.pod.Name, "err", err)
	}
}
