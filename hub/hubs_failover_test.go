package hub_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
)

// failoverLimit is how soon another hub must run the scheduler and the
// controllers after their leader died.
const failoverLimit = 15 * time.Second

// leaseHolders returns the holders of the scheduler's and the controller
// manager's Leases.
func leaseHolders(ctx context.Context, c kubernetes.Interface) (sched, ctrl string) {
	get := func(name string) string {
		l, err := c.CoordinationV1().Leases("kube-system").Get(ctx, name, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	return get(hub.SchedulerLease), get(hub.ControllerManagerLease)
}

// leaderGauges returns a hub's leader_election_master_status by name.
func leaderGauges(t *testing.T, h *hubtest.Hub) map[string]string {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("read /metrics: %v", err)
	}
	out := map[string]string{}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "leader_election_master_status{name=\""); ok {
			name, val, _ := strings.Cut(rest, "\"} ")
			out[name] = strings.TrimSpace(val)
		}
	}
	return out
}

// readyNode registers a Node that is Ready with room for pods, so that
// the scheduler has somewhere to put them (no agent runs it).
func readyNode(t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	n, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	room := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods: resource.MustParse("500")}
	n.Status = corev1.NodeStatus{Capacity: room, Allocatable: room,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// leaders waits until each Lease has a holder and exactly one live hub
// (cs[i] non-nil) reports leading it, and returns the leading hubs' indexes
// by Lease.
func leaders(t *testing.T, hubs []*hubtest.Hub, cs []kubernetes.Interface) map[string]int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := map[string]int{}
		count := map[string]int{}
		for i, h := range hubs {
			if cs[i] == nil {
				continue
			}
			for name, v := range leaderGauges(t, h) {
				if v == "1" {
					out[name] = i
					count[name]++
				}
			}
		}
		var live kubernetes.Interface
		for _, c := range cs {
			if c != nil {
				live = c
			}
		}
		s, k := leaseHolders(context.Background(), live)
		if s != "" && k != "" && count[hub.SchedulerLease] == 1 && count[hub.ControllerManagerLease] == 1 {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("leases held by %q and %q; hubs leading: %v", s, k, count)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestHubsLeaderFailover runs three hubs on one database: the scheduler and
// the controllers each run on exactly one (the Leases and every hub's
// gauges say which), and when the hubs leading them are killed while
// clients write through the others, another hub takes both Leases,
// schedules a new pod and scales a new Deployment within failoverLimit.
//
// With TETHER_FAILOVER_BENCH=n it kills the leader n times instead
// (restarting each killed hub) and prints the failover times as BENCH
// lines (internal/benchfmt).
func TestHubsLeaderFailover(t *testing.T) {
	hubs := startHubs(t, 3, "--controllers=*,-nodelifecycle")
	cs := make([]kubernetes.Interface, len(hubs))
	for i, h := range hubs {
		cs[i] = clientOf(t, h)
	}
	readyNode(t, cs[0], "failover-node")

	kills := 1
	if n, err := strconv.Atoi(os.Getenv("TETHER_FAILOVER_BENCH")); err == nil && n > 0 {
		kills = n
	}
	var times []time.Duration
	for k := range kills {
		d := killLeader(t, hubs, cs, k)
		times = append(times, d)
		t.Logf("failover %d: %v (load %s)", k, d.Round(time.Millisecond), loadavg())
		if k < kills-1 {
			// Bring the killed hub back as a standby for the next round.
			for i, h := range hubs {
				if cs[i] == nil {
					h.Restart()
					cs[i] = clientOf(t, h)
				}
			}
		}
	}
	slices.Sort(times)
	q := func(p float64) float64 { return times[int(p*float64(len(times)-1))].Seconds() }
	extra := []string{"kills=" + strconv.Itoa(kills), "load=" + loadavg()}
	mode := benchfmt.Mode(kills > 1)
	benchfmt.Report(t, benchfmt.Figure{Name: "hub_failover_p50", Value: q(0.5), Unit: "s", Target: "<=15", Mode: mode, Extra: extra})
	benchfmt.Report(t, benchfmt.Figure{Name: "hub_failover_max", Value: q(1), Unit: "s", Target: "<=15", Mode: mode, Extra: extra})
}

// killLeader kills the hubs leading the scheduler and the controllers
// (SIGKILL) while the others take writes, and returns how long until
// another hub holds both Leases and has scheduled a pod and made a new
// Deployment's pods.
func killLeader(t *testing.T, hubs []*hubtest.Hub, cs []kubernetes.Interface, round int) time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lead := leaders(t, hubs, cs)
	dead := map[int]bool{lead[hub.SchedulerLease]: true, lead[hub.ControllerManagerLease]: true}
	others := []int{}
	for i := range hubs {
		if !dead[i] && cs[i] != nil {
			others = append(others, i)
		}
	}
	// Clients keep writing through the surviving hubs.
	var writes, failed atomic.Int64
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for n := 0; ctx.Err() == nil; n++ {
			c := cs[others[n%len(others)]]
			_, err := c.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("w%d-%d", round, n)}}, metav1.CreateOptions{})
			if err != nil && ctx.Err() == nil {
				failed.Add(1)
			} else {
				writes.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	for i := range dead {
		hubs[i].Kill()
		cs[i] = nil
	}

	c := cs[others[0]]
	pod := fmt.Sprintf("after-%d", round)
	if _, err := c.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dep := fmt.Sprintf("web-%d", round)
	labels := map[string]string{"app": dep}
	if _, err := c.AppsV1().Deployments("default").Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: dep},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var took time.Duration
	for {
		p, err := c.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
		pods, lerr := c.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + dep})
		if err == nil && lerr == nil && p.Spec.NodeName != "" && len(pods.Items) == 2 {
			took = time.Since(killed)
			break
		}
		if time.Since(killed) > 2*failoverLimit {
			s, k := leaseHolders(ctx, c)
			t.Fatalf("no failover %v after the leader was killed: Leases held by %q and %q; pod on %q, %d deployment pods\n%s",
				time.Since(killed).Round(time.Millisecond), s, k, p.Spec.NodeName, len(pods.Items), hubs[others[0]].Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	after := leaders(t, hubs, cs)
	t.Logf("round %d: killed hubs %v, now leading: %v", round, dead, after)
	cancel()
	<-writing
	if failed.Load() > 0 {
		t.Errorf("%d of %d writes through the surviving hubs failed", failed.Load(), writes.Load()+failed.Load())
	}
	if took > failoverLimit {
		t.Errorf("failover took %v, more than %v (load %s)", took.Round(time.Millisecond), failoverLimit, loadavg())
	}
	return took
}
