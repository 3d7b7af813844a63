package scheduler

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
)

// Events are written at most eventQPS a second with bursts of eventBurst:
// kube-scheduler's defaults, the rate limit of its client connection,
// which its events share. Events are a record for people, not state: at a
// burst of thousands of bindings a second, an event per binding would
// double the hub's writes, so most of a burst's Scheduled events are not
// written, as upstream does not write them either.
const (
	eventQPS   = 50
	eventBurst = 100
)

// events writes core/v1 Events as upstream's components do, through
// client-go's record broadcaster: its EventCorrelator counts repeats and
// combines similar events, and its queue of 1,000 events drops what does
// not fit, so recording never slows the scheduler down.
type events struct {
	record.EventRecorder
	broadcaster record.EventBroadcaster
	sink        record.EventSink
}

// newEvents returns an event writer naming component as the source, on a
// client of its own made from rc with the event rate limits. Failed
// writes are logged to log; dropped events are not, as a burst drops
// thousands.
func newEvents(rc *rest.Config, component string, log *slog.Logger) (*events, error) {
	ec := rest.CopyConfig(rc)
	ec.QPS, ec.Burst, ec.RateLimiter = eventQPS, eventBurst, nil
	cs, err := kubernetes.NewForConfig(ec)
	if err != nil {
		return nil, fmt.Errorf("create event client: %w", err)
	}
	logger := logr.FromSlogHandler(log.Handler())
	b := record.NewBroadcaster(record.WithContext(logr.NewContext(context.Background(), logger)))
	return &events{
		EventRecorder: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component}).WithLogger(logr.Discard()),
		broadcaster:   b,
		sink:          &typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")},
	}, nil
}

// start writes recorded events until ctx ends. Events recorded earlier
// are lost.
func (e *events) start(ctx context.Context) {
	e.broadcaster.StartRecordingToSink(e.sink)
	context.AfterFunc(ctx, e.broadcaster.Shutdown)
}
