package testbench

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/testbench/images"
)

// TestContainerdInClusterThroughNAT runs pods that use the hub's API as
// in-cluster clients do on a containerd node behind its site's NAT, whose
// pods have no route to the hub at all: the node's eBPF dataplane sends
// their connections to the kubernetes Service to the agent's API relay,
// which carries them over the node's tunnel to the hub, where the pod's
// service account token authenticates them. It checks the service account
// volume and variables of a pod, that client-go's in-cluster configuration
// lists pods, that a service account may do exactly what its Role allows
// and the default one nothing beyond discovery, that a Helm chart's own
// ServiceAccount, Role and RoleBinding give its pod exactly those
// permissions, that automountServiceAccountToken: false (of the pod or of
// its ServiceAccount) mounts nothing, that a projected token for another
// audience is bound to its pod, the Service environment variables of the
// Kubernetes concept page, that NodePorts answer a pod and the node itself
// on the node's own address, that externalTrafficPolicy Local answers only
// where a backend runs, that a LoadBalancer Service answers on the node's
// address at its own port, and that a Service without a selector carries
// traffic to a hand-written Endpoints object.
//
// The dataplane is attached to the cgroup of the containers of the
// machine's containerd namespace (tether), so that it sees the pods' sockets
// and not the other lab processes'.
func TestContainerdInClusterThroughNAT(t *testing.T) {
	requireContainerdNode(t)
	cgroup := containersCgroup(t)
	// Helm is built before the lab comes up: a cold build takes minutes.
	hubtest.Helm(t)
	pins := fmt.Sprintf("/sys/fs/bpf/tether-incluster-%d", os.Getpid())
	t.Cleanup(func() { _ = os.RemoveAll(pins) }) // unpinning detaches the programs

	l, h, archive := upCtrLab(t, t.TempDir(), 1024, SiteSpec{Name: "shop", Nodes: 1})
	n := startCtrNode(t, l, h, "shop-n1", "shop", []string{archive},
		"--dataplane", "ebpf", "--dataplane-cgroup", cgroup, "--bpf-pin-dir", pins, "--uplinks", "none")
	h.waitReady(90*time.Second, "shop-n1")

	// Nothing the pods send to the hub's address leaves the node: only
	// the agent's own tunnel does.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := l.Exec(ctx, "shop-n1", "ip", "rule", "add", "to", l.Hub().Addr+"/32", "iif", "tether0", "prohibit"); err != nil {
		t.Fatalf("cut the pod network off the hub: %v\n%s", err, out)
	}

	h.applyManifest(t, fmt.Sprintf(inClusterObjects, images.Sleeper))
	eventually(t, 90*time.Second, "sa, reader, nosa, quiet, vault, env and nolinks Running; incluster Succeeded", func() (bool, string) {
		pods, err := h.podsByName()
		if err != nil {
			return false, err.Error()
		}
		want := map[string]corev1.PodPhase{"sa": corev1.PodRunning, "reader": corev1.PodRunning, "nosa": corev1.PodRunning, "quiet": corev1.PodRunning, "vault": corev1.PodRunning,
			"env": corev1.PodRunning, "nolinks": corev1.PodRunning, "incluster": corev1.PodSucceeded}
		var states []string
		ok := true
		for name, phase := range want {
			p := pods[name]
			if p == nil {
				ok = false
				states = append(states, name+"=missing")
				continue
			}
			n.track(p)
			ok = ok && p.Status.Phase == phase
			states = append(states, name+"="+string(p.Status.Phase))
		}
		return ok, strings.Join(states, " ")
	})

	t.Run("no route from pods to the hub", func(t *testing.T) {
		out, err := h.run("exec", "sa", "--", "/testapp", "get", "http://"+h.api+"/")
		if err == nil || !strings.Contains(out, "dial tcp") {
			t.Errorf("a pod reached the hub's address directly: %v\n%s", err, out)
		}
	})
	t.Run("service account volume and variables", func(t *testing.T) {
		dir := "/var/run/secrets/kubernetes.io/serviceaccount/"
		if out := h.must(t, "exec", "sa", "--", "cat", dir+"namespace"); out != "default" {
			t.Errorf("namespace file: %q", out)
		}
		if out := h.must(t, "exec", "sa", "--", "cat", dir+"ca.crt"); !strings.Contains(out, "BEGIN CERTIFICATE") {
			t.Errorf("ca.crt: %q", out)
		}
		claims := jwtClaims(t, h.must(t, "exec", "sa", "--", "cat", dir+"token"))
		if sub, _ := claims["sub"].(string); sub != "system:serviceaccount:default:default" {
			t.Errorf("token subject %q", sub)
		}
		env := h.must(t, "exec", "sa", "--", "env")
		for _, want := range []string{"KUBERNETES_SERVICE_HOST=10.0.0.1\n", "KUBERNETES_SERVICE_PORT=443\n", "KUBERNETES_PORT=tcp://10.0.0.1:443\n"} {
			if !strings.Contains(env, want) {
				t.Errorf("env lacks %s", strings.TrimSpace(want))
			}
		}
	})
	t.Run("in-cluster client lists pods", func(t *testing.T) {
		out := h.must(t, "logs", "incluster")
		if !strings.Contains(out, "incluster: discovery OK") || !strings.Contains(out, "incluster: list:pods OK ") {
			t.Errorf("testapp incluster said %q", out)
		}
		// The agent relayed the connection.
		metrics := h.must(t, "get", "--raw", "/api/v1/nodes/shop-n1/proxy/metrics")
		relayed := -1
		for _, line := range strings.Split(metrics, "\n") {
			if v, ok := strings.CutPrefix(line, "tether_edge_api_relay_connections_total "); ok {
				fmt.Sscan(v, &relayed)
			}
		}
		if relayed < 1 {
			t.Errorf("tether_edge_api_relay_connections_total = %d, want at least 1", relayed)
		}
	})
	t.Run("a Role's permissions and no more", func(t *testing.T) {
		reader := "system:serviceaccount:default:reader"
		inClusterChecks(t, h, "reader", map[string]string{
			"discovery":               "OK",
			"list:pods":               "OK",
			"get:pods/reader":         "OK",
			"list:secrets":            forbidden(reader, "list", "secrets", "", "", "default"),
			"list:pods@kube-system":   forbidden(reader, "list", "pods", "", "", "kube-system"),
			"list:pods@*":             forbidden(reader, "list", "pods", "", "", ""),
			"delete:pods/nonexistent": forbidden(reader, "delete", "pods", "", "nonexistent", "default"),
			"list:deployments.apps":   forbidden(reader, "list", "deployments", "apps", "", "default"),
		})
		// The default service account is bound to nothing but what every
		// authenticated user may do.
		def := "system:serviceaccount:default:default"
		inClusterChecks(t, h, "sa", map[string]string{
			"discovery":       "OK",
			"list:pods":       forbidden(def, "list", "pods", "", "", "default"),
			"get:pods/sa":     forbidden(def, "get", "pods", "", "sa", "default"),
			"list:secrets":    forbidden(def, "list", "secrets", "", "", "default"),
			"list:configmaps": forbidden(def, "list", "configmaps", "", "", "default"),
		})
	})
	t.Run("a Helm chart's own service account and role", func(t *testing.T) {
		helmChartRBAC(t, h)
	})
	t.Run("automountServiceAccountToken false", func(t *testing.T) {
		// nosa opts out itself, quiet through its ServiceAccount.
		for _, pod := range []string{"nosa", "quiet"} {
			if out, err := h.run("exec", pod, "--", "ls", "/var/run/secrets/kubernetes.io/serviceaccount"); err == nil {
				t.Errorf("%s: the service account directory exists: %s", pod, out)
			}
			if out := h.must(t, "get", "pod", pod, "-o", "jsonpath={.spec.volumes}"); out != "" {
				t.Errorf("%s: volumes %s, want none", pod, out)
			}
		}
	})
	t.Run("projected token for vault", func(t *testing.T) {
		p, err := h.pod("vault")
		if err != nil {
			t.Fatal(err)
		}
		claims := jwtClaims(t, h.must(t, "exec", "vault", "--", "cat", "/var/run/secrets/vault/token"))
		if aud := fmt.Sprint(claims["aud"]); !strings.Contains(aud, "vault") {
			t.Errorf("aud %v, want vault", claims["aud"])
		}
		exp, _ := claims["exp"].(float64)
		if left := time.Until(time.Unix(int64(exp), 0)); left < 30*time.Minute || left > 2*time.Hour {
			t.Errorf("exp %v: %v from now, want about an hour", claims["exp"], left)
		}
		k8s, _ := claims["kubernetes.io"].(map[string]any)
		bound, _ := k8s["pod"].(map[string]any)
		if bound["name"] != "vault" || bound["uid"] != string(p.UID) {
			t.Errorf("token bound to %v, want pod vault %s", k8s["pod"], p.UID)
		}
	})
	t.Run("service environment variables", func(t *testing.T) {
		// A Service created after the pod's container gives it nothing.
		h.applyManifest(t, inClusterLateService)
		env := h.must(t, "exec", "env", "--", "env")
		vars := map[string]string{}
		for _, line := range strings.Split(env, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				vars[k] = v
			}
		}
		ip := strings.TrimSpace(h.must(t, "get", "svc", "redis-master", "-o", "jsonpath={.spec.clusterIP}"))
		for k, want := range map[string]string{
			"REDIS_MASTER_SERVICE_HOST":        ip,
			"REDIS_MASTER_SERVICE_PORT":        "6379",
			"REDIS_MASTER_SERVICE_PORT_REDIS":  "6379",
			"REDIS_MASTER_PORT":                "tcp://" + ip + ":6379",
			"REDIS_MASTER_PORT_6379_TCP":       "tcp://" + ip + ":6379",
			"REDIS_MASTER_PORT_6379_TCP_PROTO": "tcp",
			"REDIS_MASTER_PORT_6379_TCP_PORT":  "6379",
			"REDIS_MASTER_PORT_6379_TCP_ADDR":  ip,
			"FROM_SERVICE":                     ip + ":6379",
		} {
			if vars[k] != want {
				t.Errorf("%s=%q, want %q", k, vars[k], want)
			}
		}
		if _, ok := vars["LATE_SERVICE_HOST"]; ok {
			t.Error("a Service created after the container gave it variables")
		}
		nolinks := h.must(t, "exec", "nolinks", "--", "env")
		if !strings.Contains(nolinks, "KUBERNETES_SERVICE_HOST=10.0.0.1\n") || strings.Contains(nolinks, "REDIS_MASTER") {
			t.Errorf("enableServiceLinks false: want only the KUBERNETES_* variables:\n%s", nolinks)
		}
	})
	t.Run("NodePort and LoadBalancer Services and a hand-written Endpoints object", func(t *testing.T) {
		inClusterServices(t, h, l.Nodes("shop")[0])
	})
}

// inClusterServices checks, from a pod of the node and from the node
// itself (a process of its network namespace: a host-network pod),
// that a NodePort answers on the node's own address with every backend,
// under both traffic policies (the backends run on this node); that with
// externalTrafficPolicy Local a NodePort whose only backend is recorded on
// another node is refused here while the same backend answers through a
// Cluster one, until its EndpointSlice puts it on this node; and that a
// Service without a selector carries traffic to the address of a
// hand-written Endpoints object within 5s of its creation (EndpointSlice
// mirroring, then the node's dataplane); and that a LoadBalancer Service
// gets the node's address as its EXTERNAL-IP and answers on it at its own
// port.
func inClusterServices(t *testing.T, h *labHub, node *Host) {
	nodeIP := node.Addr
	h.applyManifest(t, fmt.Sprintf(inClusterServiceObjects, images.Echo, images.Sleeper))
	var backends []string
	eventually(t, 90*time.Second, "two echo backends Running and Ready, hostnet Running", func() (bool, string) {
		pods, err := h.podsByName()
		if err != nil {
			return false, err.Error()
		}
		if p := pods["hostnet"]; p == nil || p.Status.Phase != corev1.PodRunning {
			return false, "hostnet not Running"
		}
		backends = backends[:0]
		for name, p := range pods {
			if p.Labels["app"] == "np" && p.Status.PodIP != "" && podIsReady(p) {
				backends = append(backends, name)
			}
		}
		return len(backends) == 2, fmt.Sprint(backends)
	})
	get := func(url string) (string, error) {
		out, err := h.run("exec", "sa", "--", "/testapp", "get", url)
		return strings.TrimSpace(out), err
	}
	// The node itself: a process of the node's network namespace (a
	// pod of the host network, in the dataplane's cgroup).
	fromNode := func(url string) (string, error) {
		out, err := h.run("exec", "hostnet", "--", "/testapp", "get", url)
		return strings.TrimSpace(out), err
	}
	clients := []struct {
		name string
		get  func(string) (string, error)
	}{{"a pod", get}, {"the node", fromNode}}
	for _, c := range clients {
		for _, port := range []int{30080, 30081} {
			seen := map[string]bool{}
			eventually(t, 60*time.Second, fmt.Sprintf("node port %d answers %s from both backends", port, c.name), func() (bool, string) {
				out, err := c.get(fmt.Sprintf("http://%s:%d/", nodeIP, port))
				if err != nil {
					return false, out
				}
				seen[out] = true
				return len(seen) == 2, fmt.Sprint(seen)
			})
		}
	}

	// The LoadBalancer Service gets the node's address as its ingress
	// (the hub's service-lb-controller) and answers on its own port
	// there, through the node's dataplane.
	eventually(t, 30*time.Second, "the LoadBalancer Service's EXTERNAL-IP is the node's address", func() (bool, string) {
		out, err := h.run("get", "svc", "lb", "--no-headers")
		f := strings.Fields(out)
		return err == nil && len(f) > 3 && f[3] == nodeIP, out
	})
	for _, c := range clients {
		seen := map[string]bool{}
		eventually(t, 30*time.Second, "the LoadBalancer Service answers "+c.name+" on the node's address from both backends", func() (bool, string) {
			out, err := c.get(fmt.Sprintf("http://%s:8090/", nodeIP))
			if err != nil {
				return false, out
			}
			seen[out] = true
			return len(seen) == 2, fmt.Sprint(seen)
		})
	}

	// A backend that the EndpointSlices place on another node: the
	// Cluster NodePort reaches it, the Local one is refused here.
	away, err := h.pod(backends[0])
	if err != nil {
		t.Fatal(err)
	}
	h.applyManifest(t, fmt.Sprintf(inClusterAwayServices, away.Status.PodIP, "shop-n2"))
	for _, c := range clients {
		eventually(t, 30*time.Second, "the Cluster NodePort reaches the backend placed on another node from "+c.name, func() (bool, string) {
			out, err := c.get(fmt.Sprintf("http://%s:30082/", nodeIP))
			return err == nil && strings.Contains(out, backends[0]), out
		})
		for range 3 {
			if out, err := c.get(fmt.Sprintf("http://%s:30083/", nodeIP)); err == nil {
				t.Errorf("the Local NodePort without a backend on this node answered %s: %s", c.name, out)
			}
		}
	}
	h.applyManifest(t, fmt.Sprintf(inClusterAwayServices, away.Status.PodIP, node.Name))
	for _, c := range clients {
		eventually(t, 30*time.Second, "the Local NodePort answers "+c.name+" once its backend is on this node", func() (bool, string) {
			out, err := c.get(fmt.Sprintf("http://%s:30083/", nodeIP))
			return err == nil && strings.Contains(out, backends[0]), out
		})
	}

	p, err := h.pod(backends[0])
	if err != nil {
		t.Fatal(err)
	}
	ip := strings.TrimSpace(h.must(t, "get", "svc", "manual", "-o", "jsonpath={.spec.clusterIP}"))
	if out, err := get("http://" + ip + "/"); err == nil {
		t.Fatalf("the selector-less Service answered before it had Endpoints: %s", out)
	}
	created := time.Now()
	h.applyManifest(t, fmt.Sprintf(inClusterManualEndpoints, p.Status.PodIP))
	var firstOK time.Duration
	eventually(t, 30*time.Second, "the selector-less Service answers through its Endpoints", func() (bool, string) {
		began := time.Since(created)
		out, err := get("http://" + ip + "/")
		if err != nil || !strings.Contains(out, backends[0]) {
			return false, out
		}
		firstOK = began
		return true, ""
	})
	t.Logf("the selector-less Service answered through its Endpoints from an attempt %v after they were created", firstOK.Round(time.Millisecond))
	if firstOK > 5*time.Second {
		t.Errorf("the first attempt that reached the Endpoints' address began %v after they were created, want within 5s", firstOK)
	}
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

const inClusterServiceObjects = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: np}
spec:
  replicas: 2
  selector: {matchLabels: {app: np}}
  template:
    metadata: {labels: {app: np}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: %[1]s
        imagePullPolicy: Never
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: hostnet}
spec:
  terminationGracePeriodSeconds: 1
  hostNetwork: true
  containers: [{name: app, image: %[2]s, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Service
metadata: {name: np-cluster}
spec:
  type: NodePort
  selector: {app: np}
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: v1
kind: Service
metadata: {name: np-local}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  selector: {app: np}
  ports: [{port: 80, targetPort: 8080, nodePort: 30081}]
---
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  selector: {app: np}
  ports: [{port: 8090, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: manual}
spec:
  ports: [{port: 80}]
`

// inClusterAwayServices are two selector-less NodePort Services, Local
// and Cluster, whose EndpointSlices hold one backend address (%[1]s) on
// node %[2]s. The Local one comes first: the node's watches deliver
// objects in order, so once the Cluster one answers the node holds both.
const inClusterAwayServices = `
apiVersion: v1
kind: Service
metadata: {name: away-local}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  ports: [{port: 80, targetPort: 8080, nodePort: 30083}]
---
apiVersion: v1
kind: Service
metadata: {name: away-cluster}
spec:
  type: NodePort
  ports: [{port: 80, targetPort: 8080, nodePort: 30082}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: away-local-1
  labels: {kubernetes.io/service-name: away-local, endpointslice.kubernetes.io/managed-by: staff}
addressType: IPv4
ports: [{port: 8080, protocol: TCP}]
endpoints: [{addresses: [%[1]s], nodeName: %[2]s, conditions: {ready: true}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: away-cluster-1
  labels: {kubernetes.io/service-name: away-cluster, endpointslice.kubernetes.io/managed-by: staff}
addressType: IPv4
ports: [{port: 8080, protocol: TCP}]
endpoints: [{addresses: [%[1]s], nodeName: %[2]s, conditions: {ready: true}}]
`

const inClusterManualEndpoints = `
apiVersion: v1
kind: Endpoints
metadata: {name: manual}
subsets:
- addresses: [{ip: %s}]
  ports: [{port: 8080}]
`

const inClusterObjects = `
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader}
rules: [{apiGroups: [""], resources: [pods], verbs: [get, list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader-reads-pods}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}
subjects: [{kind: ServiceAccount, name: reader, namespace: default}]
---
apiVersion: v1
kind: Service
metadata: {name: redis-master}
spec:
  ports: [{name: redis, port: 6379, protocol: TCP}]
---
apiVersion: v1
kind: Pod
metadata: {name: sa}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: app, image: %[1]s, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Pod
metadata: {name: incluster}
spec:
  restartPolicy: Never
  serviceAccountName: reader
  containers: [{name: app, image: %[1]s, imagePullPolicy: Never, command: [/testapp, incluster, discovery, list:pods]}]
---
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  terminationGracePeriodSeconds: 1
  serviceAccountName: reader
  containers: [{name: app, image: %[1]s, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Pod
metadata: {name: nosa}
spec:
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  containers: [{name: app, image: %[1]s, imagePullPolicy: Never}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: quiet}
automountServiceAccountToken: false
---
apiVersion: v1
kind: Pod
metadata: {name: quiet}
spec:
  terminationGracePeriodSeconds: 1
  serviceAccountName: quiet
  containers: [{name: app, image: %[1]s, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Pod
metadata: {name: vault}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %[1]s
    imagePullPolicy: Never
    volumeMounts: [{name: vault-token, mountPath: /var/run/secrets/vault}]
  volumes:
  - name: vault-token
    projected:
      sources: [{serviceAccountToken: {audience: vault, expirationSeconds: 3600, path: token}}]
---
apiVersion: v1
kind: Pod
metadata: {name: env}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %[1]s
    imagePullPolicy: Never
    env: [{name: FROM_SERVICE, value: "$(REDIS_MASTER_SERVICE_HOST):$(REDIS_MASTER_SERVICE_PORT)"}]
---
apiVersion: v1
kind: Pod
metadata: {name: nolinks}
spec:
  terminationGracePeriodSeconds: 1
  enableServiceLinks: false
  containers: [{name: app, image: %[1]s, imagePullPolicy: Never}]
`

const inClusterLateService = `
apiVersion: v1
kind: Service
metadata: {name: late}
spec:
  ports: [{port: 80}]
`

// inClusterChecks runs testapp's in-cluster checks in pod (of the default
// namespace unless pod is NAMESPACE/NAME) and compares each outcome with
// want: "OK" for any success, otherwise the status code and message. The
// authorizer learns of roles and bindings through a watch, as upstream's
// does, so the checks are tried again for a few seconds before the
// differences are reported.
func inClusterChecks(t *testing.T, h *labHub, pod string, want map[string]string) {
	t.Helper()
	ns, name, ok := strings.Cut(pod, "/")
	if !ok {
		ns, name = "default", pod
	}
	args := []string{"exec", "-n", ns, name, "--", "/testapp", "incluster"}
	for check := range want {
		args = append(args, check)
	}
	var wrong []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		out := h.must(t, args...)
		got := map[string]string{}
		for _, line := range strings.Split(out, "\n") {
			if rest, ok := strings.CutPrefix(line, "incluster: "); ok {
				check, outcome, _ := strings.Cut(rest, " ")
				got[check] = outcome
			}
		}
		wrong = wrong[:0]
		for check, w := range want {
			g, ok := got[check]
			switch {
			case !ok:
				wrong = append(wrong, fmt.Sprintf("%s: %s printed nothing for it:\n%s", pod, check, out))
			case w == "OK" && g != "OK" && !strings.HasPrefix(g, "OK "):
				wrong = append(wrong, fmt.Sprintf("%s: %s: %s, want it allowed", pod, check, g))
			case w != "OK" && g != w:
				wrong = append(wrong, fmt.Sprintf("%s: %s:\n got %s\nwant %s", pod, check, g, w))
			}
		}
		if len(wrong) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, w := range wrong {
		t.Error(w)
	}
}

// forbidden is the status code and message upstream's API server answers
// when RBAC denies user verb on resource (of group, named name, in
// namespace ns or, without one, across the cluster).
func forbidden(user, verb, resource, group, name, ns string) string {
	qualified := resource
	if group != "" {
		qualified += "." + group
	}
	subject := qualified
	if name != "" {
		subject += fmt.Sprintf(" %q", name)
	}
	scope := "at the cluster scope"
	if ns != "" {
		scope = fmt.Sprintf("in the namespace %q", ns)
	}
	return fmt.Sprintf("403 %s is forbidden: User %q cannot %s resource %q in API group %q %s",
		subject, user, verb, resource, group, scope)
}

// jwtClaims decodes the claims of a JWT, unverified.
func jwtClaims(t *testing.T, token string) map[string]any {
	t.Helper()
	parts := strings.Split(strings.TrimSpace(token), ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %q", token)
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatalf("decode JWT claims: %v", err)
	}
	var claims map[string]any
	if err := json.Unmarshal(b, &claims); err != nil {
		t.Fatalf("decode JWT claims: %v", err)
	}
	return claims
}

// containersCgroup is the cgroup v2 directory of the containers of
// tether's containerd namespace (created if missing), where runc puts
// every container of the machine's containerd nodes.
func containersCgroup(t *testing.T) string {
	t.Helper()
	root := cgroup2Root()
	if root == "" {
		t.Skip("no cgroup v2 hierarchy is mounted; the dataplane needs one")
	}
	dir := filepath.Join(root, "tether")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("containers' cgroup: %v", err)
	}
	return dir
}

// cgroup2Root is where the cgroup v2 hierarchy is mounted, or "".
func cgroup2Root() string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if f, g := strings.Fields(pre), strings.Fields(post); ok && len(f) > 4 && len(g) > 0 && g[0] == "cgroup2" {
			return f[4]
		}
	}
	return ""
}
