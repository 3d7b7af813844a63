package edge

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestHostPortsOf checks how a pod's host ports pair with its addresses:
// a port without hostIP on every address of a dual-stack pod, one with a
// hostIP on the address of its family; host-network pods have none.
func TestHostPortsOf(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "a", Ports: []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 80}, {ContainerPort: 9090}}},
		{Name: "b", Ports: []corev1.ContainerPort{
			{ContainerPort: 53, HostPort: 5353, Protocol: corev1.ProtocolUDP, HostIP: "192.0.2.1"},
			{ContainerPort: 443, HostPort: 443, HostIP: "2001:db8::1"},
		}},
	}}}
	ips := []netip.Addr{netip.MustParseAddr("10.42.0.5"), netip.MustParseAddr("fd42::5")}
	var got []string
	for _, p := range hostPortsOf(containerHostPorts(pod), ips) {
		got = append(got, p.String())
	}
	want := []string{
		"*:80/TCP -> 10.42.0.5:8080", "*:80/TCP -> fd42::5:8080",
		"192.0.2.1:5353/UDP -> 10.42.0.5:53",
		"2001:db8::1:443/TCP -> fd42::5:443",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("host ports:\n %s\nwant\n %s", strings.Join(got, "\n "), strings.Join(want, "\n "))
	}
	pod.Spec.HostNetwork = true
	if hp := containerHostPorts(pod); hp != nil {
		t.Fatalf("host-network pod: %v, want none", hp)
	}
}
