package autoscaling

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestResourceReplicas checks the replica calculation of a utilization
// target against upstream's rules: ceil(ready × ratio), the 0.1
// tolerance, pods without samples counted as idle on a scale up and as
// at their request on a scale down, unready pods left out of a scale
// down and counted as idle on a scale up, CPU samples of starting pods
// left out, pending and deleted pods skipped, and a missing request
// refused with upstream's message.
func TestResourceReplicas(t *testing.T) {
	now := t0
	type tc struct {
		name     string
		pods     []*corev1.Pod
		usage    map[string]int64 // millicores by pod
		target   int32
		resource corev1.ResourceName
		want     int32
		wantUtil int32
		wantErr  string
	}
	deleted := func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: now} }
	pending := func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }
	// Ready ten seconds ago, within the CPU initialization period: its
	// sample covers time before it was ready.
	justReady := func(p *corev1.Pod) {
		p.Status.StartTime = &metav1.Time{Time: now.Add(-time.Minute)}
		p.Status.Conditions[0].LastTransitionTime = metav1.Time{Time: now.Add(-10 * time.Second)}
	}
	noRequest := func(p *corev1.Pod) { p.Spec.Containers[0].Resources.Requests = nil }
	three := func(opts ...podOpt) []*corev1.Pod {
		return []*corev1.Pod{testPod("web-0", opts...), testPod("web-1"), testPod("web-2")}
	}
	cases := []tc{
		{name: "scale up", pods: three(), usage: map[string]int64{"web-0": 900, "web-1": 900, "web-2": 900}, target: 50, want: 6, wantUtil: 90},
		{name: "scale down", pods: three(), usage: map[string]int64{"web-0": 100, "web-1": 100, "web-2": 100}, target: 50, want: 1, wantUtil: 10},
		{name: "within tolerance above", pods: three(), usage: map[string]int64{"web-0": 540, "web-1": 540, "web-2": 540}, target: 50, want: 3, wantUtil: 54},
		{name: "within tolerance below", pods: three(), usage: map[string]int64{"web-0": 460, "web-1": 460, "web-2": 460}, target: 50, want: 3, wantUtil: 46},
		{name: "just outside tolerance", pods: three(), usage: map[string]int64{"web-0": 560, "web-1": 560, "web-2": 560}, target: 50, want: 4, wantUtil: 56},
		// 2 sampled at 90%: ratio 1.8; the missing one as 0: 60% -> 1.2.
		{name: "missing on scale up counts as idle", pods: three(), usage: map[string]int64{"web-1": 900, "web-2": 900}, target: 50, want: 4, wantUtil: 90},
		// 2 at 10% of an 80% target; the missing one at 100%: 40% -> 0.5.
		{name: "missing on scale down counts as its request", pods: three(), usage: map[string]int64{"web-1": 100, "web-2": 100}, target: 80, want: 2, wantUtil: 10},
		// 2 at 40% of a 50% target; the missing one at 100% makes it 60%: the
		// direction would turn, so no change.
		{name: "missing would reverse direction", pods: three(), usage: map[string]int64{"web-1": 400, "web-2": 400}, target: 50, want: 3, wantUtil: 40},
		{name: "unready on scale up counts as idle", pods: three(unready), usage: map[string]int64{"web-0": 0, "web-1": 900, "web-2": 900}, target: 50, want: 4, wantUtil: 90},
		{name: "unready ignored on scale down", pods: three(unready), usage: map[string]int64{"web-0": 900, "web-1": 100, "web-2": 100}, target: 50, want: 1, wantUtil: 10},
		{name: "cpu of a pod ready within its sample window is left out", pods: three(justReady), usage: map[string]int64{"web-0": 1000, "web-1": 100, "web-2": 100}, target: 50, want: 1, wantUtil: 10},
		{name: "memory counts a just ready pod", pods: three(justReady), usage: map[string]int64{"web-0": 1000, "web-1": 100, "web-2": 100}, target: 50, resource: corev1.ResourceMemory, want: 3, wantUtil: 40},
		{name: "pending pod left out", pods: three(pending), usage: map[string]int64{"web-1": 100, "web-2": 100}, target: 50, want: 1, wantUtil: 10},
		{name: "deleted pod left out", pods: three(deleted), usage: map[string]int64{"web-0": 1000, "web-1": 900, "web-2": 900}, target: 50, want: 4, wantUtil: 90},
		{name: "missing request", pods: three(noRequest), usage: map[string]int64{"web-0": 100, "web-1": 100, "web-2": 100}, target: 50, wantErr: "missing request for cpu in container app of Pod web-0"},
		{name: "no pods", usage: map[string]int64{"web-0": 100}, target: 50, wantErr: "no pods returned by selector while calculating replica count"},
		{name: "no samples of ready pods", pods: three(), usage: map[string]int64{}, target: 50, wantErr: "did not receive metrics for targeted pods (pods might be unready)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := c.resource
			if res == "" {
				res = corev1.ResourceCPU
			}
			samples := map[string]PodMetric{}
			for name, v := range c.usage {
				if res == corev1.ResourceMemory {
					// A memory sample in milli-bytes of the 1Gi request.
					v = v * (1 << 30)
				}
				samples[name] = sample(v, now)
			}
			lister, _ := podLister(c.pods...)
			calc := &calculator{
				metrics: &fakeMetrics{samples: samples}, pods: lister, clock: clocktesting.NewFakePassiveClock(now),
				tolerance: DefaultTolerance, cpuInitialization: DefaultCPUInitializationPeriod, readinessDelay: DefaultInitialReadinessDelay,
			}
			got, err := calc.resourceReplicas(context.Background(), 3, c.target, res, "default", labels.Everything(), "")
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.replicas != c.want || got.utilization != c.wantUtil {
				t.Errorf("replicas, utilization = %d, %d%%; want %d, %d%%", got.replicas, got.utilization, c.want, c.wantUtil)
			}
		})
	}
}

// TestRawResourceReplicas checks an average value target: missing pods
// count as using exactly the target on a scale down.
func TestRawResourceReplicas(t *testing.T) {
	lister, _ := podLister(testPod("web-0"), testPod("web-1"), testPod("web-2"))
	for _, c := range []struct {
		name  string
		usage map[string]int64
		want  int32
		avg   int64
	}{
		{"scale up", map[string]int64{"web-0": 400, "web-1": 400, "web-2": 400}, 6, 400},
		{"hold", map[string]int64{"web-0": 210, "web-1": 200, "web-2": 190}, 3, 200},
		// 2 at 50 of 200; the missing one at 200: 100 -> 0.5.
		{"missing on scale down counts as target", map[string]int64{"web-0": 50, "web-1": 50}, 2, 50},
	} {
		t.Run(c.name, func(t *testing.T) {
			samples := map[string]PodMetric{}
			for n, v := range c.usage {
				samples[n] = sample(v, t0)
			}
			calc := &calculator{
				metrics: &fakeMetrics{samples: samples}, pods: lister, clock: clocktesting.NewFakePassiveClock(t0),
				tolerance: DefaultTolerance, cpuInitialization: DefaultCPUInitializationPeriod, readinessDelay: DefaultInitialReadinessDelay,
			}
			got, avg, _, err := calc.rawResourceReplicas(context.Background(), 3, 200, corev1.ResourceCPU, "default", labels.Everything(), "")
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want || avg != c.avg {
				t.Errorf("replicas, average = %d, %d; want %d, %d", got, avg, c.want, c.avg)
			}
		})
	}
}

// TestContainerResourceReplicas checks a ContainerResource target: only
// the named container's request counts, so a sidecar without one is no
// error.
func TestContainerResourceReplicas(t *testing.T) {
	sidecar := func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "sidecar"})
	}
	lister, _ := podLister(testPod("web-0", sidecar), testPod("web-1", sidecar))
	calc := &calculator{
		metrics: &fakeMetrics{samples: map[string]PodMetric{"web-0": sample(900, t0), "web-1": sample(900, t0)}},
		pods:    lister, clock: clocktesting.NewFakePassiveClock(t0),
		tolerance: DefaultTolerance, cpuInitialization: DefaultCPUInitializationPeriod, readinessDelay: DefaultInitialReadinessDelay,
	}
	got, err := calc.resourceReplicas(context.Background(), 2, 60, corev1.ResourceCPU, "default", labels.Everything(), "app")
	if err != nil {
		t.Fatal(err)
	}
	if got.replicas != 3 || got.utilization != 90 {
		t.Errorf("replicas, utilization = %d, %d%%; want 3, 90%%", got.replicas, got.utilization)
	}
	// The lister's order, hence the pod named, is not fixed.
	if _, err := calc.resourceReplicas(context.Background(), 2, 60, corev1.ResourceCPU, "default", labels.Everything(), ""); err == nil ||
		!strings.HasPrefix(err.Error(), "missing request for cpu in container sidecar of Pod web-") {
		t.Errorf("whole pod: %v", err)
	}
}
