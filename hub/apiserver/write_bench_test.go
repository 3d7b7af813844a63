package apiserver

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/hub/auth"
)

// BenchmarkPodLifecycle drives the writes one scheduled pod costs, through
// client-go over HTTP/2 against a real storage and SQLite store: create,
// pods/binding, a Scheduled event, and a strategic-merge status patch such
// as a node agent sends. Two watches of pods (an informer's and a
// scheduler's) drain every change, so the fan-out is part of the cost.
func BenchmarkPodLifecycle(b *testing.B) {
	b.Run("transport=https", func(b *testing.B) { benchPodLifecycle(b, false) })
	// The hub's own scheduler and controllers call the API in-process.
	b.Run("transport=local", func(b *testing.B) { benchPodLifecycle(b, true) })
}

func benchPodLifecycle(b *testing.B, local bool) {
	h := newHubWith(b, nil)
	// Without client-side rate limits, as the scheduler's client runs.
	rc := *h.cfg
	rc.QPS, rc.Burst = -1, 0
	if local {
		rc = rest.Config{Host: h.cfg.Host, QPS: -1, Transport: h.api.LocalTransport(&auth.User{Name: "bench", Groups: []string{"system:authenticated"}})}
	}
	cs, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		b.Fatal(err)
	}
	h.cs = cs
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen atomic.Int64
	for range 2 {
		w, err := h.cs.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer w.Stop()
		go func(w watch.Interface) {
			for range w.ResultChan() {
				seen.Add(1)
			}
		}(w)
	}
	const workers = 16
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	cpu0 := processCPU()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > b.N {
					return
				}
				if err := podLifecycle(ctx, h, i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pods/s")
	// The machine may be shared: CPU time per pod (client and server,
	// both in this process) is steadier than the rate.
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/pod")
}

// processCPU is the user and system time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func podLifecycle(ctx context.Context, h *hub, i int) error {
	p := listBenchPod(i)
	pod, err := h.cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target: corev1.ObjectReference{Kind: "Node", Name: fmt.Sprintf("node-%d", i%100)}}
	if err := h.cs.CoreV1().Pods("default").Bind(ctx, b, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod.Name, i), Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
		Reason:         "Scheduled", Message: "Successfully assigned default/" + pod.Name + " to " + b.Target.Name,
		Type: corev1.EventTypeNormal, FirstTimestamp: now, LastTimestamp: now, Count: 1,
		Source:              corev1.EventSource{Component: "default-scheduler"},
		ReportingController: "default-scheduler", ReportingInstance: "default-scheduler-bench",
	}
	if _, err := h.cs.CoreV1().Events("default").Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create event: %w", err)
	}
	patch := fmt.Appendf(nil, `{"metadata":{"uid":%q},"status":{"phase":"Running","podIP":"10.42.%d.%d","conditions":[{"type":"Ready","status":"True","lastTransitionTime":%q}]}}`,
		pod.UID, (i/250)%250, i%250+1, now.UTC().Format(time.RFC3339))
	if _, err := h.cs.CoreV1().Pods("default").Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("patch status: %w", err)
	}
	return nil
}
