package servicelb

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
	"github.com/tether-edge/tether/hub/hubtest"
)

// lbManifest is a LoadBalancer Service of port, selecting app=name.
func lbManifest(name, port, extra string) string {
	return `apiVersion: v1
kind: Service
metadata: {name: ` + name + `, namespace: default}
spec:
  type: LoadBalancer
  selector: {app: ` + name + `}
  ports: [{port: ` + port + `, protocol: TCP}]
` + extra
}

// externalIP is kubectl's EXTERNAL-IP column of Service name.
func externalIP(t *testing.T, e *kittest.Env, name string) string {
	t.Helper()
	out := e.Kubectl(t, "get", "svc", name, "--no-headers")
	f := strings.Fields(out)
	if len(f) < 4 {
		t.Fatalf("kubectl get svc %s: %q", name, out)
	}
	return f[3]
}

// waitExternalIP waits until kubectl shows want as name's EXTERNAL-IP.
func waitExternalIP(t *testing.T, e *kittest.Env, name, want string) {
	t.Helper()
	var got string
	kittest.WaitFor(t, name+" EXTERNAL-IP "+want, 20*time.Second, func() (bool, error) {
		got = externalIP(t, e, name)
		return got == want, nil
	})
}

// TestServiceLBAgainstHub runs the hub's own service-lb-controller (under
// its ServiceAccount and role) with two hollow nodes and a third whose
// status the test writes, and follows what kubectl shows of LoadBalancer
// Services as nodes (labels, cordons, Ready, removal) and Services
// (conflicts, classes, types) change.
func TestServiceLBAgainstHub(t *testing.T) {
	e := kittest.Start(t, nil, 2)
	// A third node whose agent is stopped at once, so that only the test
	// writes its status (the hub's node lifecycle waits 40s before it
	// does): it gets an ExternalIP, which it serves on.
	gone := e.JoinNodes(t, kittest.Nodes{Prefix: "gone-", N: 1})
	gone.Stop()
	const goneIP = "192.0.2.7"
	e.Kubectl(t, "patch", "node", "gone-00000", "--subresource=status", "--type=merge",
		"-p", `{"status":{"addresses":[{"type":"InternalIP","address":"100.64.0.1"},{"type":"ExternalIP","address":"`+goneIP+`"}]}}`)
	ctx := context.Background()
	var nodes []*corev1.Node
	var all []string
	kittest.WaitFor(t, "three Ready nodes with addresses", 20*time.Second, func() (bool, error) {
		nl, err := e.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		nodes = nodes[:0]
		for i := range nl.Items {
			nodes = append(nodes, &nl.Items[i])
		}
		all = Addresses(Eligible(nodes))
		return len(all) == 3 && slices.Contains(all, goneIP), nil
	})
	t.Logf("node addresses: %v", all)

	e.Apply(t, lbManifest("web", "80", ""))
	waitExternalIP(t, e, "web", strings.Join(all, ","))

	// A newer Service on the same port waits, with a Warning event.
	e.Apply(t, lbManifest("web2", "80", ""))
	kittest.WaitFor(t, "a PortConflict event", 20*time.Second, func() (bool, error) {
		ev, err := e.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=web2,reason=" + ReasonPortConflict})
		if err != nil || len(ev.Items) == 0 {
			return false, err
		}
		want := "port 80/TCP is already used on the node addresses by LoadBalancer Service default/web"
		return ev.Items[0].Type == corev1.EventTypeWarning && ev.Items[0].Message == want && ev.Items[0].Source.Component == Name, nil
	})
	// Another controller's class: left alone, even when its port is free.
	e.Apply(t, lbManifest("other", "8443", "  loadBalancerClass: example.com/lb\n"))
	// Another port: served.
	e.Apply(t, lbManifest("dns", "53", ""))
	waitExternalIP(t, e, "dns", strings.Join(all, ","))
	if got := externalIP(t, e, "web2"); got != "<pending>" {
		t.Fatalf("web2 in conflict shows %q, want <pending>", got)
	}
	if got := externalIP(t, e, "other"); got != "<pending>" {
		t.Fatalf("Service of another class shows %q, want <pending>", got)
	}

	// Only labelled nodes once one is; a cordoned node drops out.
	first := nodes[slices.IndexFunc(nodes, func(n *corev1.Node) bool { return n.Name == "node-00000" })]
	e.Kubectl(t, "label", "node", first.Name, LabelLoadBalancer+"=true")
	waitExternalIP(t, e, "web", strings.Join(Addresses([]*corev1.Node{first}), ","))
	e.Kubectl(t, "cordon", first.Name)
	waitExternalIP(t, e, "web", "<pending>")
	e.Kubectl(t, "uncordon", first.Name)
	e.Kubectl(t, "label", "node", first.Name, LabelLoadBalancer+"-")
	waitExternalIP(t, e, "web", strings.Join(all, ","))

	// The holder gone, the newer Service gets the port.
	e.Kubectl(t, "delete", "svc", "web")
	waitExternalIP(t, e, "web2", strings.Join(all, ","))

	// A node whose Ready condition turns Unknown drops out and comes
	// back when Ready; a removed node drops out. Its agent is stopped
	// first, so that only the test writes its status.
	rest := strings.Join(slices.DeleteFunc(slices.Clone(all), func(a string) bool { return a == goneIP }), ",")
	setReady := func(status corev1.ConditionStatus) {
		e.Kubectl(t, "patch", "node", "gone-00000", "--subresource=status", "--type=strategic",
			"-p", `{"status":{"conditions":[{"type":"Ready","status":"`+string(status)+`"}]}}`)
	}
	setReady(corev1.ConditionUnknown)
	waitExternalIP(t, e, "web2", rest)
	setReady(corev1.ConditionTrue)
	waitExternalIP(t, e, "web2", strings.Join(all, ","))
	e.Kubectl(t, "delete", "node", "gone-00000")
	waitExternalIP(t, e, "web2", rest)

	// No longer a LoadBalancer: the ingress is cleared.
	e.Kubectl(t, "patch", "svc", "dns", "--type=merge", "-p", `{"spec":{"type":"ClusterIP"}}`)
	kittest.WaitFor(t, "dns's ingress cleared", 20*time.Second, func() (bool, error) {
		s, err := e.Client.CoreV1().Services("default").Get(ctx, "dns", metav1.GetOptions{})
		return err == nil && len(s.Status.LoadBalancer.Ingress) == 0, err
	})

	// Stable: a sync that changes nothing writes no status. Annotating
	// a Service (one write) brings a sync of all of them.
	before := e.Writes(t, "services")
	if before == 0 {
		t.Fatal("no Service writes counted")
	}
	e.Kubectl(t, "annotate", "svc", "web2", "example.com/touched=yes")
	time.Sleep(2 * time.Second)
	if after := e.Writes(t, "services"); after != before+1 {
		t.Fatalf("Service writes went from %v to %v for one annotation", before, after)
	}
	svcs, err := e.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{LabelSelector: labels.Everything().String()})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		if s.Name == "other" && len(s.Status.LoadBalancer.Ingress) != 0 {
			t.Fatalf("Service of another class got ingress %v", s.Status.LoadBalancer.Ingress)
		}
	}
}

// lbChart is a chart of a Deployment and a LoadBalancer Service in front
// of it, as charts ship them.
var lbChart = map[string]string{
	"Chart.yaml": "apiVersion: v2\nname: storefront\nversion: 0.1.0\n",
	"templates/deployment.yaml": `apiVersion: apps/v1
kind: Deployment
metadata: {name: {{ .Release.Name }}-web}
spec:
  replicas: 1
  selector: {matchLabels: {app: {{ .Release.Name }}-web}}
  template:
    metadata: {labels: {app: {{ .Release.Name }}-web}}
    spec:
      containers:
      - name: web
        image: registry.example/storefront:1
        ports: [{name: http, containerPort: 8080}]
`,
	"templates/service.yaml": `apiVersion: v1
kind: Service
metadata: {name: {{ .Release.Name }}-web}
spec:
  type: LoadBalancer
  selector: {app: {{ .Release.Name }}-web}
  ports: [{name: http, port: 8088, targetPort: http}]
`,
}

// TestHelm3InstallWaitsForLoadBalancer installs lbChart with the pinned
// Helm 3, whose --wait waits for a LoadBalancer Service's ingress, and
// checks kubectl then shows the node address as its EXTERNAL-IP.
func TestHelm3InstallWaitsForLoadBalancer(t *testing.T) {
	e := kittest.Start(t, nil, 1)
	helm := hubtest.Helm3(t)
	chart := filepath.Join(t.TempDir(), "storefront")
	for name, text := range lbChart {
		p := filepath.Join(chart, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, helm, "install", "shop", chart, "--kubeconfig", e.Hub.Kubeconfig,
		"--namespace", "default", "--wait", "--timeout", "60s")
	cmd.Env = append(os.Environ(), hubtest.HelmEnv(t.TempDir())...)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm install --wait: %v\n%s", err, out)
	}
	t.Logf("helm install --wait took %v", time.Since(start).Round(time.Millisecond))
	n, err := e.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(n.Items) != 1 {
		t.Fatalf("nodes: %v %v", n, err)
	}
	want := Addresses([]*corev1.Node{&n.Items[0]})
	if got := externalIP(t, e, "shop-web"); !slices.Equal(strings.Split(got, ","), want) {
		t.Fatalf("EXTERNAL-IP %q, want %v", got, want)
	}
}
