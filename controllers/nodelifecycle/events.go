package nodelifecycle

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// eventSink records Events through the hub. The broadcaster queues events
// and writes them in the background, so recording never blocks a sync.
type eventSink struct {
	broadcaster record.EventBroadcaster
	record.EventRecorder
}

func newEventSink(client kubernetes.Interface, component string) *eventSink {
	b := record.NewBroadcaster()
	return &eventSink{broadcaster: b, EventRecorder: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component})}
}

// start begins writing; stop flushes what it can and ends.
func (s *eventSink) start(client kubernetes.Interface) {
	s.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
}

func (s *eventSink) stop() { s.broadcaster.Shutdown() }
