package containerd

import (
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/testbench/images"
)

// TestGRPCProbe: a readiness probe of type grpc follows the pod's gRPC
// health service, for the whole server and for a named service.
func TestGRPCProbe(t *testing.T) {
	e := newTestRuntime(t, "10.231.4.0/24")
	// A host-network pod: the probe asks the node's address, where the
	// test serves the health service.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(ln)
	defer srv.Stop()
	port := int32(ln.Addr().(*net.TCPAddr).Port)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus("shop.Orders", healthpb.HealthCheckResponse_SERVING)

	named := "shop.Orders"
	pod := testPod("grpc", corev1.Container{
		Name: "whole", Image: images.Sleeper,
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: port}}, PeriodSeconds: 1, FailureThreshold: 1},
	}, corev1.Container{
		Name: "named", Image: images.Sleeper,
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: port, Service: &named}}, PeriodSeconds: 1, FailureThreshold: 1},
	})
	pod.Spec.HostNetwork = true
	ready := func(name string, want bool) func(*edge.PodStatus) bool {
		return func(st *edge.PodStatus) bool {
			c := containerStatus(st, name)
			return c.State == edge.ContainerRunning && c.Ready == want
		}
	}
	e.syncUntil(t, pod, 30*time.Second, "named service ready", ready("named", true))
	e.syncUntil(t, pod, 10*time.Second, "whole server not ready while NOT_SERVING", ready("whole", false))
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	e.syncUntil(t, pod, 10*time.Second, "whole server ready once SERVING", ready("whole", true))
	hs.SetServingStatus("shop.Orders", healthpb.HealthCheckResponse_NOT_SERVING)
	e.syncUntil(t, pod, 10*time.Second, "named service not ready once NOT_SERVING", ready("named", false))
}
