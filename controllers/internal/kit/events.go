package kit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// Recorder limits, chosen to match what kubectl users see from upstream
// controllers: a burst of events per object, then a slow trickle.
const (
	recorderBuffer   = 1000            // events waiting to be written
	recorderCache    = 4096            // distinct events remembered for counting
	spamBurst        = 25              // events per object before throttling
	spamRefill       = 5 * time.Minute // one more event per object per refill
	repeatWindow     = 10 * time.Minute
	recorderWriteTTL = 10 * time.Second
	// aggregateAfter is how many different messages one object may get
	// for the same type and reason within repeatWindow before further
	// ones are combined into a single event whose count goes up.
	aggregateAfter = 10
	combinedPrefix = "(combined from similar events): "
)

// Recorder writes core/v1 Events about objects. Eventf never blocks: events
// go to a bounded buffer that one goroutine drains, and are dropped when the
// buffer is full. An event identical to one written in the last ten minutes
// (same object, type, reason and message) bumps that event's count instead
// of creating a new one. Similar events (same object, type and reason, but
// another message, such as "Created pod: web-x7k2p") are written as they are
// up to ten different messages in ten minutes; after that they are combined
// into one event, "(combined from similar events): <latest message>", whose
// count goes up. Each object may produce a burst of 25 event writes
// (creates and count updates alike), then one per five minutes, so a
// controller creating thousands of pods writes a bounded number of events:
// 25 for its first 10,000 pods.
type Recorder struct {
	client    kubernetes.Interface
	component string
	log       *slog.Logger
	now       func() time.Time
	ch        chan queuedEvent

	mu      sync.Mutex // guards the following fields
	seen    map[string]*seenEvent
	order   []string // keys of seen, oldest first, for eviction
	buckets map[types.UID]*bucket
	similar map[string]*similarEvents
}

// queuedEvent is an event waiting to be written, with the key under which
// repeats of it are counted.
type queuedEvent struct {
	ev  *corev1.Event
	key string
}

// similarEvents are the messages seen for one object, type and reason.
type similarEvents struct {
	messages map[string]struct{}
	last     time.Time
}

type seenEvent struct {
	name, namespace string
	count           int32
	first, last     time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

// NewRecorder returns a recorder whose events name component as their
// source. Call Run to start writing.
func NewRecorder(client kubernetes.Interface, component string, log *slog.Logger) *Recorder {
	if log == nil {
		log = slog.Default()
	}
	return &Recorder{
		client: client, component: component, log: log, now: time.Now,
		ch:      make(chan queuedEvent, recorderBuffer),
		seen:    map[string]*seenEvent{},
		buckets: map[types.UID]*bucket{},
		similar: map[string]*similarEvents{},
	}
}

// Object is what events are about: a typed API object.
type Object interface {
	metav1.Object
	runtime.Object
}

// Eventf records an event of type eventType (corev1.EventTypeNormal or
// corev1.EventTypeWarning) about obj.
func (r *Recorder) Eventf(obj Object, eventType, reason, format string, args ...any) {
	if r == nil {
		return
	}
	now := r.now()
	ref := referenceTo(obj)
	message := fmt.Sprintf(format, args...)
	key, combined := r.aggregate(ref, eventType, reason, message, now)
	if combined {
		message = combinedPrefix + message
	}
	if !r.allow(obj.GetUID(), now) {
		return
	}
	ns := obj.GetNamespace()
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	t := metav1.NewTime(now)
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", obj.GetName(), now.UnixNano()),
			Namespace: ns,
		},
		InvolvedObject:      ref,
		Reason:              reason,
		Message:             message,
		Type:                eventType,
		FirstTimestamp:      t,
		LastTimestamp:       t,
		Count:               1,
		Source:              corev1.EventSource{Component: r.component},
		ReportingController: r.component,
	}
	select {
	case r.ch <- queuedEvent{ev: ev, key: key}:
	default:
		r.log.Debug("event buffer full, dropping event", "reason", reason, "object", obj.GetName())
	}
}

// aggregate returns the key under which an event's repeats are counted,
// and whether it is to be combined with similar ones: the object, type and
// reason, without the message, once that group has had aggregateAfter
// different messages within repeatWindow.
func (r *Recorder) aggregate(ref corev1.ObjectReference, eventType, reason, message string, now time.Time) (string, bool) {
	group := strings.Join([]string{string(ref.UID), ref.FieldPath, eventType, reason}, "\x00")
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.similar[group]
	if g == nil || now.Sub(g.last) > repeatWindow {
		if len(r.similar) >= recorderCache {
			clear(r.similar) // bounded, as the spam buckets
		}
		g = &similarEvents{messages: map[string]struct{}{}}
		r.similar[group] = g
	}
	g.last = now
	if _, ok := g.messages[message]; ok || len(g.messages) < aggregateAfter {
		g.messages[message] = struct{}{}
		return group + "\x00" + message, false
	}
	return group, true
}

// allow takes a token from the object's bucket.
func (r *Recorder) allow(uid types.UID, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.buckets[uid]
	if b == nil {
		if len(r.buckets) >= recorderCache {
			clear(r.buckets) // crude but bounded: every object gets a fresh burst
		}
		b = &bucket{tokens: spamBurst, at: now}
		r.buckets[uid] = b
	}
	b.tokens = min(spamBurst, b.tokens+now.Sub(b.at).Seconds()/spamRefill.Seconds())
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Run writes buffered events until ctx ends.
func (r *Recorder) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case q := <-r.ch:
			ev := q.ev
			wctx, cancel := context.WithTimeout(ctx, recorderWriteTTL)
			if err := r.write(wctx, ev, q.key); err != nil && ctx.Err() == nil {
				r.log.Debug("write event", "reason", ev.Reason, "object", ev.InvolvedObject.Name, "err", err)
			}
			cancel()
		}
	}
}

// write creates ev, or bumps the count (and updates the message, which
// differs for combined events) of the event written recently under key.
func (r *Recorder) write(ctx context.Context, ev *corev1.Event, key string) error {
	now := ev.LastTimestamp.Time
	r.mu.Lock()
	s := r.seen[key]
	if s != nil && now.Sub(s.last) > repeatWindow {
		s = nil
	}
	var patch []byte
	var target seenEvent
	if s != nil {
		s.count++
		s.last = now
		target = *s
		patch, _ = json.Marshal(map[string]any{"count": s.count, "lastTimestamp": ev.LastTimestamp, "message": ev.Message})
	}
	r.mu.Unlock()

	events := r.client.CoreV1().Events(ev.Namespace)
	if patch != nil {
		_, err := events.Patch(ctx, target.name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("update event count: %w", err)
		}
		// Gone (expired or deleted): write it afresh.
	}
	created, err := events.Create(ctx, ev, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create event: %w", err)
	}
	r.mu.Lock()
	if _, ok := r.seen[key]; !ok {
		r.order = append(r.order, key)
	}
	r.seen[key] = &seenEvent{name: created.Name, namespace: created.Namespace, count: 1, first: now, last: now}
	for len(r.order) > recorderCache {
		delete(r.seen, r.order[0])
		r.order = r.order[1:]
	}
	r.mu.Unlock()
	return nil
}

// referenceTo builds the involvedObject of an event about obj. Objects from
// typed informers carry no TypeMeta, so the kind comes from the scheme.
func referenceTo(obj Object) corev1.ObjectReference {
	gvk := obj.GetObjectKind().GroupVersionKind()
	if gvk.Kind == "" {
		if kinds, _, err := scheme.Scheme.ObjectKinds(obj); err == nil && len(kinds) > 0 {
			gvk = kinds[0]
		}
	}
	apiVersion, kind := gvk.ToAPIVersionAndKind()
	return corev1.ObjectReference{
		APIVersion:      apiVersion,
		Kind:            kind,
		Namespace:       obj.GetNamespace(),
		Name:            obj.GetName(),
		UID:             obj.GetUID(),
		ResourceVersion: obj.GetResourceVersion(),
	}
}
