package endpoints

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
	"github.com/tether-edge/tether/edge/sim"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-endpointslice"}

// start runs a hub, three hollow nodes whose crash-looping containers come
// back after 1s, 2s, 4s, …, and the controller under test. The hub's own
// Deployment and ReplicaSet controllers make the pods, its scheduler
// places them and the nodes' agents run them and report their status.
func start(t *testing.T) *kittest.Env {
	t.Helper()
	e := kittest.Start(t, hubArgs, 0)
	e.JoinNodes(t, kittest.Nodes{Prefix: "node-", N: 3, Sim: sim.Config{BackoffBase: time.Second, LogInterval: -1}})
	f := e.Factory()
	c, err := New(Config{Client: e.ControllerClient(t, "endpointslice"), Informers: f, Workers: 2, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, c)
	return e
}

func slicesOf(kube kubernetes.Interface, ns, svc string) ([]discoveryv1.EndpointSlice, error) {
	l, err := kube.DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{LabelSelector: LabelServiceName + "=" + svc})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// deployment is a Deployment of n pods labelled app=name, with the pod
// annotations ann, serving on a port named http.
func deployment(ns, name string, n int, ann string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[2]s, namespace: %[1]s}
spec:
  replicas: %[3]d
  selector: {matchLabels: {app: %[2]s}}
  template:
    metadata:
      labels: {app: %[2]s}
      annotations: {%[4]s}
    spec:
      containers:
      - name: app
        image: app:1
        ports: [{name: http, containerPort: 8080}]
`, ns, name, n, ann)
}

func service(ns, name string, selector bool) string {
	sel := ""
	if selector {
		sel = "  selector: {app: " + name + "}\n"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: %s}
spec:
%s  ports: [{name: http, port: 80, targetPort: http}]
`, name, ns, sel)
}

// TestEndpointSlicesAgainstHub puts 250 pods run by hollow nodes behind one
// Service, all made with kubectl: they fill 3 slices of at most 100, and
// the legacy Endpoints lists them all. Then pods that crash and restart
// flip their readiness, and each flip reaches the Service's slice within
// a second of the pod status that reported it.
func TestEndpointSlicesAgainstHub(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	ns := "web"
	e.Kubectl(t, "create", "namespace", ns)
	e.Apply(t, service(ns, "web", true))
	// A Service without a selector is its user's: no slices, no Endpoints.
	e.Apply(t, service(ns, "manual", false))
	svc, err := e.Client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kittest.WaitFor(t, "placeholder slice", 10*time.Second, func() (bool, error) {
		ss, err := slicesOf(e.Client, ns, "web")
		return err == nil && len(ss) == 1 && len(ss[0].Endpoints) == 0, err
	})

	const n = 250
	e.Apply(t, deployment(ns, "web", n, ""))
	e.Kubectl(t, "-n", ns, "rollout", "status", "deployment/web", "--timeout=180s")
	kittest.WaitFor(t, "250 ready endpoints in 3 slices", 60*time.Second, func() (bool, error) {
		ss, err := slicesOf(e.Client, ns, "web")
		if err != nil {
			return false, err
		}
		total := 0
		for _, s := range ss {
			if len(s.Endpoints) > 100 {
				return false, fmt.Errorf("slice %s has %d endpoints", s.Name, len(s.Endpoints))
			}
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					total++
				}
			}
		}
		return len(ss) == 3 && total == n, fmt.Errorf("%d slices, %d ready endpoints", len(ss), total)
	})
	zones := map[string]string{}
	nodes, err := e.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range nodes.Items {
		zones[node.Name] = node.Labels[LabelZone]
	}
	pods, err := e.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	ipOf := map[string]string{}
	for _, p := range pods.Items {
		ipOf[p.Name] = p.Status.PodIP
	}
	ss, _ := slicesOf(e.Client, ns, "web")
	seen := map[string]bool{}
	for _, s := range ss {
		if s.Labels[LabelManagedBy] != ManagedByValue || s.AddressType != discoveryv1.AddressTypeIPv4 {
			t.Errorf("slice %s: labels %v type %s", s.Name, s.Labels, s.AddressType)
		}
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != svc.UID {
			t.Errorf("slice %s: owners %v", s.Name, s.OwnerReferences)
		}
		if len(s.Ports) != 1 || *s.Ports[0].Port != 8080 || *s.Ports[0].Name != "http" {
			t.Errorf("slice %s: ports %v", s.Name, s.Ports)
		}
		for _, ep := range s.Endpoints {
			if ep.NodeName == nil || ep.Zone == nil || zones[*ep.NodeName] == "" || *ep.Zone != zones[*ep.NodeName] || ep.TargetRef == nil {
				t.Fatalf("endpoint %+v lacks node, zone or target", ep)
			}
			if ip := ipOf[ep.TargetRef.Name]; ip == "" || ep.Addresses[0] != ip {
				t.Errorf("endpoint of pod %s has addresses %v, the pod reports %q", ep.TargetRef.Name, ep.Addresses, ip)
			}
			seen[ep.TargetRef.Name] = true
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct pods in the slices, want %d", len(seen), n)
	}
	kittest.WaitFor(t, "Endpoints with 250 addresses", 10*time.Second, func() (bool, error) {
		ep, err := e.Client.CoreV1().Endpoints(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if len(ep.Subsets) != 1 {
			return false, fmt.Errorf("%d subsets", len(ep.Subsets))
		}
		_, trig := ep.Annotations[AnnotationTriggerTime]
		return len(ep.Subsets[0].Addresses) == n && ep.Subsets[0].Ports[0].Port == 8080 && trig, fmt.Errorf("%d addresses", len(ep.Subsets[0].Addresses))
	})
	out := e.Kubectl(t, "get", "endpointslices", "-n", ns, "-l", LabelServiceName+"=web", "--no-headers")
	if lines := strings.Count(strings.TrimSpace(out), "\n") + 1; lines != 3 {
		t.Errorf("kubectl lists %d slices:\n%s", lines, out)
	}
	e.Kubectl(t, "get", "endpoints", "-n", ns, "web")
	if ss, err := slicesOf(e.Client, ns, "manual"); err != nil || len(ss) != 0 {
		t.Errorf("slices for a Service without selector: %v %v", ss, err)
	}
	if _, err := e.Client.CoreV1().Endpoints(ns).Get(ctx, "manual", metav1.GetOptions{}); err == nil {
		t.Errorf("Endpoints created for a Service without selector")
	}

	t.Run("ReadinessLatency", func(t *testing.T) {
		e.Apply(t, service(ns, "flap", true))
		lat, downs := readinessLatencies(t, e, ns, "flap", 12, func() {
			// Containers that crash 2s after they start and come back
			// after the back-off: ready, not ready, ready, ….
			e.Apply(t, deployment(ns, "flap", 3, fmt.Sprintf("%q: 2s", sim.CrashAfter)))
		})
		slices.Sort(lat)
		t.Logf("pod status → EndpointSlice latency over %d readiness changes (%d to not ready): min %v median %v max %v", len(lat), downs, lat[0], lat[len(lat)/2], lat[len(lat)-1])
		if downs == 0 || downs == len(lat) {
			t.Errorf("%d of %d readiness changes were to not ready, want both kinds", downs, len(lat))
		}
		if lat[len(lat)-1] > time.Second {
			t.Errorf("slowest readiness change reached the slice after %v, want within 1s (all: %v)", lat[len(lat)-1], lat)
		}
	})

	t.Run("FewWritesForOneChange", func(t *testing.T) {
		w, err := e.Client.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{LabelSelector: LabelServiceName + "=web", ResourceVersion: "0"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		// Drain the initial state.
		drain := time.After(time.Second)
	initial:
		for {
			select {
			case <-w.ResultChan():
			case <-drain:
				break initial
			}
		}
		// One pod less: it terminates, its agent stops it, and it goes.
		e.Kubectl(t, "-n", ns, "scale", "deployment/web", fmt.Sprintf("--replicas=%d", n-1))
		kittest.WaitFor(t, "the surplus pod gone", 30*time.Second, func() (bool, error) {
			l, err := e.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
			return err == nil && len(l.Items) == n-1, err
		})
		modified := 0
		quiet := time.After(3 * time.Second)
	count:
		for {
			select {
			case ev := <-w.ResultChan():
				if ev.Type != watch.Bookmark {
					modified++
				}
			case <-quiet:
				break count
			}
		}
		if modified == 0 || modified > 2 {
			t.Errorf("deleting one pod caused %d slice writes, want 1 or 2 (terminating, then gone)", modified)
		}
	})
}

// readinessLatencies watches the pods labelled app=svc and the slices of
// Service svc while act makes pods come and go ready, and returns, for
// want readiness changes of pods with an address, how long after the test
// saw the pod status change it saw the slice follow, and how many of the
// changes were to not ready.
func readinessLatencies(t *testing.T, e *kittest.Env, ns, svc string, want int, act func()) ([]time.Duration, int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pw, err := e.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "app=" + svc})
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Stop()
	sw, err := e.Client.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{LabelSelector: LabelServiceName + "=" + svc})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Stop()
	act()

	type state struct {
		ready bool
		at    time.Time
	}
	podState := map[string]state{}   // last readiness each pod reported
	sliceState := map[string]state{} // last readiness a slice showed
	pending := map[string]state{}    // pod changes no slice showed yet
	var lat []time.Duration
	downs := 0
	deadline := time.After(90 * time.Second)
	for len(lat) < want {
		select {
		case ev, ok := <-pw.ResultChan():
			if !ok {
				t.Fatal("pod watch ended")
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if ev.Type == watch.Deleted || p.DeletionTimestamp != nil {
				delete(pending, p.Name)
				continue
			}
			if p.Status.PodIP == "" {
				continue
			}
			now, ready := time.Now(), kit.IsPodReady(p)
			if prev, seen := podState[p.Name]; seen && prev.ready == ready {
				continue
			}
			prev := podState[p.Name]
			podState[p.Name] = state{ready, now}
			if s, ok := sliceState[p.Name]; ok && s.ready == ready && s.at.After(prev.at) {
				// The slice's event overtook the pod's.
				lat = append(lat, 0)
				if !ready {
					downs++
				}
				delete(pending, p.Name)
				continue
			}
			pending[p.Name] = state{ready, now}
		case ev, ok := <-sw.ResultChan():
			if !ok {
				t.Fatal("slice watch ended")
			}
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			for _, ep := range s.Endpoints {
				if ep.TargetRef == nil {
					continue
				}
				name, ready := ep.TargetRef.Name, ep.Conditions.Ready != nil && *ep.Conditions.Ready
				if cur, ok := sliceState[name]; !ok || cur.ready != ready {
					sliceState[name] = state{ready, now}
				}
				if p, ok := pending[name]; ok && p.ready == ready {
					lat = append(lat, now.Sub(p.at))
					if !ready {
						downs++
					}
					delete(pending, name)
				}
			}
		case <-deadline:
			t.Fatalf("%d readiness changes reached the slices in 90s, want %d; still pending: %v", len(lat), want, pending)
		}
	}
	return lat, downs
}
