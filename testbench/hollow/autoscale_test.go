package hollow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/edge/sim"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/testbench/hollow"
)

// The periods of the autoscaling test: every node pushes its usage each
// metricsPeriod and the hub's autoscaler controller syncs each
// HorizontalPodAutoscaler each hpaSyncPeriod.
const (
	metricsPeriod = time.Second
	hpaSyncPeriod = time.Second
	// nodeGrace is the hub's node monitor grace period: the shortest it
	// takes, not upstream's 40s, which NodeCutOff would only wait out.
	nodeGrace = 15 * time.Second
	// reactionRounds is how many load steps the HPA's reaction time is
	// measured over.
	reactionRounds = 3
)

// TestAutoscaleEndToEnd runs resource metrics and autoscaling end to end:
// 100 hollow nodes push their pods' synthetic usage (the sim annotations)
// to a real hub, which serves it as metrics.k8s.io and feeds its own
// HorizontalPodAutoscaler controller from it; every user-facing step is
// real kubectl. It shows kubectl top over the fleet, a Deployment scaled
// up under load and back down after its stabilization window, kubectl
// autoscale of the concept pages' ReplicaSet, and a node cut off: gone
// from the metrics API, and the scale of the workload with a pod on it
// held. The HPA's reaction to a load step is reported as BENCH figures.
func TestAutoscaleEndToEnd(t *testing.T) {
	started := time.Now()
	h := hubtest.Start(t, fmt.Sprintf("--horizontal-pod-autoscaler-sync-period=%v", hpaSyncPeriod),
		// NodeCutOff waits for a node to be taken as unreachable.
		fmt.Sprintf("--node-monitor-grace-period=%v", nodeGrace))
	t.Logf("hub built and ready in %v (load average %s)", time.Since(started).Round(time.Millisecond), loadAverage())
	started = time.Now()
	token, rc := joinToken(t, h)
	rc.QPS, rc.Burst = 100, 200
	kube := kubernetes.NewForConfigOrDie(rc)

	// 99 nodes run to the end; one more, in a fleet of its own, is cut
	// off later.
	const n = 100
	fleet := func(prefix string, n int, window time.Duration) (*hollow.Fleet, func()) {
		f, err := hollow.New(hollow.Config{
			HubURL: "https://" + h.Addr, Token: token, N: n, DataDir: t.TempDir(), NamePrefix: prefix,
			StartWindow: window, Sim: sim.Config{StartDelay: 100 * time.Millisecond},
			MetricsPeriod: metricsPeriod,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- f.Run(ctx) }()
		stopped := false
		stop := func() {
			if stopped {
				return
			}
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("fleet %s: %v", prefix, err)
			}
		}
		t.Cleanup(stop)
		return f, stop
	}
	rest, _ := fleet("hollow-", n-1, 3*time.Second)
	cut, cutOff := fleet("cut-", 1, 0)
	w := &waiter{t: t, start: started}
	w.progress("all registered", "every node registered", 30*time.Second, 30*time.Second, func() (int, int, string) {
		s, c := rest.Stats(), cut.Stats()
		return s.Registered + c.Registered, n, s.String()
	})

	cutNode := cut.Agents()[0].NodeName()

	t.Run("TopNodes", func(t *testing.T) {
		var names []string
		waitFor(t, "metrics of every node", 60*time.Second, func() (bool, string) {
			names = nodeMetricNames(t, h)
			return len(names) == n, fmt.Sprintf("%d of %d nodes in metrics.k8s.io", len(names), n)
		})
		top := topNodes(t, h, "top", "nodes")
		if len(top) != n {
			t.Fatalf("kubectl top nodes lists %d nodes, want %d", len(top), n)
		}
		for name, cpu := range top {
			if cpu < 0 {
				t.Errorf("kubectl top nodes: %s has no CPU figure", name)
			}
		}
		sorted := h.MustRun("top", "node", "--sort-by=cpu", "--no-headers")
		var prev int64 = -1
		lines := strings.Split(strings.TrimSpace(sorted), "\n")
		if len(lines) != n {
			t.Fatalf("kubectl top node --sort-by=cpu lists %d nodes, want %d:\n%s", len(lines), n, sorted)
		}
		for _, l := range lines {
			cpu := millicores(strings.Fields(l)[1])
			if prev >= 0 && cpu > prev {
				t.Fatalf("kubectl top node --sort-by=cpu is not sorted by CPU, descending:\n%s", sorted)
			}
			prev = cpu
		}
	})

	// The workload of the node cut off: one pod on that node, one on
	// another, at the target's usage, so that the HPA keeps two. The cut
	// node is then cordoned, so that nothing else lands on it.
	h.MustRun("label", "node", cutNode, "hollow.tether.dev/pair=yes")
	h.MustRun("label", "node", rest.Agents()[0].NodeName(), "hollow.tether.dev/pair=yes")
	apply(t, h, `
apiVersion: apps/v1
kind: Deployment
metadata: {name: pair, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: pair}}
  template:
    metadata:
      labels: {app: pair}
      annotations: {sim.tether.dev/cpu-usage: 50m}
    spec:
      nodeSelector: {hollow.tether.dev/pair: "yes"}
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {matchLabels: {app: pair}}
            topologyKey: kubernetes.io/hostname
      containers:
      - name: app
        image: app:1
        resources: {requests: {cpu: 100m}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: pair, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: pair}
  minReplicas: 1
  maxReplicas: 4
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
  behavior:
    scaleDown: {stabilizationWindowSeconds: 0}
`)
	waitRunning(t, kube, "app=pair", 2)
	waitHPA(t, kube, "pair", "ScalingActive=True with both pods sampled", func(hpa *autoscalingv2.HorizontalPodAutoscaler) bool {
		return hasCondition(hpa, autoscalingv2.ScalingActive, corev1.ConditionTrue, "ValidMetricFound") &&
			currentCPU(hpa) == 50 && hpa.Status.DesiredReplicas == 2
	})
	h.MustRun("cordon", cutNode)

	t.Run("Group", func(t *testing.T) {
		t.Run("ScaleUpAndDown", func(t *testing.T) {
			t.Parallel()
			scaleUpAndDown(t, h, kube)
		})
		t.Run("AutoscaleReplicaSet", func(t *testing.T) {
			t.Parallel()
			autoscaleReplicaSet(t, h, kube)
		})
		t.Run("NodeCutOff", func(t *testing.T) {
			t.Parallel()
			nodeCutOff(t, h, kube, cutNode, cutOff)
		})
	})
	t.Logf("the test took %v after the hub was ready (load average %s)", time.Since(started).Round(time.Millisecond), loadAverage())
}

// scaleUpAndDown loads a Deployment's pods (kubectl annotate) and checks
// the HPA's scale up, its conditions and events, and its scale down once
// the load is gone and the stabilization window passed; then it measures
// the HPA's reaction to a load step over a few more rounds.
func scaleUpAndDown(t *testing.T, h *hubtest.Hub, kube kubernetes.Interface) {
	apply(t, h, `
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations: {sim.tether.dev/cpu-usage: 10m}
    spec:
      containers:
      - name: app
        image: app:1
        resources: {requests: {cpu: 100m}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 4
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
  behavior:
    scaleDown: {stabilizationWindowSeconds: 5}
`)
	waitRunning(t, kube, "app=web", 1)
	waitHPA(t, kube, "web", "the idle pod sampled", func(hpa *autoscalingv2.HorizontalPodAutoscaler) bool {
		return currentCPU(hpa) == 10 && hpa.Status.DesiredReplicas == 1
	})

	// reactions are the times from a load step to the HPA's first scale
	// decision; full, to its decision on the scale the load asks for: a
	// sample is a CPU rate over the metrics period, so the first one
	// after the step may hold part of it only.
	var reactions, full []time.Duration
	for round := range reactionRounds {
		// Load: the one pod at 250% of its request asks for five; the
		// HPA allows four. New pods start from the template, idle; the
		// first sample of the loaded pod alone decides the scale up.
		loaded := time.Now()
		h.MustRun("annotate", "pods", "-l", "app=web", "sim.tether.dev/cpu-usage=250m", "--overwrite")
		hpa := waitHPA(t, kube, "web", "a scale up", func(hpa *autoscalingv2.HorizontalPodAutoscaler) bool {
			return hpa.Status.DesiredReplicas > 1
		})
		reaction := time.Since(loaded)
		reactions = append(reactions, reaction)
		first := hpa.Status.DesiredReplicas
		waitHPA(t, kube, "web", "desired replicas 4", func(hpa *autoscalingv2.HorizontalPodAutoscaler) bool {
			return hpa.Status.DesiredReplicas == 4
		})
		full = append(full, time.Since(loaded))
		t.Logf("round %d: the HPA decided on %d replicas %v after the load annotation, on 4 after %v", round, first,
			reaction.Round(time.Millisecond), full[round].Round(time.Millisecond))
		if round == 0 {
			// The first sample after the step may hold part of it only:
			// the maximum limits the scale once a full one is in.
			waitHPA(t, kube, "web", "ScalingLimited=True TooManyReplicas", func(hpa *autoscalingv2.HorizontalPodAutoscaler) bool {
				return hasCondition(hpa, autoscalingv2.ScalingLimited, corev1.ConditionTrue, "TooManyReplicas")
			})
			waitEvent(t, kube, "web", "SuccessfulRescale", "New size: 4; reason: cpu resource utilization (percentage of request) above target")
		}
		waitRunning(t, kube, "app=web", 4)
		if round == 0 {
			// Every pod at 90%: as kubectl shows it.
			h.MustRun("annotate", "pods", "-l", "app=web", "sim.tether.dev/cpu-usage=90m", "--overwrite")
			waitHPA(t, kube, "web", "every pod at 90%", func(hpa *autoscalingv2.HorizontalPodAutoscaler) bool {
				return currentCPU(hpa) == 90
			})
			if got := h.MustRun("get", "hpa", "web"); !strings.Contains(got, "cpu: 90%/50%") {
				t.Errorf("kubectl get hpa web: want TARGETS cpu: 90%%/50%%, got:\n%s", got)
			}
			var obj autoscalingv2.HorizontalPodAutoscaler
			if err := json.Unmarshal([]byte(h.MustRun("get", "hpa.v2.autoscaling", "web", "-o", "json")), &obj); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				typ    autoscalingv2.HorizontalPodAutoscalerConditionType
				reason string
			}{{autoscalingv2.AbleToScale, ""}, {autoscalingv2.ScalingActive, "ValidMetricFound"}, {autoscalingv2.ScalingLimited, "TooManyReplicas"}} {
				if got := condition(&obj, c.typ); got.Status != corev1.ConditionTrue || c.reason != "" && got.Reason != c.reason {
					t.Errorf("kubectl get hpa -o json: want %s=True %s, got %+v", c.typ, c.reason, obj.Status.Conditions)
				}
			}
		}

		// Unload: every pod at 10% asks for one, which comes after the
		// five seconds of the scale-down stabilization window.
		unloaded := time.Now()
		h.MustRun("annotate", "pods", "-l", "app=web", "sim.tether.dev/cpu-usage=10m", "--overwrite")
		waitHPA(t, kube, "web", "desired replicas 1", func(hpa *autoscalingv2.HorizontalPodAutoscaler) bool {
			return hpa.Status.DesiredReplicas == 1
		})
		down := time.Since(unloaded)
		t.Logf("round %d: the HPA scaled down to 1 replica %v after the load went", round, down.Round(time.Millisecond))
		if down < 5*time.Second {
			t.Errorf("round %d: scaled down %v after the load went, within the 5s stabilization window", round, down)
		}
		if round == 0 {
			waitEvent(t, kube, "web", "SuccessfulRescale", "New size: 1; reason: All metrics below target")
			describe := h.MustRun("describe", "hpa", "web")
			for _, want := range []string{
				"New size: 4; reason: cpu resource utilization (percentage of request) above target",
				"New size: 1; reason: All metrics below target",
				"AbleToScale", "ScalingActive", "ValidMetricFound", "ScalingLimited",
			} {
				if !strings.Contains(describe, want) {
					t.Errorf("kubectl describe hpa web lacks %q:\n%s", want, describe)
				}
			}
		}
		waitRunning(t, kube, "app=web", 1)
		waitHPA(t, kube, "web", "the one pod at 10%", func(hpa *autoscalingv2.HorizontalPodAutoscaler) bool {
			return currentCPU(hpa) == 10 && hpa.Status.CurrentReplicas == 1
		})
	}
	t.Logf("HPA reaction to a load step: first decision %v, full scale %v, metrics period %v, sync period %v",
		reactions, full, metricsPeriod, hpaSyncPeriod)
	for _, r := range []struct {
		name  string
		times []time.Duration
	}{{"hpa_reaction_p50", reactions}, {"hpa_reaction_full_scale_p50", full}} {
		slices.Sort(r.times)
		benchfmt.Report(t, benchfmt.Figure{Name: r.name, Value: r.times[len(r.times)/2].Seconds(), Unit: "s",
			Extra: []string{fmt.Sprintf("rounds=%d", len(r.times)), fmt.Sprintf("metrics_period_s=%g", metricsPeriod.Seconds()),
				fmt.Sprintf("sync_period_s=%g", hpaSyncPeriod.Seconds()), fmt.Sprintf("max_s=%.3f", r.times[len(r.times)-1].Seconds())}})
	}
}

// autoscaleReplicaSet runs the concept pages' kubectl autoscale on their
// frontend ReplicaSet: one idle replica goes to the minimum of three.
func autoscaleReplicaSet(t *testing.T, h *hubtest.Hub, kube kubernetes.Interface) {
	apply(t, h, `
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: frontend
  namespace: default
  labels: {app: guestbook, tier: frontend}
spec:
  replicas: 1
  selector:
    matchLabels: {tier: frontend}
  template:
    metadata:
      labels: {tier: frontend}
      annotations: {sim.tether.dev/cpu-usage: 5m}
    spec:
      containers:
      - name: php-redis
        image: us-docker.pkg.dev/google-samples/containers/gke/gb-frontend:v5
        resources: {requests: {cpu: 100m}}
`)
	waitRunning(t, kube, "tier=frontend", 1)
	h.MustRun("autoscale", "rs", "frontend", "--max=10", "--min=3", "--cpu-percent=50")
	waitFor(t, "ReplicaSet frontend scaled to 3", 60*time.Second, func() (bool, string) {
		rs, err := kube.AppsV1().ReplicaSets("default").Get(context.Background(), "frontend", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return *rs.Spec.Replicas == 3, fmt.Sprintf("replicas %d", *rs.Spec.Replicas)
	})
	waitEvent(t, kube, "frontend", "SuccessfulRescale", "New size: 3; reason: Current number of replicas below Spec.MinReplicas")
	waitRunning(t, kube, "tier=frontend", 3)
	waitHPA(t, kube, "frontend", "three idle replicas sampled", func(hpa *autoscalingv2.HorizontalPodAutoscaler) bool {
		return currentCPU(hpa) == 5 && hpa.Status.CurrentReplicas == 3 && hpa.Status.DesiredReplicas == 3
	})
	if got := h.MustRun("get", "hpa", "frontend"); !strings.Contains(got, "cpu: 5%/50%") {
		t.Errorf("kubectl get hpa frontend: want TARGETS cpu: 5%%/50%%, got:\n%s", got)
	}
}

// nodeCutOff stops the agent of one node: the node's metrics go from the
// metrics API at once, and once the hub's node lifecycle controller has
// taken the node as not ready, the HPA of the workload with a pod there
// holds its scale though the other pod's usage would scale it down.
func nodeCutOff(t *testing.T, h *hubtest.Hub, kube kubernetes.Interface, node string, cutOff func()) {
	cutOff()
	cutAt := time.Now()
	waitFor(t, node+" gone from metrics.k8s.io", 30*time.Second, func() (bool, string) {
		names := nodeMetricNames(t, h)
		return !slices.Contains(names, node), fmt.Sprintf("%d nodes listed", len(names))
	})
	top := h.MustRun("top", "nodes", "--no-headers")
	found := false
	for _, l := range strings.Split(top, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == node {
			found = true
			if f[1] != "<unknown>" {
				t.Errorf("kubectl top nodes: want %s <unknown>, got %q", node, l)
			}
		}
	}
	if !found {
		t.Errorf("kubectl top nodes does not list %s:\n%s", node, top)
	}

	// The hub's node lifecycle takes a silent node as unreachable after
	// its grace period (nodeGrace).
	waitFor(t, node+" not Ready", 90*time.Second, func() (bool, string) {
		n, err := kube.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status != corev1.ConditionTrue, fmt.Sprintf("Ready=%s", c.Status)
			}
		}
		return false, "no Ready condition"
	})
	t.Logf("%s taken as not ready %v after its agent stopped", node, time.Since(cutAt).Round(time.Millisecond))

	// The pod left would ask for one replica.
	pods, err := kube.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=pair"})
	if err != nil {
		t.Fatal(err)
	}
	var left string
	for _, p := range pods.Items {
		if p.Spec.NodeName != node {
			left = p.Name
			h.MustRun("annotate", "pod", p.Name, "sim.tether.dev/cpu-usage=5m", "--overwrite")
		}
	}
	hpa := waitHPA(t, kube, "pair", "ScalingActive=False NodesUnreachable", func(hpa *autoscalingv2.HorizontalPodAutoscaler) bool {
		return hasCondition(hpa, autoscalingv2.ScalingActive, corev1.ConditionFalse, "NodesUnreachable")
	})
	if c := condition(hpa, autoscalingv2.ScalingActive); !strings.Contains(c.Message, "1 of 2 pods of the target are on nodes the hub cannot reach; holding the scale at 2 replicas") {
		t.Errorf("ScalingActive message: %q", c.Message)
	}
	// The remaining pod's sample is in the metrics API by now.
	waitFor(t, "the remaining pod's 5m in metrics.k8s.io", 30*time.Second, func() (bool, string) {
		raw := h.MustRun("get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/"+left)
		return strings.Contains(raw, `"cpu":"5m"`), raw
	})
	time.Sleep(3 * hpaSyncPeriod)
	var obj autoscalingv2.HorizontalPodAutoscaler
	if err := json.Unmarshal([]byte(h.MustRun("get", "hpa.v2.autoscaling", "pair", "-o", "json")), &obj); err != nil {
		t.Fatal(err)
	}
	if !hasCondition(&obj, autoscalingv2.ScalingActive, corev1.ConditionFalse, "NodesUnreachable") || obj.Status.DesiredReplicas != 2 {
		t.Errorf("HPA pair with a node cut off: desired %d, conditions %+v", obj.Status.DesiredReplicas, obj.Status.Conditions)
	}
	d, err := kube.AppsV1().Deployments("default").Get(context.Background(), "pair", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 2 {
		t.Errorf("Deployment pair scaled to %d while a pod's node is unreachable, want 2 held", *d.Spec.Replicas)
	}
	if describe := h.MustRun("describe", "hpa", "pair"); !strings.Contains(describe, "NodesUnreachable") {
		t.Errorf("kubectl describe hpa pair lacks NodesUnreachable:\n%s", describe)
	}
}

// apply runs kubectl apply -f - with manifest.
func apply(t *testing.T, h *hubtest.Hub, manifest string) {
	t.Helper()
	if _, err := h.RunInput(context.Background(), manifest, nil, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls check every 200ms until it reports done, failing the test
// with check's last state after limit.
func waitFor(t *testing.T, what string, limit time.Duration, check func() (bool, string)) {
	t.Helper()
	end := time.Now().Add(limit)
	for {
		ok, state := check()
		if ok {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("waited %v for %s: %s (load average %s)", limit, what, state, loadAverage())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitRunning waits until exactly want pods match selector in default,
// all running and none being deleted.
func waitRunning(t *testing.T, kube kubernetes.Interface, selector string, want int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d running pods %s", want, selector), 60*time.Second, func() (bool, string) {
		l, err := kube.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		running := 0
		for _, p := range l.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running++
			}
		}
		return running == want && len(l.Items) == want, fmt.Sprintf("%d of %d running", running, len(l.Items))
	})
}

// waitHPA polls the HorizontalPodAutoscaler name in default every 50ms
// until ok holds, and returns it.
func waitHPA(t *testing.T, kube kubernetes.Interface, name, what string, ok func(*autoscalingv2.HorizontalPodAutoscaler) bool) *autoscalingv2.HorizontalPodAutoscaler {
	t.Helper()
	end := time.Now().Add(60 * time.Second)
	for {
		hpa, err := kube.AutoscalingV2().HorizontalPodAutoscalers("default").Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && ok(hpa) {
			return hpa
		}
		if time.Now().After(end) {
			status := any(err)
			if err == nil {
				status = hpa.Status
			}
			t.Fatalf("waited 60s for HPA %s: %s; last: %+v (load average %s)", name, what, status, loadAverage())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitEvent waits for an event of the HPA name with reason and a message
// holding msg.
func waitEvent(t *testing.T, kube kubernetes.Interface, name, reason, msg string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("event %s %q", reason, msg), 30*time.Second, func() (bool, string) {
		l, err := kube.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.kind=HorizontalPodAutoscaler,involvedObject.name=" + name})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range l.Items {
			if ev.Reason == reason && strings.Contains(ev.Message, msg) {
				return true, ""
			}
			seen = append(seen, ev.Reason+": "+ev.Message)
		}
		return false, fmt.Sprintf("events %q", seen)
	})
}

func condition(hpa *autoscalingv2.HorizontalPodAutoscaler, typ autoscalingv2.HorizontalPodAutoscalerConditionType) autoscalingv2.HorizontalPodAutoscalerCondition {
	for _, c := range hpa.Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return autoscalingv2.HorizontalPodAutoscalerCondition{}
}

func hasCondition(hpa *autoscalingv2.HorizontalPodAutoscaler, typ autoscalingv2.HorizontalPodAutoscalerConditionType, status corev1.ConditionStatus, reason string) bool {
	c := condition(hpa, typ)
	return c.Status == status && c.Reason == reason
}

// currentCPU is the HPA's current average CPU utilization, -1 when it has
// none.
func currentCPU(hpa *autoscalingv2.HorizontalPodAutoscaler) int32 {
	for _, m := range hpa.Status.CurrentMetrics {
		if m.Resource != nil && m.Resource.Name == corev1.ResourceCPU && m.Resource.Current.AverageUtilization != nil {
			return *m.Resource.Current.AverageUtilization
		}
	}
	return -1
}

// nodeMetricNames lists the nodes in metrics.k8s.io, read with kubectl get
// --raw.
func nodeMetricNames(t *testing.T, h *hubtest.Hub) []string {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata struct{ Name string } `json:"metadata"`
			Usage    map[string]string     `json:"usage"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(h.MustRun("get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes")), &list); err != nil {
		t.Fatalf("decode NodeMetricsList: %v", err)
	}
	var names []string
	for _, it := range list.Items {
		names = append(names, it.Metadata.Name)
	}
	return names
}

// topNodes runs kubectl with args (a top nodes command) and returns each
// node's CPU in millicores, -1 where it is not a quantity.
func topNodes(t *testing.T, h *hubtest.Hub, args ...string) map[string]int64 {
	t.Helper()
	out := h.MustRun(append(args, "--no-headers")...)
	got := map[string]int64{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 {
			t.Fatalf("kubectl %s: line %q", strings.Join(args, " "), l)
		}
		got[f[0]] = millicores(f[1])
	}
	return got
}

// millicores parses a CPU column of kubectl top, -1 when it is not a
// quantity.
func millicores(s string) int64 {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return -1
	}
	return q.MilliValue()
}
