package containerd

import (
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
)

// serviceEnv returns the Service variables of a container of pod, as the
// agent's Sources give them.
func serviceEnv(src edge.Sources, pod *corev1.Pod) (map[string]string, error) {
	if src == nil {
		return nil, nil
	}
	// The error is the kubelet's own, as is.
	return src.ServiceEnv(pod)
}

// lookupIn looks a variable up in the container's own variables first,
// then in the Service ones.
func lookupIn(vars, svcEnv map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		if v, ok := vars[name]; ok {
			return v, true
		}
		v, ok := svcEnv[name]
		return v, ok
	}
}

// remainingServiceEnv returns, sorted, the Service variables the
// container's own variables do not set, as KEY=VALUE.
func remainingServiceEnv(svcEnv, vars map[string]string) []string {
	keys := make([]string, 0, len(svcEnv))
	for k := range svcEnv {
		if _, ok := vars[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+svcEnv[k])
	}
	return out
}
