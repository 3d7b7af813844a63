package streaming_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/sim"
	"github.com/tether-edge/tether/edge/streaming"
)

func TestNodeServer(t *testing.T) {
	rt := sim.New(sim.Config{LogInterval: 20 * time.Millisecond})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "till", UID: "uid-till"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "till:1"}}},
	}
	net := edge.Network{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.42.0.0/24")}}
	if err := rt.SyncPod(context.Background(), pod, net); err != nil {
		t.Fatal(err)
	}
	defer rt.RemovePod(context.Background(), pod.UID)
	h := streaming.NewServer(streaming.Config{
		Runtime: rt,
		Pods:    func() []*corev1.Pod { return []*corev1.Pod{pod} },
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "tether_edge_pods 1\n") }),
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "tether_edge_pods 1") {
		t.Fatalf("/metrics: %d %q", code, body)
	}
	code, body := get("/pods")
	var list corev1.PodList
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil || list.Kind != "PodList" || len(list.Items) != 1 || list.Items[0].Name != "till" {
		t.Fatalf("/pods: %d %v %s", code, err, body)
	}

	time.Sleep(70 * time.Millisecond) // a few log lines
	code, body = get("/containerLogs/shop/till/app")
	if code != 200 || !strings.HasPrefix(body, "sim: container app started") || strings.Count(body, "\n") < 3 {
		t.Fatalf("logs: %d %q", code, body)
	}
	if code, body = get("/containerLogs/shop/till/app?tailLines=1&timestamps=true"); code != 200 || strings.Count(body, "\n") != 1 || !strings.Contains(body, "Z sim: ") {
		t.Fatalf("tail with timestamps: %d %q", code, body)
	}
	if code, body = get("/containerLogs/shop/till/app?limitBytes=5"); code != 200 || body != "sim: " {
		t.Fatalf("limitBytes: %d %q", code, body)
	}
	if code, body = get("/containerLogs/shop/till/app?sinceSeconds=3600"); code != 200 || !strings.HasPrefix(body, "sim: container app started") {
		t.Fatalf("sinceSeconds: %d %q", code, body)
	}
	for path, want := range map[string]int{
		"/containerLogs/shop/till/nope":                                              404,
		"/containerLogs/shop/other/app":                                              404,
		"/containerLogs/shop/till/app?tailLines=-1":                                  400,
		"/containerLogs/shop/till/app?limitBytes=0":                                  400,
		"/containerLogs/shop/till/app?follow=maybe":                                  400,
		"/containerLogs/shop/till/app?previous=true":                                 404,
		"/containerLogs/shop/till/app?sinceSeconds=1&sinceTime=2026-01-01T00:00:00Z": 400,
	} {
		if code, body := get(path); code != want {
			t.Errorf("%s: %d %q, want %d", path, code, body, want)
		}
	}

	// Follow streams lines as they are written.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/containerLogs/shop/till/app?follow=true&tailLines=0", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 256)
	n, err := resp.Body.Read(buf)
	if err != nil || !strings.Contains(string(buf[:n]), "is running: line") {
		t.Fatalf("followed log: %q %v", buf[:n], err)
	}
}
