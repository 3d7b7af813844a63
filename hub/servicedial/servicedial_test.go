package servicedial

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

func kind(t *testing.T, resource string) *registry.Kind {
	t.Helper()
	for _, k := range registry.All() {
		if k.Resource == resource {
			return k
		}
	}
	t.Fatalf("no kind %s", resource)
	return nil
}

func create(t *testing.T, st *storage.Storage, resource, ns string, obj runtime.Object) runtime.Object {
	t.Helper()
	out, err := st.Create(context.Background(), kind(t, resource), ns, obj, storage.Options{})
	if err != nil {
		t.Fatalf("create %s: %v", resource, err)
	}
	return out
}

// fixture stores Service "web" (port 80 "http" → 8080 on pod a on node
// n1, pod b on node n2 unready), Service "empty" without endpoints and
// Service "far" whose only pod runs on n2.
func fixture(t *testing.T) *storage.Storage {
	t.Helper()
	db, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st, err := storage.New(storage.Config{Store: db, Kinds: registry.All(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	create(t, st, "namespaces", "", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}})
	create(t, st, "serviceaccounts", "ns", &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}})
	for _, p := range []struct{ name, node, ip string }{{"a", "n1", "10.9.0.1"}, {"b", "n2", "10.9.0.2"}} {
		pod := create(t, st, "pods", "ns", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name},
			Spec: corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "c", Image: "img"}}}}).(*corev1.Pod)
		pod.Status.PodIP, pod.Status.PodIPs = p.ip, []corev1.PodIP{{IP: p.ip}}
		if _, err := st.Update(context.Background(), kind(t, "pods"), "ns", p.name, pod, storage.Options{Subresource: "status"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"web", "empty", "far"} {
		create(t, st, "services", "ns", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}})
	}
	ref := func(pod string) *corev1.ObjectReference {
		return &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: pod}
	}
	slice := func(name, svc string, eps ...discoveryv1.Endpoint) {
		create(t, st, "endpointslices", "ns", &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
			Endpoints:   eps,
		})
	}
	slice("web-1", "web",
		discoveryv1.Endpoint{Addresses: []string{"10.9.0.1"}, TargetRef: ref("a"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		discoveryv1.Endpoint{Addresses: []string{"10.9.0.2"}, TargetRef: ref("b"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}})
	slice("far-1", "far", discoveryv1.Endpoint{Addresses: []string{"10.9.0.2"}, TargetRef: ref("b")})
	return st
}

func TestDialService(t *testing.T) {
	st := fixture(t)
	// The backend answers one line naming itself.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "hello from a")
			c.Close()
		}
	}()
	var mu sync.Mutex
	var dialed []string
	errNoTunnel := errors.New("node is not connected")
	d := &Dialer{Storage: st, DialPod: func(ctx context.Context, node, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, node+"/"+addr)
		mu.Unlock()
		if node != "n1" || addr != "10.9.0.1:8080" {
			return nil, errNoTunnel
		}
		var nd net.Dialer
		return nd.DialContext(ctx, "tcp", ln.Addr().String())
	}}
	ctx := context.Background()

	c, err := d.DialService(ctx, "ns", "web", 80)
	if err != nil {
		t.Fatalf("dial web:80: %v", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if err != nil || line != "hello from a\n" {
		t.Fatalf("read from web:80: %q, %v", line, err)
	}
	if len(dialed) != 1 || dialed[0] != "n1/10.9.0.1:8080" {
		t.Fatalf("dialed %v, want the ready endpoint through n1", dialed)
	}

	for _, tc := range []struct {
		name    string
		port    int32
		code    int32 // 0: not a Status error
		message string
		is      error
	}{
		{"missing", 80, 404, `services "missing" not found`, nil},
		{"web", 81, 503, `no service port 81 found for service "web"`, nil},
		{"empty", 80, 503, `no endpoints available for service "empty"`, nil},
		{"far", 80, 0, `node "n2"`, errNoTunnel},
	} {
		_, err := d.DialService(ctx, "ns", tc.name, tc.port)
		if err == nil || !strings.Contains(err.Error(), tc.message) {
			t.Errorf("dial %s:%d: %v, want an error saying %s", tc.name, tc.port, err, tc.message)
			continue
		}
		if tc.code != 0 {
			var se apierrors.APIStatus
			if !errors.As(err, &se) || se.Status().Code != tc.code {
				t.Errorf("dial %s:%d: %v, want status %d", tc.name, tc.port, err, tc.code)
			}
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("dial %s:%d: %v does not wrap %v", tc.name, tc.port, err, tc.is)
		}
	}
}

func TestEndpointPortNotServed(t *testing.T) {
	d := &Dialer{Storage: fixture(t)}
	_, _, err := d.Endpoint(context.Background(), "ns", "web", "metrics")
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), `no endpoints available for service "web:metrics"`) {
		t.Fatalf("endpoint of web:metrics: %v", err)
	}
	node, addr, err := d.Endpoint(context.Background(), "ns", "web", "http")
	if err != nil || node != "n1" || addr != "10.9.0.1:8080" {
		t.Fatalf("endpoint of web:http: %s %s %v", node, addr, err)
	}
}
