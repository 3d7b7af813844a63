package hub_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
	metricsclient "k8s.io/metrics/pkg/client/clientset/versioned"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/usage"
	"github.com/tether-edge/tether/tunnel"
)

// usageEdge is a node's tunnel that pushes usage samples as an agent
// does, until stopped.
type usageEdge struct {
	t    *testing.T
	tc   *tunnel.Client
	enc  usage.Encoder
	conn uint64
	stop func()
}

func startUsageEdge(t *testing.T, h *hubtest.Hub, name string) *usageEdge {
	t.Helper()
	id := joinNode(t, h, name)
	pair, err := tls.X509KeyPair(id.cert, id.key)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tunnel.NewClient(tunnel.ClientConfig{
		Addr:  h.Addr,
		TLS:   &tls.Config{ServerName: "127.0.0.1", RootCAs: id.roots(t), Certificates: []tls.Certificate{pair}},
		Hello: func() tunnel.Hello { return tunnel.Hello{Node: name} },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = tc.Run(ctx) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	if err := tc.WaitConnected(t.Context()); err != nil {
		t.Fatal(err)
	}
	return &usageEdge{t: t, tc: tc, stop: stop}
}

// push sends s on the current connection, starting a new stream when
// the connection changed.
func (e *usageEdge) push(s usage.Sample) {
	e.t.Helper()
	if c := e.tc.Conn(); c != e.conn {
		e.enc.Reset()
		e.conn = c
	}
	b, err := e.enc.Encode(s)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.tc.Push(e.conn, b); err != nil {
		e.t.Fatal(err)
	}
}

func ctr(name string, milli int64, mib uint64) usage.Container {
	return usage.Container{Name: name, Usage: usage.Resources{CPUNanoCores: uint64(milli) * 1e6, MemoryWorkingSetBytes: mib << 20}}
}

func nodeSample(milli int64, mib uint64, pods ...usage.Pod) usage.Sample {
	return usage.Sample{Time: time.Now().Truncate(time.Millisecond), Window: 15 * time.Second,
		Node: usage.Resources{CPUNanoCores: uint64(milli) * 1e6, MemoryWorkingSetBytes: mib << 20}, Pods: pods}
}

// createMetricsObjects creates nodes n1..n3 (4 CPUs, 8Gi allocatable)
// and, in namespace top, Running pods web-1 (app=web, on n1) and db-1
// (app=db, on n2) and a Pending pod pending-1 on n1.
func createMetricsObjects(t *testing.T, cs *kubernetes.Clientset) {
	ctx := t.Context()
	for _, name := range []string{"n1", "n2", "n3"} {
		n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"tier": "edge-" + name}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")}
		n.Status.Allocatable = n.Status.Capacity
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "top"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		name, app, node string
		containers      []string
		phase           corev1.PodPhase
	}{
		{"web-1", "web", "n1", []string{"app", "sidecar"}, corev1.PodRunning},
		{"db-1", "db", "n2", []string{"db"}, corev1.PodRunning},
		{"pending-1", "web", "n1", []string{"app"}, corev1.PodPending},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "top", Labels: map[string]string{"app": p.app}},
			Spec: corev1.PodSpec{NodeName: p.node}}
		for _, c := range p.containers {
			pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: c, Image: "busybox"})
		}
		pod, err := cs.CoreV1().Pods("top").Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Status.Phase = p.phase
		if _, err := cs.CoreV1().Pods("top").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// kubectlEventually runs kubectl until its output matches want.
func kubectlEventually(t *testing.T, h *hubtest.Hub, want *regexp.Regexp, args ...string) string {
	t.Helper()
	var out string
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if out, err = h.Run(args...); err == nil && want.MatchString(out) {
			return out
		}
	}
	t.Fatalf("kubectl %s: %v\n%s\nwant match of %s", strings.Join(args, " "), err, out, want)
	return ""
}

// rawGet reads path from the hub with client-go, as kubectl get --raw
// does (a request as fast as a test wants).
func rawGet(t *testing.T, cs *kubernetes.Clientset, path string) (string, error) {
	b, err := cs.CoreV1().RESTClient().Get().RequestURI(path).DoRaw(t.Context())
	var st metav1.Status
	if err != nil && json.Unmarshal(b, &st) == nil && st.Kind == "Status" {
		return string(b), &apierrors.StatusError{ErrStatus: st}
	}
	return string(b), err
}

func mustRaw(t *testing.T, cs *kubernetes.Clientset, path string) string {
	t.Helper()
	out, err := rawGet(t, cs, path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return out
}

// lines returns out's lines with runs of spaces made one.
func lines(out string) []string {
	var ls []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		ls = append(ls, strings.Join(strings.Fields(l), " "))
	}
	return ls
}

// TestMetricsAPIKubectlTop: usage pushed over real tunnels reaches real
// kubectl top and the metrics.k8s.io API as metrics-server serves it:
// nodes and pods, containers, sorting, label selectors, tables, 404s,
// discovery, RBAC; a disconnected node's metrics go at once.
func TestMetricsAPIKubectlTop(t *testing.T) {
	h := hubtest.Start(t, "--disable-scheduler")
	cs := clientFor(t, h)
	createMetricsObjects(t, cs)

	e1, e2 := startUsageEdge(t, h, "n1"), startUsageEdge(t, h, "n2")
	e1.push(nodeSample(1500, 2048,
		usage.Pod{Namespace: "top", Name: "web-1", Containers: []usage.Container{ctr("app", 250, 64), ctr("sidecar", 50, 16)}},
		usage.Pod{Namespace: "top", Name: "pending-1", Containers: []usage.Container{ctr("app", 10, 8)}},
		usage.Pod{Namespace: "top", Name: "gone-1", Containers: []usage.Container{ctr("app", 10, 8)}}))
	e2.push(nodeSample(3000, 1024,
		usage.Pod{Namespace: "top", Name: "db-1", Containers: []usage.Container{ctr("db", 100, 128)}}))

	kubectlEventually(t, h, regexp.MustCompile(`"n2"`), "get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes")
	// Changes after the first full sample: a delta payload.
	e1.push(nodeSample(1000, 2048,
		usage.Pod{Namespace: "top", Name: "web-1", Containers: []usage.Container{ctr("app", 250, 64), ctr("sidecar", 50, 16)}},
		usage.Pod{Namespace: "top", Name: "pending-1", Containers: []usage.Container{ctr("app", 10, 8)}},
		usage.Pod{Namespace: "top", Name: "gone-1", Containers: []usage.Container{ctr("app", 10, 8)}}))
	out := kubectlEventually(t, h, regexp.MustCompile(`n1 +1000m`), "top", "nodes")
	want := []string{
		"NAME CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%)",
		"n1 1000m 25% 2048Mi 25%",
		"n2 3000m 75% 1024Mi 12%",
	}
	got := lines(out)
	if len(got) < 3 || strings.Join(got[:3], "\n") != strings.Join(want, "\n") {
		t.Fatalf("kubectl top nodes:\n%s\nwant first lines:\n%s", out, strings.Join(want, "\n"))
	}
	if len(got) == 4 && !strings.Contains(got[3], "<unknown>") {
		t.Fatalf("kubectl top nodes: n3 has no metrics:\n%s", out)
	}
	if got := lines(h.MustRun("top", "node", "--sort-by=cpu", "-l", "tier in (edge-n1,edge-n2)")); len(got) != 3 || !strings.HasPrefix(got[1], "n2 3000m") || !strings.HasPrefix(got[2], "n1 1000m") {
		t.Fatalf("kubectl top node --sort-by=cpu:\n%s", strings.Join(got, "\n"))
	}
	if got := lines(h.MustRun("top", "node", "n2")); len(got) != 2 || got[1] != "n2 3000m 75% 1024Mi 12%" {
		t.Fatalf("kubectl top node n2:\n%s", strings.Join(got, "\n"))
	}

	out = h.MustRun("top", "pod", "--containers", "-n", "top")
	want = []string{
		"POD NAME CPU(cores) MEMORY(bytes)",
		"db-1 db 100m 128Mi",
		"web-1 app 250m 64Mi",
		"web-1 sidecar 50m 16Mi",
	}
	if got := lines(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("kubectl top pod --containers:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
	if got := lines(h.MustRun("top", "pod", "-n", "top", "-l", "app=web")); len(got) != 2 || got[1] != "web-1 300m 80Mi" {
		t.Fatalf("kubectl top pod -l app=web:\n%s", strings.Join(got, "\n"))
	}
	if got := lines(h.MustRun("top", "pod", "-A", "--sort-by=memory")); len(got) != 3 || got[1] != "top db-1 100m 128Mi" || got[2] != "top web-1 300m 80Mi" {
		t.Fatalf("kubectl top pod -A --sort-by=memory:\n%s", strings.Join(got, "\n"))
	}

	// kubectl get: server-side tables as metrics-server prints them.
	if got := lines(h.MustRun("get", "podmetrics", "-n", "top")); len(got) != 3 || got[0] != "NAME CPU MEMORY WINDOW" || got[1] != "db-1 100m 128Mi 15s" || got[2] != "web-1 300m 80Mi 15s" {
		t.Fatalf("kubectl get podmetrics:\n%s", strings.Join(got, "\n"))
	}
	if got := lines(h.MustRun("get", "nodemetrics", "n1")); len(got) != 2 || got[1] != "n1 1 2Gi 15s" {
		t.Fatalf("kubectl get nodemetrics n1:\n%s", strings.Join(got, "\n"))
	}

	// The raw API: quantities as metrics-server writes them, labels,
	// selectors.
	var nm metricsv1beta1.NodeMetrics
	if err := json.Unmarshal([]byte(mustRaw(t, cs, "/apis/metrics.k8s.io/v1beta1/nodes/n2")), &nm); err != nil {
		t.Fatal(err)
	}
	if cpu, mem := nm.Usage[corev1.ResourceCPU], nm.Usage[corev1.ResourceMemory]; cpu.String() != "3" || nm.Labels["tier"] != "edge-n2" || mem.String() != "1Gi" || nm.Window.Duration != 15*time.Second || nm.Timestamp.IsZero() {
		t.Fatalf("NodeMetrics n2: %+v", nm)
	}
	raw := mustRaw(t, cs, "/apis/metrics.k8s.io/v1beta1/namespaces/top/pods/web-1")
	if !strings.Contains(raw, `"cpu":"250m"`) || !strings.Contains(raw, `"memory":"64Mi"`) || !strings.Contains(raw, `"app":"web"`) {
		t.Fatalf("PodMetrics web-1: %s", raw)
	}
	var pl metricsv1beta1.PodMetricsList
	if err := json.Unmarshal([]byte(mustRaw(t, cs, "/apis/metrics.k8s.io/v1beta1/pods?fieldSelector=metadata.name%3Ddb-1")), &pl); err != nil {
		t.Fatal(err)
	}
	if len(pl.Items) != 1 || pl.Items[0].Name != "db-1" || pl.Items[0].Namespace != "top" {
		t.Fatalf("PodMetrics with metadata.name=db-1: %+v", pl.Items)
	}
	if err := json.Unmarshal([]byte(mustRaw(t, cs, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods")), &pl); err != nil || len(pl.Items) != 0 {
		t.Fatalf("PodMetrics of default: %+v, %v", pl.Items, err)
	}

	// client-go's metrics clientset, as the HorizontalPodAutoscaler
	// controller reads it, in protobuf.
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf"
	mc, err := metricsclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	webs, err := mc.MetricsV1beta1().PodMetricses("top").List(t.Context(), metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil || len(webs.Items) != 1 || webs.Items[0].Name != "web-1" || len(webs.Items[0].Containers) != 2 {
		t.Fatalf("PodMetricses(top).List(app=web) in protobuf: %+v, %v", webs, err)
	}

	// 404s with metrics-server's messages.
	for path, msg := range map[string]string{
		"/apis/metrics.k8s.io/v1beta1/nodes/nope":                        `node "nope" not found`,
		"/apis/metrics.k8s.io/v1beta1/nodes/n3":                          `nodemetrics.metrics.k8s.io "n3" not found`,
		"/apis/metrics.k8s.io/v1beta1/namespaces/top/pods/nope":          `pod "nope" not found`,
		"/apis/metrics.k8s.io/v1beta1/namespaces/top/pods/pending-1":     `podmetrics.metrics.k8s.io "top/pending-1" not found`,
		"/apis/metrics.k8s.io/v1beta1/namespaces/top/pods?watch=true":    `watch is not supported on resources of kind "pods.metrics.k8s.io"`,
		"/apis/metrics.k8s.io/v1beta1/namespaces/top/pods/web-1/status":  `the server could not find the requested resource`,
		"/apis/metrics.k8s.io/v1beta1/namespaces/top/podmetrics/web-1":   `the server could not find the requested resource`,
		"/apis/metrics.k8s.io/v1beta2/nodes":                             `the server could not find the requested resource`,
		"/apis/metrics.k8s.io/v1beta1/namespaces/top/pods/gone-1":        `pod "gone-1" not found`,
		"/apis/metrics.k8s.io/v1beta1/namespaces/kube-system/pods/web-1": `pod "web-1" not found`,
	} {
		code := http.StatusNotFound
		if strings.Contains(path, "watch") {
			code = http.StatusMethodNotAllowed
		}
		out, err := rawGet(t, cs, path)
		var st apierrors.APIStatus
		if !errors.As(err, &st) || int(st.Status().Code) != code || !strings.Contains(err.Error(), msg) {
			t.Errorf("GET %s: %v\n%s\nwant %d %q", path, err, out, code, msg)
		}
	}
	if out, err := h.Run("top", "pod", "pending-1", "-n", "top"); err == nil || !strings.Contains(err.Error(), `podmetrics.metrics.k8s.io "top/pending-1" not found`) {
		t.Errorf("kubectl top pod pending-1: %v\n%s", err, out)
	}

	// Discovery, legacy and aggregated.
	if got := lines(h.MustRun("api-resources", "--api-group=metrics.k8s.io")); len(got) != 3 ||
		got[1] != "nodes metrics.k8s.io/v1beta1 false NodeMetrics" || got[2] != "pods metrics.k8s.io/v1beta1 true PodMetrics" {
		t.Fatalf("kubectl api-resources --api-group=metrics.k8s.io:\n%s", strings.Join(got, "\n"))
	}
	var rl metav1.APIResourceList
	if err := json.Unmarshal([]byte(mustRaw(t, cs, "/apis/metrics.k8s.io/v1beta1")), &rl); err != nil {
		t.Fatal(err)
	}
	for _, r := range rl.APIResources {
		if strings.Join(r.Verbs, ",") != "get,list" {
			t.Errorf("verbs of %s: %v", r.Name, r.Verbs)
		}
	}
	if !strings.Contains(mustRaw(t, cs, "/apis"), `"name":"metrics.k8s.io"`) {
		t.Error("/apis does not list metrics.k8s.io")
	}

	// RBAC: view (aggregated from system:aggregated-metrics-reader) reads
	// pod metrics in its namespace; a user with no role reads none.
	if _, err := cs.RbacV1().RoleBindings("top").Create(t.Context(), &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "viewer"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	viewer, nobody := h.UserKubeconfig("viewer"), h.UserKubeconfig("nobody")
	kubectlEventually(t, h, regexp.MustCompile(`web-1 +300m`), "--kubeconfig", viewer, "top", "pod", "-n", "top")
	if out, err := h.Run("--kubeconfig", nobody, "top", "pod", "-n", "top"); err == nil || !strings.Contains(err.Error(), `cannot list resource "pods" in API group "metrics.k8s.io" in the namespace "top"`) {
		t.Errorf("kubectl top pod as a user with no role: %v\n%s", err, out)
	}

	// A node whose tunnel closes has no metrics from then on.
	e2.stop()
	kubectlEventually(t, h, regexp.MustCompile(`(?m)^n2 +<unknown>`), "top", "nodes")
	if out, err := rawGet(t, cs, "/apis/metrics.k8s.io/v1beta1/nodes/n2"); err == nil || !strings.Contains(err.Error(), `nodemetrics.metrics.k8s.io "n2" not found`) {
		t.Errorf("NodeMetrics of a disconnected node: %v\n%s", err, out)
	}
	if got := lines(h.MustRun("top", "pod", "-n", "top")); len(got) != 2 || !strings.HasPrefix(got[1], "web-1 ") {
		t.Fatalf("kubectl top pod after n2 disconnected:\n%s", strings.Join(got, "\n"))
	}

	// /metrics parses as Prometheus text and counts what the store took.
	// The legacy name rules too, which Prometheus servers before 3.0
	// scrape with.
	text := mustRaw(t, cs, "/metrics")
	legacy := expfmt.NewTextParser(model.LegacyValidation)
	if _, err := legacy.TextToMetricFamilies(strings.NewReader(text)); err != nil {
		t.Errorf("parse /metrics with legacy names: %v", err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	if f := fams["tether_metrics_nodes"]; f == nil || f.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Errorf("tether_metrics_nodes: %v", f)
	}
	if f := fams["tether_metrics_payloads_total"]; f == nil || len(f.GetMetric()) != 2 {
		t.Errorf("tether_metrics_payloads_total: %v", f)
	} else {
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == "decoded" && m.GetCounter().GetValue() != 3 {
				t.Errorf("decoded payloads: %v", m.GetCounter().GetValue())
			}
		}
	}
	if f := fams["tether_metrics_received_bytes_total"]; f == nil || f.GetMetric()[0].GetCounter().GetValue() == 0 {
		t.Errorf("tether_metrics_received_bytes_total: %v", f)
	}
}

// TestMetricsAPIDisabled: a hub started with --disable-metrics-api does
// not serve or list metrics.k8s.io, so metrics-server can be run instead.
func TestMetricsAPIDisabled(t *testing.T) {
	h := hubtest.Start(t, "--disable-scheduler", "--disable-metrics-api")
	if strings.Contains(h.MustRun("get", "--raw", "/apis"), "metrics.k8s.io") {
		t.Error("/apis lists metrics.k8s.io")
	}
	if out := strings.TrimSpace(h.MustRun("api-resources", "--api-group=metrics.k8s.io", "--no-headers")); out != "" {
		t.Errorf("kubectl api-resources --api-group=metrics.k8s.io:\n%s", out)
	}
	if _, err := h.Run("get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes"); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("GET /apis/metrics.k8s.io/v1beta1/nodes: %v", err)
	}
	if _, err := h.Run("top", "nodes"); err == nil || !strings.Contains(err.Error(), "Metrics API not available") {
		t.Errorf("kubectl top nodes: %v", err)
	}
	if strings.Contains(h.MustRun("get", "--raw", "/metrics"), "tether_metrics_nodes") {
		t.Error("/metrics counts a metrics store that does not run")
	}
}
