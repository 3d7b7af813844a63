package registry

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestServiceCellsAddresses(t *testing.T) {
	_, serviceKind := newServices(t, ServiceNetwork{})
	now := time.Now()
	lb := newService("lb", corev1.ServiceTypeLoadBalancer)
	lb.Spec.ClusterIPs = []string{"10.0.0.22", "fd00::16"}
	lb.Spec.ClusterIP = "10.0.0.22"
	lb.Spec.ExternalIPs = []string{"192.0.2.9"}
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.7"}, {Hostname: "lb.example"}, {IP: "198.51.100.7"}, {IP: "198.51.100.10"}}
	headless := newService("db", "")
	headless.Spec.ClusterIP = corev1.ClusterIPNone
	headless.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
	headless.Spec.Ports = nil
	for _, tt := range []struct {
		name string
		svc  *corev1.Service
		want []any
	}{
		// Ingress addresses sorted and once each, then the external IPs;
		// the first cluster IP of a dual-stack Service.
		{"load balancer", lb, []any{"lb", "LoadBalancer", "10.0.0.22", "198.51.100.10,198.51.100.7,lb.example,192.0.2.9", "80/TCP", "<unknown>", "app=lb"}},
		{"headless without ports", headless, []any{"db", "ClusterIP", "None", "<none>", "<none>", "<unknown>", "app=db"}},
	} {
		if got := serviceKind.Cells(tt.svc, now); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: cells = %#v, want %#v", tt.name, got, tt.want)
		}
	}
}
