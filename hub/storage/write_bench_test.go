package storage

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// BenchmarkPodWrites runs the storage side of one scheduled pod's writes,
// without HTTP: create, binding, a Scheduled event and a status update of
// the kind a node agent sends.
func BenchmarkPodWrites(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	pods := kind(b, "", "v1", "pods")
	events := kind(b, "", "v1", "events")
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for i := range b.N {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i), Namespace: "default",
				Labels: map[string]string{"app": "bench", "shard": fmt.Sprint(i % 16)}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "app", Image: "registry.example/app:1.0", Command: []string{"/app", "--serve"},
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}},
			}}},
		}
		out, err := f.s.Create(ctx, pods, "default", p, Options{FieldManager: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		pod := out.(*corev1.Pod)
		bd := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: "default", UID: pod.UID},
			Target: corev1.ObjectReference{Kind: "Node", Name: fmt.Sprintf("node-%d", i%100)}}
		if err := f.s.Bind(ctx, "default", bd, Options{FieldManager: "scheduler"}); err != nil {
			b.Fatal(err)
		}
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod.Name, i), Namespace: "default"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
			Reason:         "Scheduled", Message: "Successfully assigned", Type: corev1.EventTypeNormal,
			FirstTimestamp: now, LastTimestamp: now, Count: 1, Source: corev1.EventSource{Component: "default-scheduler"},
		}
		if _, err := f.s.Create(ctx, events, "default", ev, Options{FieldManager: "scheduler"}); err != nil {
			b.Fatal(err)
		}
		if _, err := f.s.GuaranteedUpdate(ctx, pods, "default", pod.Name, Options{FieldManager: "kubelet", Subresource: "status"},
			func(cur runtime.Object) (runtime.Object, error) {
				p := cur.(*corev1.Pod)
				p.Status.Phase = corev1.PodRunning
				p.Status.PodIP = fmt.Sprintf("10.42.%d.%d", (i/250)%250, i%250+1)
				p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now})
				return p, nil
			}); err != nil {
			b.Fatal(err)
		}
	}
	// The writes wait for the store's commits: CPU time per pod says
	// more than the rate.
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/pod")
}

// processCPU is the user and system time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
