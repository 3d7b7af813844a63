package edge

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// masterServiceName is the Service of the cluster's API in the default
// namespace, whose variables every container gets.
const masterServiceName = "kubernetes"

// ServiceEnv returns the Service environment variables the kubelet gives
// a container of pod when it is created, from services (every Service the
// node knows): those of the pod's namespace when its enableServiceLinks is
// true (the default), and those of the default/kubernetes Service always.
// Only Services with a cluster IP count. The caller adds the variables the
// container's own env does not set.
func ServiceEnv(pod *corev1.Pod, services []*corev1.Service) map[string]string {
	links := pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks
	chosen := map[string]*corev1.Service{}
	for _, svc := range services {
		if !serviceIPSet(svc) {
			continue
		}
		switch {
		case svc.Namespace == pod.Namespace && links:
			// A Service of the pod's own namespace wins over the
			// default namespace's master Service of the same name.
			chosen[svc.Name] = svc
		case svc.Namespace == metav1.NamespaceDefault && svc.Name == masterServiceName:
			if _, ok := chosen[svc.Name]; !ok {
				chosen[svc.Name] = svc
			}
		}
	}
	names := make([]string, 0, len(chosen))
	for n := range chosen {
		names = append(names, n)
	}
	sort.Strings(names)
	env := map[string]string{}
	for _, n := range names {
		serviceVars(chosen[n], env)
	}
	return env
}

// serviceIPSet tells whether svc has a cluster IP (neither None nor
// empty).
func serviceIPSet(svc *corev1.Service) bool {
	return svc.Spec.ClusterIP != corev1.ClusterIPNone && svc.Spec.ClusterIP != ""
}

// envName turns a Service or port name into a variable name.
func envName(s string) string {
	return strings.ToUpper(strings.ReplaceAll(s, "-", "_"))
}

// serviceVars adds the variables of one Service to env: the
// _SERVICE_HOST and _SERVICE_PORT ones (the first port, and one per named
// port), and the Docker link ones.
func serviceVars(svc *corev1.Service, env map[string]string) {
	if len(svc.Spec.Ports) == 0 {
		return
	}
	prefix := envName(svc.Name)
	ip := svc.Spec.ClusterIP
	env[prefix+"_SERVICE_HOST"] = ip
	portVar := prefix + "_SERVICE_PORT"
	env[portVar] = strconv.Itoa(int(svc.Spec.Ports[0].Port))
	for _, sp := range svc.Spec.Ports {
		if sp.Name != "" {
			env[portVar+"_"+envName(sp.Name)] = strconv.Itoa(int(sp.Port))
		}
	}
	for i, sp := range svc.Spec.Ports {
		proto := string(corev1.ProtocolTCP)
		if sp.Protocol != "" {
			proto = string(sp.Protocol)
		}
		lower := strings.ToLower(proto)
		url := lower + "://" + net.JoinHostPort(ip, strconv.Itoa(int(sp.Port)))
		if i == 0 {
			env[prefix+"_PORT"] = url
		}
		pp := fmt.Sprintf("%s_PORT_%d_%s", prefix, sp.Port, strings.ToUpper(proto))
		env[pp] = url
		env[pp+"_PROTO"] = lower
		env[pp+"_PORT"] = strconv.Itoa(int(sp.Port))
		env[pp+"_ADDR"] = ip
	}
}
