package edge

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/tether-edge/tether/edge/kube"
)

// eventRecorder turns a runtime's PodEvents into Kubernetes Events whose
// source is the kubelet of this node, through client-go's broadcaster: an
// event repeated within ten minutes is folded into one object whose count
// grows, and a spam filter bounds each object's rate, as on any kubelet.
// Events are best effort: while the hub is unreachable the sink retries a
// few times and then drops them; they are not part of the node's durable
// state.
type eventRecorder struct {
	b   record.EventBroadcaster
	rec record.EventRecorder
}

func newEventRecorder(c *kube.Client, node string) *eventRecorder {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(c.Events())
	return &eventRecorder{b: b, rec: b.NewRecorder(c.Scheme(), corev1.EventSource{Component: "kubelet", Host: node})}
}

// record implements the EventReporter callback; it does not block.
func (e *eventRecorder) record(ev PodEvent) {
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ev.Namespace, Name: ev.Name, UID: ev.UID, FieldPath: ev.FieldPath}
	e.emit(ref, ev.Warning, ev.Reason, ev.Message)
}

// node records an event about the node itself. As the kubelet's, its
// reference carries the node's name as UID, and the event goes to the
// default namespace.
func (e *eventRecorder) node(name string, warning bool, reason, message string) {
	ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: types.UID(name)}
	e.emit(ref, warning, reason, message)
}

func (e *eventRecorder) emit(ref *corev1.ObjectReference, warning bool, reason, message string) {
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	e.rec.Event(ref, typ, reason, message)
}

func (e *eventRecorder) stop() { e.b.Shutdown() }
