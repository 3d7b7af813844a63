package dataplane

import (
	"testing"

	"github.com/tether-edge/tether/dataplane/internal/testnet"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestLoadBalancerIngressOnNodeAddress serves LoadBalancer Services whose
// status.loadBalancer.ingress is the node's own address, as tether's
// service-lb-controller writes it: a client in another namespace reaches a
// backend at <node address>:<service port> (not a NodePort), whether the
// backend is a pod on the node or on another node, and so does a process
// of the node itself.
func TestLoadBalancerIngressOnNodeAddress(t *testing.T) {
	l := newNPLab(t, "")
	ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
	lb := func(name, clusterIP string, port, nodePort int32) *corev1.Service {
		s := service(name, clusterIP, corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: port,
			NodePort: nodePort, TargetPort: intstr.FromString("http")})
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: npNodeIP}}
		return s
	}
	l.dp.UpsertService(lb("lb-pod", "10.214.101.20", 8081, 30091))
	l.dp.UpsertEndpointSlice(epSlice("lb-pod-1", "lb-pod", ports, readyEP(npPodIP, "node-a")))
	l.dp.UpsertService(lb("lb-remote", "10.214.101.21", 8082, 30092))
	l.dp.UpsertEndpointSlice(epSlice("lb-remote-1", "lb-remote", ports, readyEP(npRemoteIP, "node-b")))

	for _, c := range []struct {
		what, addr, backend string
	}{
		{"local pod", npNodeIP + ":8081", npPodIP},
		{"remote backend", npNodeIP + ":8082", npRemoteIP},
	} {
		for _, r := range dialN(l.client, c.addr, 5) {
			if r.err != nil || r.backend != c.backend || r.peer != c.addr {
				t.Fatalf("%s: client dialling %s got %+v, want backend %s", c.what, c.addr, r, c.backend)
			}
		}
	}
	// A LoadBalancer Service's NodePort answers as well.
	if r := dialN(l.client, npNodeIP+":30091", 1)[0]; r.err != nil || r.backend != npPodIP {
		t.Fatalf("NodePort of the LoadBalancer Service: %+v", r)
	}
	// The node's own processes, balanced by the socket programs of the
	// node's cgroup.
	testnet.JoinCgroup(t, l.cfg.CgroupPath)
	for addr, backend := range map[string]string{npNodeIP + ":8081": npPodIP, npNodeIP + ":8082": npRemoteIP} {
		if r := dialN(l.node, addr, 1)[0]; r.err != nil || r.backend != backend {
			t.Fatalf("%s from the node itself: %+v, want backend %s", addr, r, backend)
		}
	}
}
