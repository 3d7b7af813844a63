package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// recorder writes core/v1 Events. Like upstream's broadcaster it never
// slows the scheduler down: when its buffer is full, events are dropped.
// A repeat of the last event for the same pod and reason with the same
// message bumps that event's count instead of creating another.
type recorder struct {
	cs        kubernetes.Interface
	component string
	instance  string
	log       *slog.Logger
	ch        chan pendingEvent

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
		ch: make(chan pendingEvent, 8192), last: map[lastKey]*lastEvent{}}
}

func (r *recorder) event(pod *corev1.Pod, typ, reason, message string) {
	select {
	case r.ch <- pendingEvent{pod: pod, typ: typ, reason: reason, message: message, at: time.Now()}:
	default:
	}
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
