package kube_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/edge/kube"
	"github.com/tether-edge/tether/hub/hubtest"
)

// sentTypes records the Content-Type of the requests with a body and the
// Accept header of all of them.
type sentTypes struct {
	next http.RoundTripper

	mu                   sync.Mutex
	contentTypes, accept map[string]bool
}

func (s *sentTypes) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	if req.Body != nil && req.Method != http.MethodPatch {
		s.contentTypes[req.Header.Get("Content-Type")] = true
	}
	s.accept[req.Header.Get("Accept")] = true
	s.mu.Unlock()
	return s.next.RoundTrip(req)
}

// TestClientAgainstHub drives every verb the agent uses against a real
// hub, in protobuf as the agent speaks it, writes an Event through the
// sink the agent's event recorder uses and requests a service account
// token.
func TestClientAgainstHub(t *testing.T) {
	h := hubtest.Start(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	sent := &sentTypes{contentTypes: map[string]bool{}, accept: map[string]bool{}}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { sent.next = rt; return sent }
	c, err := kube.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	cms := c.ConfigMaps("default")
	w, err := c.ConfigMaps("").Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", "kube-test").String()})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()
	created, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-test"}, Data: map[string]string{"a": "1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := cms.Create(ctx, created, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create again: %v, want AlreadyExists", err)
	}
	created.Data["b"] = "2"
	if _, err := cms.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update: %v", err)
	}
	patched, err := cms.Patch(ctx, "kube-test", types.StrategicMergePatchType, []byte(`{"data":{"c":"3"}}`), metav1.PatchOptions{})
	if err != nil || len(patched.Data) != 3 {
		t.Fatalf("patch: %v, data %v", err, patched.Data)
	}
	got, err := cms.Get(ctx, "kube-test", metav1.GetOptions{})
	if err != nil || got.Data["c"] != "3" {
		t.Fatalf("get: %v, data %v", err, got.Data)
	}
	list, err := c.ConfigMaps("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=kube-test"})
	if err != nil || len(list.Items) != 1 || list.ResourceVersion == "" {
		t.Fatalf("list: %v, %d items, resourceVersion %q", err, len(list.Items), list.ResourceVersion)
	}
	if err := cms.Delete(ctx, "kube-test", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &created.UID}}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := cms.Get(ctx, "kube-test", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get deleted: %v, want NotFound", err)
	}
	var seen []watch.EventType
	for len(seen) < 4 {
		select {
		case ev := <-w.ResultChan():
			if _, ok := ev.Object.(*corev1.ConfigMap); !ok {
				t.Fatalf("watch event %s of %T", ev.Type, ev.Object)
			}
			seen = append(seen, ev.Type)
		case <-ctx.Done():
			t.Fatalf("watch saw %v, want ADDED, MODIFIED×2, DELETED", seen)
		}
	}
	if want := []watch.EventType{watch.Added, watch.Modified, watch.Modified, watch.Deleted}; !slices.Equal(seen, want) {
		t.Fatalf("watch saw %v, want %v", seen, want)
	}

	// Every group the agent reads answers in its own path.
	if _, err := c.Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list nodes: %v", err)
	}
	if _, err := c.EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list endpointslices: %v", err)
	}
	if _, err := c.Ingresses("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list ingresses: %v", err)
	}
	if _, err := c.RuntimeClasses().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list runtimeclasses: %v", err)
	}

	// The event sink: created in the event's namespace, then its count
	// patched as the broadcaster does for a repeated event.
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "kube-test.1", Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "default", Name: "p"},
		Reason:         "Pulled", Message: "pulled", Type: corev1.EventTypeNormal, Count: 1,
		Source: corev1.EventSource{Component: "kubelet", Host: "n"},
	}
	sink := c.Events()
	if _, err := sink.Create(ev); err != nil {
		t.Fatalf("create event: %v", err)
	}
	out, err := sink.Patch(ev, []byte(`{"count":2}`))
	if err != nil || out.Count != 2 {
		t.Fatalf("patch event: %v, count %d", err, out.Count)
	}

	// The serviceaccounts/token subresource, as projected volumes ask.
	h.MustRun("create", "serviceaccount", "kube-test")
	tr, err := c.CreateToken(ctx, "default", "kube-test", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"vault"}}}, metav1.CreateOptions{})
	if err != nil || tr.Status.Token == "" || tr.Status.ExpirationTimestamp.IsZero() {
		t.Fatalf("create token: %v, status %+v", err, tr.Status)
	}

	sent.mu.Lock()
	defer sent.mu.Unlock()
	for ct := range sent.contentTypes {
		if ct != "application/vnd.kubernetes.protobuf" {
			t.Errorf("sent a body as %q, want protobuf", ct)
		}
	}
	for a := range sent.accept {
		if !strings.HasPrefix(a, "application/vnd.kubernetes.protobuf") {
			t.Errorf("accepted %q, want protobuf first", a)
		}
	}
}
