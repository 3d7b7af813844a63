package testbench

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/testbench/images"
)

// TestContainerdAggregatedAPI runs an extension API server (testapp's
// aggregated mode) in a pod on a containerd edge behind its site's NAT and
// registers it with an APIService: the hub marks it Available, lists its
// group in discovery (legacy and aggregated), answers kubectl for its
// resource through the edge's tunnel, over TLS verified with the
// APIService's caBundle and with the caller's identity in the front-proxy
// headers the server trusts because of the hub's request-header CA, and
// authorizes the caller first; when the pod stops, the APIService goes
// Available=False with a reason.
func TestContainerdAggregatedAPI(t *testing.T) {
	requireContainerdNode(t)
	cgroup := containersCgroup(t)
	pins := fmt.Sprintf("/sys/fs/bpf/tether-aggregation-%d", os.Getpid())
	t.Cleanup(func() { _ = os.RemoveAll(pins) })

	l, h, archive := upCtrLab(t, t.TempDir(), 1024, SiteSpec{Name: "shop", Nodes: 1})
	n := startCtrNode(t, l, h, "shop-n1", "shop", []string{archive},
		"--dataplane", "ebpf", "--dataplane-cgroup", cgroup, "--bpf-pin-dir", pins, "--uplinks", "none")
	h.waitReady(90*time.Second, "shop-n1")

	certPEM, keyPEM := selfSignedServing(t, "echo-api.default.svc")
	h.applyManifest(t, fmt.Sprintf(aggregatedObjects, images.Sleeper, indent(string(certPEM)), indent(string(keyPEM)),
		base64.StdEncoding.EncodeToString(certPEM)))
	eventually(t, 90*time.Second, "pod echo-api Running", func() (bool, string) {
		p, err := h.pod("echo-api")
		if err != nil {
			return false, err.Error()
		}
		n.track(p)
		return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase)
	})
	const name = "v1alpha1.echo.tether.test"
	availability := func() string {
		out, _ := h.run("get", "apiservice", name, "-o",
			`jsonpath={.status.conditions[?(@.type=="Available")].status} {.status.conditions[?(@.type=="Available")].reason}`)
		return strings.TrimSpace(out)
	}
	running := time.Now()
	eventually(t, 30*time.Second, "APIService Available", func() (bool, string) {
		a := availability()
		return a == "True Passed", a + "\n" + h.must(t, "logs", "echo-api")
	})
	t.Logf("Available %v after the pod ran", time.Since(running).Round(100*time.Millisecond))

	t.Run("discovery", func(t *testing.T) {
		if out := h.must(t, "get", "--raw", "/apis"); !strings.Contains(out, `"name":"echo.tether.test"`) {
			t.Errorf("/apis lacks the group: %s", out)
		}
		if out := h.must(t, "get", "--raw", "/apis/echo.tether.test/v1alpha1"); !strings.Contains(out, `"name":"echoes"`) {
			t.Errorf("/apis/echo.tether.test/v1alpha1: %s", out)
		}
		// kubectl reads aggregated discovery.
		out := h.must(t, "api-resources", "--api-group=echo.tether.test")
		if !strings.Contains(out, "echoes") || !strings.Contains(out, "echo.tether.test/v1alpha1") {
			t.Errorf("kubectl api-resources: %s", out)
		}
	})
	t.Run("kubectl get through the hub carries the caller", func(t *testing.T) {
		out := h.must(t, "get", "echoes", "-n", "default")
		if !strings.Contains(out, "whoami") || !strings.Contains(out, "tether-admin") || !strings.Contains(out, "system:masters") {
			t.Errorf("kubectl get echoes as the admin:\n%s", out)
		}
		out = h.must(t, "get", "echo", "x", "-n", "default", "-o", "jsonpath={.spec.user} {.spec.groups}", "--as", "alice", "--as-group", "dev")
		if !strings.HasPrefix(out, "alice ") || !strings.Contains(out, "dev") {
			t.Errorf("kubectl get echo as alice: %s", out)
		}
		// The hub authorizes before it proxies: bob has no role.
		out, err := h.run("get", "echoes", "-n", "default", "--as", "bob")
		if err == nil || !strings.Contains(out, `User "bob" cannot list resource "echoes" in API group "echo.tether.test"`) {
			t.Errorf("bob: %v\n%s", err, out)
		}
	})
	t.Run("kubectl get apiservices", func(t *testing.T) {
		out := h.must(t, "get", "apiservices")
		if !strings.Contains(out, "default/echo-api") || !strings.Contains(out, "Local") {
			t.Errorf("kubectl get apiservices:\n%s", out)
		}
	})
	t.Run("unavailable when the pod stops", func(t *testing.T) {
		start := time.Now()
		h.must(t, "delete", "pod", "echo-api", "--wait=false")
		eventually(t, 30*time.Second, "APIService Available=False", func() (bool, string) {
			a := availability()
			return strings.HasPrefix(a, "False ") && len(a) > len("False "), a
		})
		t.Logf("Available=False %v after the delete: %s", time.Since(start).Round(100*time.Millisecond), availability())
		out, err := h.run("get", "echoes", "-n", "default")
		if err == nil || !strings.Contains(out, "unable to handle the request") && !strings.Contains(out, "service unavailable") {
			t.Errorf("kubectl get echoes with the server gone: %v\n%s", err, out)
		}
	})
}

// selfSignedServing returns a self-signed serving certificate for host and
// its key, PEM-encoded.
func selfSignedServing(t *testing.T, host string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: host},
		DNSNames: []string{host}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// indent indents a multi-line value for a YAML block scalar.
func indent(s string) string {
	return strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n          ")
}

const aggregatedObjects = `
apiVersion: v1
kind: ServiceAccount
metadata: {name: echo-api, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: echo-api-auth-reader, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: extension-apiserver-authentication-reader}
subjects: [{kind: ServiceAccount, name: echo-api, namespace: default}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: echo-reader}
rules: [{apiGroups: [echo.tether.test], resources: [echoes], verbs: [get, list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: alice-reads-echoes}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: echo-reader}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]
---
apiVersion: v1
kind: Pod
metadata: {name: echo-api, namespace: default, labels: {app: echo-api}}
spec:
  terminationGracePeriodSeconds: 1
  serviceAccountName: echo-api
  containers:
  - name: api
    image: %[1]s
    imagePullPolicy: Never
    command: [/testapp, aggregated, ":8443", echo.tether.test/v1alpha1]
    ports: [{containerPort: 8443}]
    env:
    - name: TLS_CERT
      value: |
          %[2]s
    - name: TLS_KEY
      value: |
          %[3]s
---
apiVersion: v1
kind: Service
metadata: {name: echo-api, namespace: default}
spec:
  selector: {app: echo-api}
  ports: [{name: https, port: 443, targetPort: 8443}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1alpha1.echo.tether.test}
spec:
  group: echo.tether.test
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 15
  caBundle: %[4]s
  service: {namespace: default, name: echo-api, port: 443}
`
