package edge_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/sim"
)

// proxyMetrics reads a node server path through the hub's node proxy
// with kubectl get --raw and parses it as Prometheus text.
func proxyMetrics(t *testing.T, e *env, node, path string) (map[string]*dto.MetricFamily, error) {
	t.Helper()
	body, err := e.hub.Run("get", "--raw", "/api/v1/nodes/"+node+"/proxy"+path)
	if err != nil {
		return nil, fmt.Errorf("kubectl get --raw: %w: %s", err, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(strings.NewReader(body))
}

// sampleValue finds the sample of family name with exactly the labels
// want.
func sampleValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	for _, m := range fams[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		match := len(got) == len(want)
		for k, v := range want {
			match = match && got[k] == v
		}
		if !match {
			continue
		}
		if m.GetCounter() != nil {
			return m.GetCounter().GetValue(), true
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

// TestUsageThroughHub runs a sim node whose pod is annotated with a
// usage: the agent pushes samples on the tunnel, and the node's
// /metrics/resource and /metrics/cadvisor, read through the hub's node
// proxy, show the pod's container with the annotated usage, following a
// change of the annotation.
func TestUsageThroughHub(t *testing.T) {
	e := startHub(t)
	ctx := context.Background()
	a := startAgent(t, edge.Config{
		HubURL: e.url, Token: e.token, DataDir: filepath.Join(t.TempDir(), "edge"), NodeName: "usage-1",
		MetricsPeriod: 200 * time.Millisecond,
	})
	waitNodeReady(t, e, "usage-1")
	pod := newPod("busy", "usage-1", map[string]string{sim.CPUUsage: "250m", sim.MemoryUsage: "64Mi"}, corev1.RestartPolicyAlways)
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, e, "busy", "Ready", podReady)

	eventually(t, 10*time.Second, "usage pushes", func() (bool, string) {
		s := a.Stats()
		return s.UsagePushes >= 3 && s.UsagePushedBytes > 0, fmt.Sprintf("%d pushes, %d bytes", s.UsagePushes, s.UsagePushedBytes)
	})
	if s := a.Stats(); s.UsagePushes > 0 {
		t.Logf("%d usage pushes, %d bytes (%.1f per push)", s.UsagePushes, s.UsagePushedBytes, float64(s.UsagePushedBytes)/float64(s.UsagePushes))
	}
	fams, err := proxyMetrics(t, e, "usage-1", "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := sampleValue(fams, "tether_edge_usage_pushes_total", nil); !ok || v < 3 {
		t.Errorf("tether_edge_usage_pushes_total %v (%v)", v, ok)
	}

	app := map[string]string{"container": "app", "pod": "busy", "namespace": "default"}
	var cpu1 float64
	var t1 time.Time
	eventually(t, 10*time.Second, "the pod's container in /metrics/resource", func() (bool, string) {
		fams, err := proxyMetrics(t, e, "usage-1", "/metrics/resource")
		if err != nil {
			return false, err.Error()
		}
		ws, ok := sampleValue(fams, "container_memory_working_set_bytes", app)
		if !ok || ws != 64<<20 {
			return false, fmt.Sprintf("working set %v (%v)", ws, ok)
		}
		for _, name := range []string{"node_cpu_usage_seconds_total", "node_memory_working_set_bytes"} {
			if _, ok := sampleValue(fams, name, map[string]string{}); !ok {
				return false, "no " + name
			}
		}
		if _, ok := sampleValue(fams, "pod_cpu_usage_seconds_total", map[string]string{"pod": "busy", "namespace": "default"}); !ok {
			return false, "no pod_cpu_usage_seconds_total"
		}
		if v, _ := sampleValue(fams, "scrape_error", map[string]string{}); v != 0 {
			return false, "scrape_error"
		}
		cpu1, _ = sampleValue(fams, "container_cpu_usage_seconds_total", app)
		t1 = time.Now()
		return true, ""
	})
	time.Sleep(time.Second)

	// The annotation changes on the running pod.
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"128Mi"}}}`, sim.MemoryUsage)
	if _, err := e.client.CoreV1().Pods("default").Patch(ctx, "busy", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the new working set in /metrics/cadvisor", func() (bool, string) {
		fams, err := proxyMetrics(t, e, "usage-1", "/metrics/cadvisor")
		if err != nil {
			return false, err.Error()
		}
		for _, m := range fams["container_memory_working_set_bytes"].GetMetric() {
			lbl := map[string]string{}
			for _, l := range m.GetLabel() {
				lbl[l.GetName()] = l.GetValue()
			}
			if lbl["container"] != "app" || lbl["pod"] != "busy" {
				continue
			}
			if !strings.HasPrefix(lbl["id"], "/") || lbl["image"] != "registry.example/app:1" || lbl["name"] == "" {
				return false, fmt.Sprintf("labels %v", lbl)
			}
			return m.GetGauge().GetValue() == 128<<20, fmt.Sprintf("working set %v", m.GetGauge().GetValue())
		}
		return false, "no container"
	})
	fams, err = proxyMetrics(t, e, "usage-1", "/metrics/resource")
	if err != nil {
		t.Fatal(err)
	}
	cpu2, _ := sampleValue(fams, "container_cpu_usage_seconds_total", app)
	if rate := (cpu2 - cpu1) / time.Since(t1).Seconds(); rate < 0.2 || rate > 0.3 {
		t.Errorf("container CPU rose at %.3f cores, want 0.25", rate)
	}
}
