package endpoints

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
	"github.com/tether-edge/tether/hub/hubtest"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-endpointslice"}

type env struct {
	h    *hubtest.Hub
	kube kubernetes.Interface
}

func start(t *testing.T) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a hub process")
	}
	h, _, kube := kittest.Hub(t, hubArgs)
	factory := informers.NewSharedInformerFactory(kube, 0)
	c, err := New(Config{Client: kube, Informers: factory, Workers: 2, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		factory.Shutdown()
	})
	return &env{h: h, kube: kube}
}

// runPod creates a pod bound to node and gives it the status a kubelet
// would: running, with an address, ready or not. No agent runs on the
// node, so the status stays as written.
func (e *env) runPod(t *testing.T, ns, name, node, ip string, port int32, ready bool) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p, err := e.kube.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "c", Image: "app:1", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: port}},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	setReady(p, ready)
	p, err = e.kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func setReady(p *corev1.Pod, ready bool) {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	now := metav1.Now()
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			p.Status.Conditions[i].Status = st
			p.Status.Conditions[i].LastTransitionTime = now
			return
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: st, LastTransitionTime: now})
}

func (e *env) slicesOf(ns, svc string) ([]discoveryv1.EndpointSlice, error) {
	l, err := e.kube.DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{LabelSelector: LabelServiceName + "=" + svc})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

func TestEndpointSlicesAgainstHub(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	ns := "web"
	if _, err := e.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n1", "n2"} {
		_, err := e.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: n, Labels: map[string]string{LabelZone: "site-" + n},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	svc, err := e.kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A Service without a selector is its user's: no slices, no Endpoints.
	if _, err := e.kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "manual"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	kittest.WaitFor(t, "placeholder slice", 10*time.Second, func() (bool, error) {
		ss, err := e.slicesOf(ns, "web")
		return err == nil && len(ss) == 1 && len(ss[0].Endpoints) == 0, err
	})

	const n = 250
	pods := make([]*corev1.Pod, n)
	for i := range n {
		node := []string{"n1", "n2"}[i%2]
		pods[i] = e.runPod(t, ns, fmt.Sprintf("web-%03d", i), node, fmt.Sprintf("10.244.%d.%d", i/200, i%200+2), 8080, true)
	}
	kittest.WaitFor(t, "250 ready endpoints in 3 slices", 30*time.Second, func() (bool, error) {
		ss, err := e.slicesOf(ns, "web")
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
	ss, _ := e.slicesOf(ns, "web")
	for _, s := range ss {
		if s.Labels[LabelManagedBy] != ManagedByValue || s.AddressType != discoveryv1.AddressTypeIPv4 {
			t.Errorf("slice %s: labels %v type %s", s.Name, s.Labels, s.AddressType)
		}
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != svc.UID {
			t.Errorf("slice %s: owners %v", s.Name, s.OwnerReferences)
		}
		if len(s.Ports) != 1 || *s.Ports[0].Port != 8080 {
			t.Errorf("slice %s: ports %v", s.Name, s.Ports)
		}
		for _, ep := range s.Endpoints {
			if ep.NodeName == nil || ep.Zone == nil || *ep.Zone != "site-"+*ep.NodeName || ep.TargetRef == nil {
				t.Fatalf("endpoint %+v lacks node, zone or target", ep)
			}
		}
	}
	kittest.WaitFor(t, "Endpoints with 250 addresses", 10*time.Second, func() (bool, error) {
		ep, err := e.kube.CoreV1().Endpoints(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if len(ep.Subsets) != 1 {
			return false, fmt.Errorf("%d subsets", len(ep.Subsets))
		}
		_, trig := ep.Annotations[AnnotationTriggerTime]
		return len(ep.Subsets[0].Addresses) == n && ep.Subsets[0].Ports[0].Port == 8080 && trig, fmt.Errorf("%d addresses", len(ep.Subsets[0].Addresses))
	})
	out := e.h.MustRun("get", "endpointslices", "-n", ns, "-l", LabelServiceName+"=web", "--no-headers")
	if lines := strings.Count(strings.TrimSpace(out), "\n") + 1; lines != 3 {
		t.Errorf("kubectl lists %d slices:\n%s", lines, out)
	}
	e.h.MustRun("get", "endpoints", "-n", ns, "web")
	if ss, err := e.slicesOf(ns, "manual"); err != nil || len(ss) != 0 {
		t.Errorf("slices for a Service without selector: %v %v", ss, err)
	}
	if _, err := e.kube.CoreV1().Endpoints(ns).Get(ctx, "manual", metav1.GetOptions{}); err == nil {
		t.Errorf("Endpoints created for a Service without selector")
	}

	t.Run("ReadinessLatency", func(t *testing.T) {
		var lat []time.Duration
		for round := range 6 {
			p := pods[round*37]
			ready := round%2 == 1 // false, true, false, ...
			if ready {
				p = pods[(round-1)*37]
			}
			lat = append(lat, e.flipAndMeasure(t, ns, p.Name, ready))
		}
		slices.Sort(lat)
		t.Logf("pod readiness → EndpointSlice latency over %d changes: min %v median %v max %v", len(lat), lat[0], lat[len(lat)/2], lat[len(lat)-1])
		if lat[len(lat)-1] > time.Second {
			t.Errorf("slowest readiness change took %v, want under 1s", lat[len(lat)-1])
		}
	})

	t.Run("FewWritesForOneChange", func(t *testing.T) {
		w, err := e.kube.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{LabelSelector: LabelServiceName + "=web", ResourceVersion: "0"})
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
		if err := e.kube.CoreV1().Pods(ns).Delete(ctx, pods[3].Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		modified := 0
		quiet := time.After(2 * time.Second)
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

// flipAndMeasure sets a pod's readiness and returns how long after the
// status write the pod's endpoint showed it.
func (e *env) flipAndMeasure(t *testing.T, ns, name string, ready bool) time.Duration {
	t.Helper()
	ctx := context.Background()
	w, err := e.kube.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{LabelSelector: LabelServiceName + "=web"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	p, err := e.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setReady(p, ready)
	start := time.Now()
	if _, err := e.kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(5 * time.Second)
	for {
		select {
		case ev := <-w.ResultChan():
			s, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok {
				continue
			}
			for _, ep := range s.Endpoints {
				if ep.TargetRef != nil && ep.TargetRef.Name == name && ep.Conditions.Ready != nil && *ep.Conditions.Ready == ready {
					return time.Since(start)
				}
			}
		case <-timeout:
			t.Fatalf("pod %s ready=%v not reflected in 5s", name, ready)
		}
	}
}
