package containerd

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServiceEnv implements edge.Sources with the variables the test set.
func (f *fakeSources) ServiceEnv(*corev1.Pod) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for k, v := range f.serviceEnv {
		out[k] = v
	}
	return out, nil
}

// TestContainerEnvServices checks how Service variables join a container's
// environment: the container's env wins over them, its $(VAR) references
// see them, and the rest follow the container's own variables.
func TestContainerEnvServices(t *testing.T) {
	src := newFakeSources()
	src.serviceEnv = map[string]string{
		"KUBERNETES_SERVICE_HOST":   "10.0.0.1",
		"KUBERNETES_SERVICE_PORT":   "443",
		"REDIS_MASTER_SERVICE_HOST": "10.0.0.11",
	}
	r := &Runtime{}
	r.SetSources(src)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"}}
	c := &corev1.Container{Name: "app", Env: []corev1.EnvVar{
		{Name: "API", Value: "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
		{Name: "REDIS_MASTER_SERVICE_HOST", Value: "override"},
	}}
	env, err := r.containerEnv(pod, c, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"API=https://10.0.0.1:443",
		"REDIS_MASTER_SERVICE_HOST=override",
		"KUBERNETES_SERVICE_HOST=10.0.0.1",
		"KUBERNETES_SERVICE_PORT=443",
	}
	if !slices.Equal(env, want) {
		t.Errorf("env = %q, want %q", env, want)
	}

	// Command and args see them too, as specOpts passes the final
	// environment.
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	c.Command, c.Args = []string{"/testapp", "get"}, []string{"https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)/api"}
	if args := containerArgs(c, nil, nil, vars); !slices.Equal(args, []string{"/testapp", "get", "https://10.0.0.1:443/api"}) {
		t.Errorf("args = %q", args)
	}
}
