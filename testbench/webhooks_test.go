package testbench

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	certutil "k8s.io/client-go/util/cert"

	"github.com/tether-edge/tether/testbench/images"
)

// webhookObjects runs the project's webhook server (testapp webhook) in a
// pod behind Service webhooks/wh on port 443.
const webhookObjects = `
apiVersion: v1
kind: Namespace
metadata: {name: webhooks}
---
apiVersion: v1
kind: Pod
metadata: {name: wh, namespace: webhooks, labels: {app: wh}}
spec:
  containers:
  - name: wh
    image: %[1]s
    imagePullPolicy: Never
    command: [/testapp, webhook, ":8443"]
    env:
    - {name: WEBHOOK_CERT, value: %[2]q}
    - {name: WEBHOOK_KEY, value: %[3]q}
    ports: [{containerPort: 8443}]
---
apiVersion: v1
kind: Service
metadata: {name: wh, namespace: webhooks}
spec:
  selector: {app: wh}
  ports: [{name: https, port: 443, targetPort: 8443}]
`

// webhookConfigs select pods created in namespaces labelled inject=on.
// The mutating webhook ignores failures, the validating one's failure
// policy is %[2]s.
const webhookConfigs = `
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: edge-label}
webhooks:
- name: label.edge.tether.test
  clientConfig:
    service: {namespace: webhooks, name: wh, path: /mutate}
    caBundle: %[1]s
  failurePolicy: Ignore
  timeoutSeconds: 2
  rules: [{operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods]}]
  namespaceSelector: {matchLabels: {inject: "on"}}
  sideEffects: None
  admissionReviewVersions: [v1]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: edge-refuse}
webhooks:
- name: refuse.edge.tether.test
  clientConfig:
    service: {namespace: webhooks, name: wh, path: /validate}
    caBundle: %[1]s
  failurePolicy: %[2]s
  timeoutSeconds: 2
  rules: [{operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods]}]
  namespaceSelector: {matchLabels: {inject: "on"}}
  sideEffects: None
  admissionReviewVersions: [v1]
`

// TestContainerdAdmissionWebhooks serves admission webhooks from a pod on
// a containerd edge, reached by the hub through the node's tunnel: the
// mutating one labels every new pod of a namespace, the validating one
// refuses a pod with a message kubectl prints. With the site partitioned,
// each call times out after the webhook's timeoutSeconds and its
// failurePolicy decides (Ignore admits, Fail refuses with upstream's
// message) while the hub keeps answering other requests.
func TestContainerdAdmissionWebhooks(t *testing.T) {
	requireContainerdNode(t)
	l, h, archive := upCtrLab(t, t.TempDir(), 1024, SiteSpec{Name: "shop", Nodes: 1})
	startCtrNode(t, l, h, "shop-n1", "shop", []string{archive})
	h.waitReady(90*time.Second, "shop-n1")

	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("wh.webhooks.svc", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.applyManifest(t, fmt.Sprintf(webhookObjects, images.Echo, certPEM, keyPEM))
	eventually(t, 90*time.Second, "the webhook pod answering through services/proxy", func() (bool, string) {
		out, err := h.run("get", "--raw", "/api/v1/namespaces/webhooks/services/https:wh:443/proxy/healthz")
		return err == nil && out == "ok\n", fmt.Sprintf("%q %v", out, err)
	})
	ca := base64.StdEncoding.EncodeToString(certPEM)
	h.applyManifest(t, fmt.Sprintf(webhookConfigs, ca, "Fail"))
	h.must(t, "create", "namespace", "apps")
	h.must(t, "label", "namespace", "apps", "inject=on")

	i := 0
	runPod := func(labels string) (string, error) {
		i++
		args := []string{"run", fmt.Sprintf("p%d", i), "-n", "apps", "--image", images.Sleeper, "--image-pull-policy=Never", "--restart=Never"}
		if labels != "" {
			args = append(args, "--labels", labels)
		}
		return h.run(args...)
	}
	eventually(t, 30*time.Second, "a new pod labelled by the edge's mutating webhook", func() (bool, string) {
		out, err := runPod("")
		if err != nil {
			return false, fmt.Sprintf("%s %v", out, err)
		}
		got, err := h.run("get", "pod", fmt.Sprintf("p%d", i), "-n", "apps", "-o", "jsonpath={.metadata.labels.webhook}")
		return err == nil && got == "edge", fmt.Sprintf("label %q %v", got, err)
	})
	out, err := runPod("deny=true")
	if want := `admission webhook "refuse.edge.tether.test" denied the request: pods labelled deny=true are refused by wh`; err == nil || !strings.Contains(out+err.Error(), want) {
		t.Fatalf("pod labelled deny=true: %s %v; want %s", out, err, want)
	}

	if err := l.Partition("shop", Both); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Heal("shop") })
	// Other requests are served at once while webhook calls hang.
	quick := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		start := time.Now()
		_, err := h.run("get", "namespaces")
		if d := time.Since(start); err == nil && d > 3*time.Second {
			err = fmt.Errorf("took %v", d)
		}
		quick <- err
	}()
	start := time.Now()
	out, err = runPod("")
	took := time.Since(start)
	if want := `failed calling webhook "refuse.edge.tether.test"`; err == nil || !strings.Contains(out+err.Error(), want) {
		t.Fatalf("pod created with the site partitioned, failurePolicy Fail: %s %v; want %s", out, err, want)
	}
	t.Logf("failurePolicy Fail refused after %v: %s", took.Round(time.Millisecond), out)
	if took > 12*time.Second {
		t.Errorf("refusal took %v; the webhooks' timeoutSeconds are 2", took)
	}
	if err := <-quick; err != nil {
		t.Errorf("kubectl get namespaces while webhooks hung: %v", err)
	}

	h.applyManifest(t, fmt.Sprintf(webhookConfigs, ca, "Ignore"))
	eventually(t, 30*time.Second, "a pod admitted with failurePolicy Ignore on both webhooks", func() (bool, string) {
		out, err := runPod("")
		return err == nil, fmt.Sprintf("%s %v", out, err)
	})
	got := h.must(t, "get", "pod", fmt.Sprintf("p%d", i), "-n", "apps", "-o", "jsonpath={.metadata.labels.webhook}")
	if got != "" {
		t.Errorf("pod admitted with the site partitioned carries label webhook=%q", got)
	}
}
