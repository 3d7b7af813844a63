package apiserver

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pipeListener hands out the server ends of net.Pipes, standing in for
// tunnel streams to a node agent.
type pipeListener struct {
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{} }

func TestNodeProxyAndPodStreams(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	agent := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.RequestURI())
		mu.Unlock()
		if r.Header.Get("Authorization") != "" {
			t.Errorf("the hub's credentials reached the node: %q", r.Header.Get("Authorization"))
		}
		switch {
		case r.URL.Path == "/healthz":
			fmt.Fprint(w, "ok")
		case strings.HasPrefix(r.URL.Path, "/containerLogs/"):
			fmt.Fprintf(w, "log of %s tail=%s\n", r.URL.Path, r.URL.Query().Get("tailLines"))
		default:
			http.Error(w, "exec is not supported by this runtime", http.StatusNotImplemented)
		}
	})
	ln := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	go func() { _ = http.Serve(ln, agent) }()
	t.Cleanup(func() { ln.Close() })
	dial := func(ctx context.Context, node string) (net.Conn, error) {
		if node != "n1" {
			return nil, ErrNodeNotConnected
		}
		c1, c2 := net.Pipe()
		select {
		case ln.conns <- c2:
			return c1, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	h := newHubWith(t, func(c *Config) { c.DialNode = dial })
	ctx := context.Background()
	for _, n := range []string{"n1", "n2"} {
		if _, err := h.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	raw := func(path string) (string, error) {
		b, err := h.cs.CoreV1().RESTClient().Get().AbsPath(path).DoRaw(ctx)
		return string(b), err
	}
	if out, err := raw("/api/v1/nodes/n1/proxy/healthz"); err != nil || out != "ok" {
		t.Fatalf("proxy healthz: %q %v", out, err)
	}
	// Errors are Status objects (DoRaw would hide their message).
	rawErr := func(path string) error { return h.cs.CoreV1().RESTClient().Get().AbsPath(path).Do(ctx).Error() }
	err := rawErr("/api/v1/nodes/n2/proxy/healthz")
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), `node "n2" is not connected`) {
		t.Fatalf("proxy to a disconnected node: %v", err)
	}
	if err := rawErr("/api/v1/nodes/nope/proxy/healthz"); !apierrors.IsNotFound(err) {
		t.Fatalf("proxy to an unknown node: %v", err)
	}

	pods := h.cs.CoreV1().Pods("default")
	mk := func(name, node string, containers ...string) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: node}}
		for _, c := range containers {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "img"})
		}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk("one", "n1", "app")
	mk("two", "n1", "app", "side")
	mk("pending", "", "app")
	tail := int64(5)
	out, err := pods.GetLogs("one", &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
	if err != nil || string(out) != "log of /containerLogs/default/one/app tail=5\n" {
		t.Fatalf("logs: %q %v", out, err)
	}
	if err := pods.GetLogs("two", &corev1.PodLogOptions{}).Do(ctx).Error(); !apierrors.IsBadRequest(err) ||
		!strings.Contains(err.Error(), "a container name must be specified for pod two, choose one of: [app side]") {
		t.Fatalf("logs without a container: %v", err)
	}
	if out, err := pods.GetLogs("two", &corev1.PodLogOptions{Container: "side"}).DoRaw(ctx); err != nil || !strings.Contains(string(out), "/two/side") {
		t.Fatalf("logs of side: %q %v", out, err)
	}
	if err := pods.GetLogs("pending", &corev1.PodLogOptions{}).Do(ctx).Error(); !apierrors.IsBadRequest(err) ||
		!strings.Contains(err.Error(), "does not have a host assigned") {
		t.Fatalf("logs of an unscheduled pod: %v", err)
	}
	// exec reaches the agent, whose own answer comes back.
	resp, err := h.srv.Client().Do(mustReq(t, h, "POST", "/api/v1/namespaces/default/pods/one/exec?command=ls&stdout=true"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotImplemented || !strings.Contains(string(body), "not supported") {
		t.Fatalf("exec: %d %s", resp.StatusCode, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := "/exec/default/one/app?command=ls&stdout=true"; seen[len(seen)-1] != want {
		t.Errorf("agent saw %q, want %q", seen[len(seen)-1], want)
	}
}

func mustReq(t *testing.T, h *hub, method, path string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer good")
	return req
}
