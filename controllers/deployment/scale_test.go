package deployment_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"runtime"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/deployment"
	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
	"github.com/tether-edge/tether/controllers/replicaset"
)

var (
	benchFull     = flag.Bool("ctrlbench.full", false, "TestDeploymentScale with 10,000 replicas on 1,000 hollow nodes")
	benchReplicas = flag.Int("ctrlbench.replicas", 0, "replicas in TestDeploymentScale (default 500, 10000 with -ctrlbench.full)")
	benchNodes    = flag.Int("ctrlbench.nodes", 0, "hollow nodes in TestDeploymentScale (default 50, 1000 with -ctrlbench.full)")
)

// TestDeploymentScale measures one large Deployment on hollow nodes: the
// time from its creation to every pod Running, the API writes per pod
// (all of them: the controllers' creates and status, the scheduler's
// bindings, the agents' pod status, events), and the memory of the
// controllers' informer caches holding every pod.
func TestDeploymentScale(t *testing.T) {
	replicas, nodes := 500, 50
	if *benchFull {
		replicas, nodes = 10000, 1000
	}
	if *benchReplicas > 0 {
		replicas = *benchReplicas
	}
	if *benchNodes > 0 {
		nodes = *benchNodes
	}
	*benchTarget = replicas
	e := kittest.Start(t, hubArgs, nodes)
	// The controllers get their own client, counting the writes they
	// issue.
	rc := rest.CopyConfig(e.Rest)
	rc.QPS, rc.Burst = 1000, 2000
	var ctrlWrites atomic.Int64
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if r.Method != http.MethodGet {
				ctrlWrites.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	client := kubernetes.NewForConfigOrDie(rc)
	f := informers.NewSharedInformerFactory(client, 0)
	rsc, err := replicaset.New(replicaset.Config{Client: client, Informers: f, Workers: 5, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	dc, err := deployment.New(deployment.Config{Client: client, Informers: f, Workers: 5, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, rsc, dc)

	// Count Running pods from a watch rather than by listing 10,000 pods
	// over and over.
	running := make(chan int, 1)
	wf := e.Factory()
	seen := map[string]bool{}
	made, bound := map[string]bool{}, map[string]bool{}
	var allMade, allBound atomic.Int64 // unix nanos when the last pod was created, bound
	note := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Labels["app"] != "big" {
			return
		}
		if !made[p.Name] {
			made[p.Name] = true
			if len(made) == *benchTarget {
				allMade.Store(time.Now().UnixNano())
			}
		}
		if p.Spec.NodeName != "" && !bound[p.Name] {
			bound[p.Name] = true
			if len(bound) == *benchTarget {
				allBound.Store(time.Now().UnixNano())
			}
		}
		if seen[p.Name] || p.Status.Phase != corev1.PodRunning {
			return
		}
		seen[p.Name] = true
		select {
		case <-running:
		default:
		}
		running <- len(seen)
	}
	_, _ = wf.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: note, UpdateFunc: func(_, cur any) { note(cur) },
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wf.Start(ctx.Done())
	wf.WaitForCacheSync(ctx.Done())

	resources := []string{"pods", "replicasets", "deployments", "events"}
	before := e.WritesBy(t)
	ctrlBefore := ctrlWrites.Load()
	start := time.Now()
	d := nginx("big", int32(replicas))
	if _, err := e.Client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Minute)
	n := 0
	for n < replicas {
		select {
		case n = <-running:
		case <-deadline:
			t.Fatalf("%d of %d pods running after 10 minutes", n, replicas)
		}
	}
	took := time.Since(start)
	t.Logf("all pods created after %v, all bound after %v, all running after %v",
		time.Duration(allMade.Load()-start.UnixNano()).Round(time.Millisecond),
		time.Duration(allBound.Load()-start.UnixNano()).Round(time.Millisecond), took.Round(time.Millisecond))
	e.Kubectl(t, "rollout", "status", "deployment/big", "--timeout=120s")
	time.Sleep(2 * time.Second) // let trailing status writes land
	after := e.WritesBy(t)
	ctrlPerPod := float64(ctrlWrites.Load()-ctrlBefore) / float64(replicas)
	var total float64
	var lines []string
	for k, v := range after {
		delta := v - before[k]
		if delta == 0 {
			continue
		}
		for _, r := range resources {
			if k == "create "+r || len(k) > len(r) && (k[len(k)-len(r):] == r || containsRes(k, r)) {
				total += delta
				lines = append(lines, fmt.Sprintf("%s=%.0f", k, delta))
				break
			}
		}
	}
	sort.Strings(lines)

	// Memory of the controllers' caches with every pod: a second set of
	// the same informers, synced, measured by the heap it adds.
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	f2 := e.Factory()
	if _, err := replicaset.New(replicaset.Config{Client: e.Client, Informers: f2}); err != nil {
		t.Fatal(err)
	}
	if _, err := deployment.New(deployment.Config{Client: e.Client, Informers: f2}); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	f2.Start(ctx2.Done())
	f2.WaitForCacheSync(ctx2.Done())
	runtime.GC()
	runtime.ReadMemStats(&m1)
	cacheMiB := float64(int64(m1.HeapInuse)-int64(m0.HeapInuse)) / (1 << 20)
	cancel2()
	f2.Shutdown()

	perPod := total / float64(replicas)
	t.Logf("deployment of %d replicas on %d hollow nodes: all Running in %v; controllers wrote %.2f times per pod; "+
		"the hub took %.0f writes in all (%.2f per pod, with the scheduler's and agents'): %v; controller caches %.1f MiB",
		replicas, nodes, took.Round(time.Millisecond), ctrlPerPod, total, perPod, lines, cacheMiB)
	if ctrlPerPod > 4 {
		t.Errorf("controllers wrote %.2f times per pod, want ≤ 4", ctrlPerPod)
	}
	if *benchFull && took > 60*time.Second {
		t.Errorf("took %v to run %d pods, want ≤ 60s", took, replicas)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// benchTarget is the replica count the watch compares against.
var benchTarget = new(int)

// containsRes reports whether a "verb resource[/sub]" key is about r.
func containsRes(k, r string) bool {
	for i := 0; i+len(r) <= len(k); i++ {
		if k[i:i+len(r)] == r && (i == 0 || k[i-1] == ' ') && (i+len(r) == len(k) || k[i+len(r)] == '/') {
			return true
		}
	}
	return false
}
