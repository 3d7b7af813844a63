package registry

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
)

// serviceCells is a Service's row of `kubectl get services`, as upstream
// prints it: the first cluster IP or <none> (an ExternalName Service has
// none), the external addresses, the ports or <none>, the age and, for
// -o wide, the selector.
func serviceCells(svc *corev1.Service, now time.Time) []any {
	clusterIP := "<none>"
	if len(svc.Spec.ClusterIPs) > 0 {
		clusterIP = svc.Spec.ClusterIPs[0]
	} else if svc.Spec.ClusterIP != "" {
		clusterIP = svc.Spec.ClusterIP
	}
	ports := servicePorts(svc.Spec.Ports)
	if ports == "" {
		ports = "<none>"
	}
	return []any{svc.Name, string(svc.Spec.Type), clusterIP, serviceExternalIP(svc),
		ports, age(svc.CreationTimestamp, now), labels.FormatLabels(svc.Spec.Selector)}
}

// serviceExternalIP is the EXTERNAL-IP column: the external IPs, for a
// LoadBalancer its ingress addresses (sorted, without repeats) first, and
// <pending> while it has none; the external name of an ExternalName
// Service.
func serviceExternalIP(svc *corev1.Service) string {
	switch svc.Spec.Type {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort:
		if len(svc.Spec.ExternalIPs) > 0 {
			return strings.Join(svc.Spec.ExternalIPs, ",")
		}
		return "<none>"
	case corev1.ServiceTypeLoadBalancer:
		ingress := sets.New[string]()
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				ingress.Insert(in.IP)
			} else if in.Hostname != "" {
				ingress.Insert(in.Hostname)
			}
		}
		out := append(sets.List(ingress), svc.Spec.ExternalIPs...)
		if len(out) == 0 {
			return "<pending>"
		}
		return strings.Join(out, ",")
	case corev1.ServiceTypeExternalName:
		return svc.Spec.ExternalName
	}
	return "<unknown>"
}

// servicePorts is the PORT(S) column without its <none>: port/protocol,
// or port:nodePort/protocol, comma separated.
func servicePorts(ports []corev1.ServicePort) string {
	out := make([]string, len(ports))
	for i, p := range ports {
		if p.NodePort > 0 {
			out[i] = fmt.Sprintf("%d:%d/%s", p.Port, p.NodePort, p.Protocol)
		} else {
			out[i] = fmt.Sprintf("%d/%s", p.Port, p.Protocol)
		}
	}
	return strings.Join(out, ",")
}
