package hub_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/store/postgres/pgtest"
)

// startHubs runs n hubs of one cluster on one throw-away PostgreSQL
// database, each with an empty data directory: the first makes the
// cluster's keys and stores them, the others read them from the database.
func startHubs(t *testing.T, n int, args ...string) []*hubtest.Hub {
	t.Helper()
	pg := pgtest.Start(t)
	args = append([]string{"--datastore", pg.NewDatabase(), "--secret-key-file", hubtest.SecretKeyFile(t)}, args...)
	hubs := []*hubtest.Hub{hubtest.Start(t, args...)}
	for len(hubs) < n {
		hubs = append(hubs, hubtest.Start(t, args...))
	}
	return hubs
}

// clientOf returns a client-go clientset for a hub's admin kubeconfig.
func clientOf(t *testing.T, h *hubtest.Hub) kubernetes.Interface {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = -1, 0
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runParallel runs f(i) for i in [0, n) on 16 goroutines and returns the
// errors by i.
func runParallel(n int, f func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				errs[i] = f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errs
}

// TestHubsShareAllocations creates Services and Nodes concurrently through
// two hubs on one database: every cluster IP, node port and pod CIDR is
// handed out once, a range both fill is used to its last address,
// creates that fail keep nothing, and deletes free what they held for
// the other hub.
func TestHubsShareAllocations(t *testing.T) {
	// A /26 has 60 cluster IPs to hand out (the network, broadcast, first
	// and tenth addresses are kept); /29s of a /26 make 8 pod CIDRs.
	hubs := startHubs(t, 2, append(apiOnly, "--service-cidr", "10.96.0.0/26",
		"--cluster-cidr", "10.42.0.0/26", "--node-cidr-mask-size", "29")...)
	cs := []kubernetes.Interface{clientOf(t, hubs[0]), clientOf(t, hubs[1])}
	ctx := context.Background()
	const ips = 60
	svc := func(name string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Port: 80}}}}
	}
	create := func(hub int, name string) error {
		_, err := cs[hub].CoreV1().Services("default").Create(ctx, svc(name), metav1.CreateOptions{})
		return err
	}
	// All but one address, half through each hub at once.
	for i, err := range runParallel(ips-1, func(i int) error { return create(i%2, fmt.Sprintf("s%d", i)) }) {
		if err != nil {
			t.Fatalf("create service s%d: %v", i, err)
		}
	}
	// Creates that fail after their address was picked give it back.
	for range 3 {
		if err := create(1, "s0"); !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create an existing service: %v", err)
		}
	}
	if err := create(0, "last"); err != nil {
		t.Fatalf("create the service of the last free address: %v", err)
	}
	if err := create(1, "over"); !apierrors.IsInvalid(err) {
		t.Fatalf("create a service in a full range: %v", err)
	}
	checkServices := func(want int) {
		t.Helper()
		list, err := cs[1].CoreV1().Services("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		seenIP, seenPort := map[string]string{}, map[int32]string{}
		n := 0
		for _, s := range list.Items {
			if s.Name == "kubernetes" {
				continue
			}
			n++
			if o, dup := seenIP[s.Spec.ClusterIP]; dup {
				t.Fatalf("cluster IP %s given to %s and %s", s.Spec.ClusterIP, o, s.Name)
			}
			seenIP[s.Spec.ClusterIP] = s.Name
			p := s.Spec.Ports[0].NodePort
			if o, dup := seenPort[p]; dup {
				t.Fatalf("node port %d given to %s and %s", p, o, s.Name)
			}
			seenPort[p] = s.Name
		}
		if n != want {
			t.Fatalf("%d services, want %d", n, want)
		}
	}
	checkServices(ips)
	// Deletes through one hub free the addresses for the other.
	for i, err := range runParallel(ips/2, func(i int) error {
		return cs[0].CoreV1().Services("default").Delete(ctx, fmt.Sprintf("s%d", i), metav1.DeleteOptions{})
	}) {
		if err != nil {
			t.Fatalf("delete service s%d: %v", i, err)
		}
	}
	for i, err := range runParallel(ips/2, func(i int) error { return create(1-i%2, fmt.Sprintf("again%d", i)) }) {
		if err != nil {
			t.Fatalf("create service again%d after deletes: %v", i, err)
		}
	}
	checkServices(ips)

	// Pod CIDRs: eight ranges for eight nodes registering at once.
	node := func(hub int, name string) error {
		_, err := cs[hub].CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		return err
	}
	for i, err := range runParallel(8, func(i int) error { return node(i%2, fmt.Sprintf("n%d", i)) }) {
		if err != nil {
			t.Fatalf("create node n%d: %v", i, err)
		}
	}
	checkNodes := func(want int) {
		t.Helper()
		list, err := cs[0].CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]string{}
		for _, n := range list.Items {
			if n.Spec.PodCIDR == "" {
				t.Fatalf("node %s got no pod CIDR", n.Name)
			}
			if _, err := netip.ParsePrefix(n.Spec.PodCIDR); err != nil {
				t.Fatalf("node %s pod CIDR %q: %v", n.Name, n.Spec.PodCIDR, err)
			}
			if o, dup := seen[n.Spec.PodCIDR]; dup {
				t.Fatalf("pod CIDR %s given to %s and %s", n.Spec.PodCIDR, o, n.Name)
			}
			seen[n.Spec.PodCIDR] = n.Name
		}
		if len(list.Items) != want {
			t.Fatalf("%d nodes, want %d", len(list.Items), want)
		}
	}
	checkNodes(8)
	for i := range 4 {
		if err := cs[1].CoreV1().Nodes().Delete(ctx, fmt.Sprintf("n%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, err := range runParallel(4, func(i int) error { return node(i%2, fmt.Sprintf("m%d", i)) }) {
		if err != nil {
			t.Fatalf("create node m%d: %v", i, err)
		}
	}
	checkNodes(8)
}
