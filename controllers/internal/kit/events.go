package kit

import (
	"context"
	"log/slog"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// Recorder writes core/v1 Events about objects through client-go's record
// broadcaster, as upstream controllers do. Its EventCorrelator, with
// upstream's defaults, shapes what reaches the hub: an event identical to
// one written in the last ten minutes bumps that event's count; from the
// tenth different message for the same object, type and reason within ten
// minutes on, messages are combined into one event, "(combined from
// similar events): <latest message>", whose count goes up; and each
// object may write a burst of 25 events of a type (creates and count
// updates alike), then one per five minutes. Eventf never blocks a sync:
// the broadcaster queues up to 1,000 events and drops the rest, unlogged.
type Recorder struct {
	client      kubernetes.Interface
	broadcaster record.EventBroadcaster
	rec         record.EventRecorderLogger
}

// NewRecorder returns a recorder whose events name component as their
// source. Failed writes are logged to log; dropped events are not, as a
// burst drops thousands. Call Start before recording: events recorded
// earlier are lost.
func NewRecorder(client kubernetes.Interface, component string, log *slog.Logger) *Recorder {
	if log == nil {
		log = slog.Default()
	}
	logger := logr.FromSlogHandler(log.Handler())
	b := record.NewBroadcaster(record.WithContext(logr.NewContext(context.Background(), logger)))
	return &Recorder{
		client:      client,
		broadcaster: b,
		rec:         b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component}).WithLogger(logr.Discard()),
	}
}

// Start writes recorded events until ctx ends.
func (r *Recorder) Start(ctx context.Context) {
	r.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.client.CoreV1().Events("")})
	context.AfterFunc(ctx, r.broadcaster.Shutdown)
}

// Eventf records an event of type eventType (corev1.EventTypeNormal or
// corev1.EventTypeWarning) about obj, a typed API object. A nil Recorder
// records nothing.
func (r *Recorder) Eventf(obj runtime.Object, eventType, reason, format string, args ...any) {
	if r == nil {
		return
	}
	r.rec.Eventf(obj, eventType, reason, format, args...)
}
