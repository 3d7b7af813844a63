package hollow_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/sim"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/testbench/hollow"
)

// Uplink cost of resource metrics. TETHER_USAGE_BENCH_FULL=1 pushes at the
// default period (15s) over a 5-minute window; the short mode CI runs
// pushes every 3s over 30s. Both report the cost at the default period:
// the bytes one push takes on the wire, four times a minute.
const (
	usageBenchPods     = 50
	usageDefaultPeriod = 15 * time.Second
)

// TestUsageUplink measures what a node's resource metrics cost its uplink
// with 50 pods whose usage changes at every reading (the sim runtime's
// jitter: CPU within ±30 % of each pod's own level, working set within
// ±2 %): the tunnel's wire bytes of a node that pushes usage, less those
// of a node that does not, in the same run with the same pods. The peer is what
// metrics-server's scrape of the same node would send up the same link:
// the kubelet-format /metrics/resource of that node (the agent serves
// it), gzip-compressed as client-go asks for it, with its HTTP response
// head, TLS records and TCP/IP headers, at metrics-server's default
// resolution of 15s.
func TestUsageUplink(t *testing.T) {
	full := os.Getenv("TETHER_USAGE_BENCH_FULL") != ""
	period, window := 3*time.Second, 30*time.Second
	if full {
		period, window = usageDefaultPeriod, 5*time.Minute
	}
	h := hubtest.Start(t)
	defer h.Stop()
	token, rc := joinToken(t, h)
	rc.QPS, rc.Burst = 200, 400
	client := kubernetes.NewForConfigOrDie(rc)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fleets := map[string]*hollow.Fleet{}
	for prefix, p := range map[string]time.Duration{"pushes-": period, "silent-": 0} {
		f, err := hollow.New(hollow.Config{
			HubURL: "https://" + h.Addr, Token: token, N: 1, Sites: 1, NamePrefix: prefix,
			DataDir: t.TempDir(), Sim: sim.Config{StartDelay: 50 * time.Millisecond, UsageJitter: 0.3}, MetricsPeriod: p,
		})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- f.Run(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("fleet %s: %v", prefix, err)
			}
		}()
		fleets[prefix] = f
	}
	nodes := []string{"pushes-00000", "silent-00000"}
	w := &waiter{t: t, start: time.Now()}
	w.progress("nodes Ready", "both nodes Ready", 2*time.Minute, 30*time.Second, func() (int, int, string) {
		return readyNodes(client), 2, ""
	})
	// The same 50 pods on each node, bound directly.
	rng := rand.New(rand.NewPCG(1, 2))
	base := make([]float64, usageBenchPods)
	for i := range base {
		base[i] = float64(20 + rng.IntN(400)) // millicores
	}
	for _, node := range nodes {
		for i := range usageBenchPods {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-shop-app-%02d", node[:6], i), Namespace: "default",
					Annotations: usageAnnotations(base[i])},
				Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app"}}},
			}
			if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	w.progress("pods Running", "every pod Running", 2*time.Minute, 30*time.Second, func() (int, int, string) {
		l, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, 2 * usageBenchPods, err.Error()
		}
		n := 0
		for _, p := range l.Items {
			if p.Status.Phase == corev1.PodRunning {
				n++
			}
		}
		return n, 2 * usageBenchPods, ""
	})
	// Let the first full samples and the pods' first status writes pass.
	time.Sleep(2*period + 5*time.Second)
	s0 := map[string]edge.Stats{}
	for prefix, f := range fleets {
		s0[prefix] = f.Agents()[0].Stats()
	}
	time.Sleep(window)
	s1 := map[string]edge.Stats{}
	for prefix, f := range fleets {
		s1[prefix] = f.Agents()[0].Stats()
	}
	pushes := s1["pushes-"].UsagePushes - s0["pushes-"].UsagePushes
	if pushes < int64(window/period)-1 {
		t.Fatalf("%d pushes in %v at a period of %v", pushes, window, period)
	}
	if n := s1["silent-"].UsagePushes; n != 0 {
		t.Fatalf("the node without metrics pushed %d samples", n)
	}
	sent := func(p string) float64 { return float64(s1[p].TunnelBytesSent - s0[p].TunnelBytesSent) }
	wirePerPush := (sent("pushes-") - sent("silent-")) / float64(pushes)
	payloadPerPush := float64(s1["pushes-"].UsagePushedBytes-s0["pushes-"].UsagePushedBytes) / float64(pushes)
	perMin := float64(time.Minute / usageDefaultPeriod)

	// The peer: one scrape of the same node's /metrics/resource.
	body, err := client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/pushes-00000/proxy/metrics/resource").DoRaw(ctx)
	if err != nil {
		t.Fatalf("read /metrics/resource: %v", err)
	}
	if !bytes.Contains(body, []byte("container_cpu_usage_seconds_total")) {
		t.Fatalf("/metrics/resource has no container CPU:\n%.500s", body)
	}
	scrape := scrapeWireBytes(t, body)
	t.Logf("usage uplink: %.0f pushes, %.0f payload and %.0f wire bytes a push; scrape body %d bytes, %.0f on the wire; load average %s",
		float64(pushes), payloadPerPush, wirePerPush, len(body), scrape, loadAverage())
	benchfmt.Report(t, benchfmt.Figure{
		Name: "metrics_uplink_per_node_50_pods", Value: wirePerPush * perMin / 1000, Unit: "KB/min", Target: "<=2",
		Peer: "metrics_server_scrape", PeerValue: scrape * perMin / 1000, Mode: benchfmt.Mode(full),
		Extra: []string{fmt.Sprintf("payload_bytes_per_push=%.0f", payloadPerPush), fmt.Sprintf("measured_period_s=%.0f", period.Seconds()),
			fmt.Sprintf("pushes=%d", pushes), fmt.Sprintf("scrape_body_bytes=%d", len(body))},
	})
}

// usageAnnotations are a sim pod's usage: cpu millicores, and a working
// set that grows with it.
func usageAnnotations(millicores float64) map[string]string {
	return map[string]string{
		sim.CPUUsage:    fmt.Sprintf("%dm", int(math.Round(millicores))),
		sim.MemoryUsage: fmt.Sprintf("%dKi", int(math.Round(32<<10+millicores*256))),
	}
}

// scrapeWireBytes is what a kubelet's answer to one metrics-server scrape
// of body sends up the node's link: the body gzip-compressed (client-go
// asks for gzip), a response head as the kubelet writes it, TLS records
// (5-byte header and 16-byte AEAD tag per record of at most 16 KiB) and
// TCP/IPv4 headers with timestamps (52 bytes per segment of at most 1448
// bytes), plus the TCP acknowledgement of the request.
func scrapeWireBytes(t *testing.T, body []byte) float64 {
	t.Helper()
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(body)
	zw.Close()
	const head = "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8; escaping=underscores\r\nDate: Sun, 29 Nov 2026 12:00:00 GMT\r\nContent-Length: 00000\r\n\r\n"
	payload := float64(len(head) + z.Len())
	records := math.Ceil(payload / 16384)
	tls := payload + records*21
	segments := math.Ceil(tls / 1448)
	return tls + segments*52 + 52
}
