package deployment_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/controllers/deployment"
	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
	"github.com/tether-edge/tether/controllers/replicaset"
	"github.com/tether-edge/tether/edge/sim"
)

// hubArgs turn off the hub's own copies of the controllers under test,
// which run in the test process instead.
var hubArgs = []string{"--controllers=*,-deployment,-replicaset"}

// start runs a hub, hollow nodes, and the Deployment and ReplicaSet
// controllers.
func start(t *testing.T, nodes int) *kittest.Env {
	t.Helper()
	e := kittest.Start(t, hubArgs, nodes)
	f := e.Factory()
	rs, err := replicaset.New(replicaset.Config{Client: e.ControllerClient(t, "replicaset"), Informers: f, Workers: 4, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	d, err := deployment.New(deployment.Config{Client: e.ControllerClient(t, "deployment"), Informers: f, Workers: 4, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, rs, d)
	return e
}

func nginx(name string, n int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(n),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "nginx", Image: "nginx:1.14.2"}}},
			},
		},
	}
}

// must returns v, panicking (which fails the test with a stack) on err.
func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("unexpected error: %v", err))
	}
	return v
}

// bounds watches a Deployment's pods and records the most pods alive at
// once and the fewest ready ones, once all were first ready.
type bounds struct {
	mu           sync.Mutex
	alive, ready map[types.UID]bool
	maxAlive     int
	minReady     int
	armed        bool
}

func watchBounds(t *testing.T, e *kittest.Env, app string) *bounds {
	b := &bounds{alive: map[types.UID]bool{}, ready: map[types.UID]bool{}, minReady: 1 << 30}
	f := e.Factory()
	inf := f.Core().V1().Pods().Informer()
	update := func(obj any) {
		p, ok := kit.Tombstone(obj).(*corev1.Pod)
		if !ok || p.Labels["app"] != app {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		_, deleted := obj.(cache.DeletedFinalStateUnknown)
		gone := deleted || p.DeletionTimestamp != nil
		b.alive[p.UID] = !gone
		b.ready[p.UID] = !gone && kit.IsPodReady(p)
		alive, ready := 0, 0
		for uid := range b.alive {
			if b.alive[uid] {
				alive++
			}
			if b.ready[uid] {
				ready++
			}
		}
		if b.armed {
			b.maxAlive = max(b.maxAlive, alive)
			b.minReady = min(b.minReady, ready)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, cur any) { update(cur) },
		DeleteFunc: func(obj any) {
			if p, ok := kit.Tombstone(obj).(*corev1.Pod); ok {
				b.mu.Lock()
				b.alive[p.UID], b.ready[p.UID] = false, false
				b.mu.Unlock()
			}
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	return b
}

func (b *bounds) arm() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed, b.maxAlive, b.minReady = true, 0, 1<<30
}

func (b *bounds) get() (maxAlive, minReady int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.maxAlive, b.minReady
}

func rsOf(t *testing.T, e *kittest.Env, d *appsv1.Deployment) []appsv1.ReplicaSet {
	t.Helper()
	list := must(e.Client.AppsV1().ReplicaSets(d.Namespace).List(context.Background(), metav1.ListOptions{}))
	var out []appsv1.ReplicaSet
	for _, rs := range list.Items {
		if metav1.IsControlledBy(&rs, d) {
			out = append(out, rs)
		}
	}
	return out
}

func podImages(t *testing.T, e *kittest.Env, app string) map[string]int {
	t.Helper()
	list := must(e.Client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app}))
	out := map[string]int{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out[p.Spec.Containers[0].Image]++
		}
	}
	return out
}

// TestDeploymentRollout drives one Deployment through kubectl as the
// Deployments concept page does: create, rolling update within the surge
// and unavailability bounds, a stalled rollout on a bad image with its
// progress deadline, rollout undo and history, undo to a revision, and
// pause/resume.
func TestDeploymentRollout(t *testing.T) {
	e := start(t, 3)
	ctx := context.Background()
	api := e.Client.AppsV1().Deployments("default")
	b := watchBounds(t, e, "nginx")

	e.Apply(t, `apiVersion: apps/v1
kind: Deployment
metadata:
  name: nginx
  namespace: default
  labels: {app: nginx}
  annotations: {kubernetes.io/change-cause: create nginx 1.14.2}
spec:
  replicas: 3
  selector: {matchLabels: {app: nginx}}
  template:
    metadata: {labels: {app: nginx}}
    spec:
      containers: [{name: nginx, image: "nginx:1.14.2"}]
`)
	d := must(api.Get(ctx, "nginx", metav1.GetOptions{}))
	out := e.Kubectl(t, "rollout", "status", "deployment/nginx", "--timeout=60s")
	if !strings.Contains(out, `deployment "nginx" successfully rolled out`) {
		t.Fatalf("rollout status: %s", out)
	}
	out = e.Kubectl(t, "get", "deployment", "nginx")
	if !strings.Contains(out, "3/3") {
		t.Errorf("kubectl get deployment: %s", out)
	}
	rss := rsOf(t, e, d)
	if len(rss) != 1 {
		t.Fatalf("%d replicasets, want 1", len(rss))
	}
	hash := rss[0].Labels[appsv1.DefaultDeploymentUniqueLabelKey]
	if rss[0].Name != "nginx-"+hash || hash != kit.TemplateHash(&d.Spec.Template, nil) {
		t.Errorf("replicaset %s with hash %q, want nginx-%s", rss[0].Name, hash, kit.TemplateHash(&d.Spec.Template, nil))
	}
	if rss[0].Annotations[deployment.RevisionAnnotation] != "1" || rss[0].Annotations["kubernetes.io/change-cause"] == "" {
		t.Errorf("replicaset annotations %v", rss[0].Annotations)
	}

	// Rolling update: 3 replicas, default 25%/25% → at most 4 pods, at
	// least 3 ready (unavailable rounds down to 0).
	b.arm()
	e.Kubectl(t, "set", "image", "deployment/nginx", "nginx=nginx:1.16.1")
	e.Kubectl(t, "annotate", "deployment/nginx", "kubernetes.io/change-cause=image 1.16.1", "--overwrite")
	e.Kubectl(t, "rollout", "status", "deployment/nginx", "--timeout=60s")
	if maxAlive, minReady := b.get(); maxAlive > 4 || minReady < 3 {
		t.Errorf("during the rollout: up to %d pods alive (max 4), down to %d ready (min 3)", maxAlive, minReady)
	} else {
		t.Logf("rolling update stayed within bounds: ≤%d pods alive, ≥%d ready", maxAlive, minReady)
	}
	kittest.WaitFor(t, "only new pods", 30*time.Second, func() (bool, error) {
		im := podImages(t, e, "nginx")
		return len(im) == 1 && im["nginx:1.16.1"] == 3, nil
	})
	out = e.Kubectl(t, "describe", "deployment/nginx")
	for _, want := range []string{"ScalingReplicaSet", "Scaled up replica set nginx-", "Scaled down replica set nginx-", "NewReplicaSetAvailable", "MinimumReplicasAvailable"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe deployment lacks %q:\n%s", want, out)
		}
	}

	// A bad image never becomes ready: the rollout stalls with the old
	// pods serving, and the progress deadline fails rollout status.
	e.Kubectl(t, "patch", "deployment/nginx", "-p", `{"spec":{"progressDeadlineSeconds":5,"template":{"metadata":{"annotations":{"`+sim.NotReady+`":"true"}},"spec":{"containers":[{"name":"nginx","image":"nginx:1.161"}]}}}}`)
	_, err := e.Hub.Run("rollout", "status", "deployment/nginx", "--timeout=60s")
	if err == nil || !strings.Contains(err.Error(), "exceeded its progress deadline") {
		t.Errorf("rollout status on a stalled rollout: %v", err)
	}
	cur := must(api.Get(ctx, "nginx", metav1.GetOptions{}))
	st := cur.Status
	if st.Replicas != 4 || st.UpdatedReplicas != 1 || st.AvailableReplicas != 3 || st.UnavailableReplicas != 1 {
		t.Errorf("stalled status %+v, want 4 total / 1 updated / 3 available / 1 unavailable", st)
	}
	if c := condition(cur, appsv1.DeploymentProgressing); c == nil || c.Status != corev1.ConditionFalse || c.Reason != "ProgressDeadlineExceeded" {
		t.Errorf("Progressing condition %+v, want False ProgressDeadlineExceeded", c)
	}

	// Undo goes back to 1.16.1, as revision 4.
	e.Kubectl(t, "rollout", "undo", "deployment/nginx")
	e.Kubectl(t, "rollout", "status", "deployment/nginx", "--timeout=60s")
	kittest.WaitFor(t, "1.16.1 pods after undo", 30*time.Second, func() (bool, error) {
		im := podImages(t, e, "nginx")
		return len(im) == 1 && im["nginx:1.16.1"] == 3, nil
	})
	cur = must(api.Get(ctx, "nginx", metav1.GetOptions{}))
	if got := cur.Annotations[deployment.RevisionAnnotation]; got != "4" {
		t.Errorf("revision after undo %q, want 4", got)
	}
	for _, rs := range rsOf(t, e, d) {
		if rs.Spec.Template.Spec.Containers[0].Image == "nginx:1.16.1" && rs.Annotations[deployment.RevisionHistoryAnnotation] != "2" {
			t.Errorf("undone-to replicaset %s: revision-history %q, want 2", rs.Name, rs.Annotations[deployment.RevisionHistoryAnnotation])
		}
	}
	out = e.Kubectl(t, "rollout", "history", "deployment/nginx")
	for _, want := range []string{"1 ", "3 ", "4 ", "create nginx 1.14.2"} {
		if !strings.Contains(out, want) {
			t.Errorf("rollout history lacks %q:\n%s", want, out)
		}
	}
	out = e.Kubectl(t, "rollout", "history", "deployment/nginx", "--revision=1")
	if !strings.Contains(out, "nginx:1.14.2") {
		t.Errorf("rollout history --revision=1:\n%s", out)
	}
	e.Kubectl(t, "rollout", "undo", "deployment/nginx", "--to-revision=1")
	e.Kubectl(t, "rollout", "status", "deployment/nginx", "--timeout=60s")
	kittest.WaitFor(t, "1.14.2 pods after undo to revision 1", 30*time.Second, func() (bool, error) {
		im := podImages(t, e, "nginx")
		return len(im) == 1 && im["nginx:1.14.2"] == 3, nil
	})

	// Paused: template changes start no rollout until resumed, which
	// makes one new ReplicaSet with all of them.
	e.Kubectl(t, "rollout", "pause", "deployment/nginx")
	before := len(rsOf(t, e, d))
	e.Kubectl(t, "set", "image", "deployment/nginx", "nginx=nginx:1.17")
	e.Kubectl(t, "set", "resources", "deployment/nginx", "-c=nginx", "--limits=cpu=200m,memory=512Mi")
	time.Sleep(2 * time.Second)
	if n := len(rsOf(t, e, d)); n != before {
		t.Errorf("paused deployment: %d replicasets, had %d", n, before)
	}
	if im := podImages(t, e, "nginx"); im["nginx:1.17"] != 0 {
		t.Errorf("paused deployment started new pods: %v", im)
	}
	cur = must(api.Get(ctx, "nginx", metav1.GetOptions{}))
	if c := condition(cur, appsv1.DeploymentProgressing); c == nil || c.Reason != "DeploymentPaused" {
		t.Errorf("paused Progressing condition %+v", c)
	}
	e.Kubectl(t, "rollout", "resume", "deployment/nginx")
	e.Kubectl(t, "rollout", "status", "deployment/nginx", "--timeout=60s")
	if n := len(rsOf(t, e, d)); n != before+1 {
		t.Errorf("after resume: %d replicasets, want %d", n, before+1)
	}
}

func condition(d *appsv1.Deployment, ct appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == ct {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

// TestDeploymentProportionalScaling scales a Deployment in the middle of a
// stalled rollout: 10 replicas with maxSurge 3 and maxUnavailable 2 stall
// at 8 old and 5 new; scaling to 15 gives 11 and 7, as documented.
func TestDeploymentProportionalScaling(t *testing.T) {
	e := start(t, 3)
	ctx := context.Background()
	api := e.Client.AppsV1().Deployments("default")
	d := nginx("web", 10)
	d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{
		MaxSurge: ptr.To(intstr.FromInt32(3)), MaxUnavailable: ptr.To(intstr.FromInt32(2)),
	}
	e.ApplyObject(t, d)
	d = must(api.Get(ctx, "web", metav1.GetOptions{}))
	e.Kubectl(t, "rollout", "status", "deployment/web", "--timeout=60s")
	e.Kubectl(t, "patch", "deployment/web", "-p", `{"spec":{"template":{"metadata":{"annotations":{"`+sim.NotReady+`":"true"}},"spec":{"containers":[{"name":"nginx","image":"nginx:bad"}]}}}}`)
	sizes := func() map[string]int32 {
		out := map[string]int32{}
		for _, rs := range rsOf(t, e, d) {
			out[rs.Spec.Template.Spec.Containers[0].Image] = *rs.Spec.Replicas
		}
		return out
	}
	kittest.WaitFor(t, "rollout stalled at 8 old / 5 new", 30*time.Second, func() (bool, error) {
		s := sizes()
		return s["nginx:1.14.2"] == 8 && s["nginx:bad"] == 5, fmt.Errorf("sizes %v", s)
	})
	e.Kubectl(t, "scale", "deployment/web", "--replicas=15")
	kittest.WaitFor(t, "proportional 11 old / 7 new", 30*time.Second, func() (bool, error) {
		s := sizes()
		return s["nginx:1.14.2"] == 11 && s["nginx:bad"] == 7, fmt.Errorf("sizes %v", s)
	})
}

// TestDeploymentRecreate checks that old and new pods never overlap.
func TestDeploymentRecreate(t *testing.T) {
	e := start(t, 2)
	b := watchBounds(t, e, "rec")
	d := nginx("rec", 3)
	d.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	e.ApplyObject(t, d)
	e.Kubectl(t, "rollout", "status", "deployment/rec", "--timeout=60s")
	b.arm()
	e.Kubectl(t, "set", "image", "deployment/rec", "nginx=nginx:1.16.1")
	e.Kubectl(t, "rollout", "status", "deployment/rec", "--timeout=60s")
	if maxAlive, _ := b.get(); maxAlive > 3 {
		t.Errorf("recreate: %d pods alive at once, want ≤ 3", maxAlive)
	}
	kittest.WaitFor(t, "new pods", 30*time.Second, func() (bool, error) {
		im := podImages(t, e, "rec")
		return len(im) == 1 && im["nginx:1.16.1"] == 3, nil
	})
}

// TestDeploymentsQuiet checks there is no hot loop: with steady
// Deployments, the controllers write nothing.
func TestDeploymentsQuiet(t *testing.T) {
	e := start(t, 3)
	ctx := context.Background()
	const n = 100
	for i := range n {
		must(e.Client.AppsV1().Deployments("default").Create(ctx, nginx(fmt.Sprintf("quiet-%d", i), 1), metav1.CreateOptions{}))
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		list, err := e.Client.AppsV1().Deployments("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, d := range list.Items {
			if d.Status.ObservedGeneration == d.Generation && d.Status.AvailableReplicas == 1 && d.Status.UpdatedReplicas == 1 {
				ready++
			}
		}
		if ready == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d deployments available after 2 minutes", ready, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
	e.Kubectl(t, "rollout", "status", "deployment/quiet-0", "--timeout=60s")
	time.Sleep(2 * time.Second) // let the last status writes land
	// Every API write counts but the nodes' own: their agents' status
	// reports and the Lease renewals the hub makes of their heartbeats.
	before, agentsBefore := e.WritesBy(t), e.AgentWrites()
	time.Sleep(10 * time.Second)
	after, agentsAfter := e.WritesBy(t), e.AgentWrites()
	changed := map[string]float64{}
	var writes float64
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			changed[k] = d
			if !strings.HasSuffix(k, " leases") {
				writes += d
			}
		}
	}
	writes -= float64(agentsAfter.All - agentsBefore.All)
	if writes != 0 {
		t.Errorf("%v API writes besides the nodes' during 10 quiet seconds, want 0: %v (agents: %d)", writes, changed, agentsAfter.All-agentsBefore.All)
	} else {
		t.Logf("writes during 10 quiet seconds, all the nodes': %v", changed)
	}
}
