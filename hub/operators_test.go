package hub_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// operatorControllers are the hub's controllers an operator test needs:
// garbage collection of owned objects and namespace deletion.
var operatorControllers = []string{"--controllers=garbagecollector,namespace", "--disable-scheduler"}

// procOutput collects a process's output while the test reads it.
type procOutput struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *procOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *procOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// startProcess runs bin with args until the test ends (or kill) and
// returns the process and its combined output, which is logged when the
// test fails.
func startProcess(t *testing.T, name, bin string, args ...string) (*exec.Cmd, *procOutput) {
	t.Helper()
	out := &procOutput{}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, tail(out.String(), 8000))
		}
	})
	return cmd, out
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// waitJSONPath waits until kubectl get args -o jsonpath=path prints want.
func waitJSONPath(t *testing.T, h *hubtest.Hub, want, path string, args ...string) {
	t.Helper()
	var got string
	var err error
	deadline := time.Now().Add(45 * time.Second)
	for time.Now().Before(deadline) {
		got, err = h.Run(append(append([]string{"get"}, args...), "-o", "jsonpath="+path)...)
		if err == nil && got == want {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("kubectl get %s -o jsonpath=%s: got %q (%v), want %q", strings.Join(args, " "), path, got, err, want)
}

// certManagerObjects are a self-signed Issuer, a CA Certificate it
// signs, a CA Issuer made from that Certificate's Secret and a serving
// Certificate the CA Issuer signs.
const certManagerObjects = `apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: selfsigned
  namespace: certs
spec:
  selfSigned: {}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: edge-ca
  namespace: certs
spec:
  isCA: true
  commonName: edge-ca
  secretName: edge-ca
  privateKey:
    algorithm: ECDSA
    size: 256
  issuerRef:
    name: selfsigned
    kind: Issuer
    group: cert-manager.io
---
apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: edge-ca
  namespace: certs
spec:
  ca:
    secretName: edge-ca
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: web
  namespace: certs
spec:
  secretName: web-tls
  dnsNames: [web.certs.svc, web.example.com]
  duration: 2160h
  privateKey:
    algorithm: ECDSA
    size: 256
  issuerRef:
    name: edge-ca
    kind: Issuer
`

// TestCertManagerIssuesCertificates runs cert-manager's controller, built
// from its published module at the version pinned in tools/certmanager,
// against a hub with that version's CRDs installed by kubectl: with
// leader election by Lease, it issues a self-signed CA Certificate and a
// serving Certificate signed by that CA into Secrets, and marks both
// Ready.
func TestCertManagerIssuesCertificates(t *testing.T) {
	h := hubtest.Start(t, operatorControllers...)
	bin, crds := hubtest.CertManager(t)
	h.MustRun("apply", "-f", crds)
	h.MustRun("wait", "--for=condition=Established", "--timeout=30s",
		"crd/certificates.cert-manager.io", "crd/certificaterequests.cert-manager.io",
		"crd/issuers.cert-manager.io", "crd/clusterissuers.cert-manager.io",
		"crd/orders.acme.cert-manager.io", "crd/challenges.acme.cert-manager.io")

	startProcess(t, "cert-manager", bin, "--kubeconfig", h.Kubeconfig, "--leader-elect",
		"--leader-election-namespace=kube-system", "--leader-election-lease-duration=15s",
		"--leader-election-renew-deadline=10s", "--leader-election-retry-period=2s", "-v=2")
	h.MustRun("create", "namespace", "certs")
	mustKubectlIn(t, h, certManagerObjects, "apply", "-f", "-")

	h.MustRun("wait", "--for=condition=Ready", "--timeout=60s", "-n", "certs", "certificate/edge-ca", "certificate/web")
	holder := h.MustRun("get", "lease", "-n", "kube-system", "cert-manager-controller", "-o", "jsonpath={.spec.holderIdentity}")
	if holder == "" {
		t.Error("the cert-manager-controller Lease has no holder")
	}
	if got := h.MustRun("get", "-n", "certs", "issuer", "edge-ca", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`); got != "True" {
		t.Errorf("CA issuer Ready = %q, want True", got)
	}

	ca := secretCert(t, h, "edge-ca")
	if !ca.IsCA || ca.Subject.CommonName != "edge-ca" {
		t.Errorf("edge-ca: IsCA %v, CN %q", ca.IsCA, ca.Subject.CommonName)
	}
	if err := ca.CheckSignatureFrom(ca); err != nil {
		t.Errorf("edge-ca is not self-signed: %v", err)
	}
	web := secretCert(t, h, "web-tls")
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := web.Verify(x509.VerifyOptions{Roots: pool, DNSName: "web.example.com"}); err != nil {
		t.Errorf("web certificate does not verify against edge-ca for web.example.com: %v", err)
	}
	if d := web.NotAfter.Sub(web.NotBefore); d < 2159*time.Hour || d > 2161*time.Hour {
		t.Errorf("web certificate lasts %v, want 2160h", d)
	}
	if got := h.MustRun("get", "-n", "certs", "certificaterequests", "-o", `jsonpath={range .items[*]}{.status.conditions[?(@.type=="Approved")].status}{" "}{end}`); got != "True True " {
		t.Errorf("certificate requests approved: %q, want two True", got)
	}
}

// secretCert reads certs/name's certificate and checks that its private
// key matches.
func secretCert(t *testing.T, h *hubtest.Hub, name string) *x509.Certificate {
	t.Helper()
	crtB64 := h.MustRun("get", "secret", "-n", "certs", name, "-o", `jsonpath={.data.tls\.crt}`)
	keyB64 := h.MustRun("get", "secret", "-n", "certs", name, "-o", `jsonpath={.data.tls\.key}`)
	crt, err := base64.StdEncoding.DecodeString(crtB64)
	if err != nil {
		t.Fatalf("secret %s: tls.crt: %v", name, err)
	}
	key, err := base64.StdEncoding.DecodeString(keyB64)
	if err != nil {
		t.Fatalf("secret %s: tls.key: %v", name, err)
	}
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		t.Fatalf("secret %s: certificate and key do not match: %v", name, err)
	}
	block, _ := pem.Decode(crt)
	if block == nil {
		t.Fatalf("secret %s: tls.crt is not PEM", name)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("secret %s: %v", name, err)
	}
	return c
}

// TestSampleOperator runs two replicas of the controller-runtime operator
// of tools/sampleoperator against a hub: one leads by Lease and reconciles
// a Shelf into an owned ConfigMap, a finalizer and status with
// observedGeneration and a Ready condition; killed, it hands over to the
// other replica; deleting the Shelf lets the operator release its
// finalizer, and the garbage collector removes the ConfigMap.
func TestSampleOperator(t *testing.T) {
	h := hubtest.Start(t, operatorControllers...)
	bin, crd := hubtest.SampleOperator(t)
	h.MustRun("apply", "-f", crd)
	h.MustRun("wait", "--for=condition=Established", "--timeout=30s", "crd/shelves.sample.tether.dev")
	h.MustRun("create", "namespace", "library")

	replicas := map[string]*exec.Cmd{}
	outputs := map[string]*procOutput{}
	for _, name := range []string{"a", "b"} {
		replicas[name], outputs[name] = startProcess(t, "sampleoperator "+name, bin, "--kubeconfig", h.Kubeconfig,
			"--replica", name, "--leader-election-namespace", "library",
			"--lease-duration=4s", "--renew-deadline=3s", "--retry-period=500ms")
	}
	leader := func(except string) string {
		t.Helper()
		var who string
		waitFor(t, "a replica to lead", func() bool {
			for name, out := range outputs {
				if name != except && strings.Contains(out.String(), "leading "+name) {
					who = name
					return true
				}
			}
			return false
		})
		return who
	}
	first := leader("")

	mustKubectlIn(t, h, "apiVersion: sample.tether.dev/v1\nkind: Shelf\nmetadata:\n  name: oak\n  namespace: library\nspec:\n  books: 3\n  color: brown\n", "apply", "-f", "-")
	uid := h.MustRun("get", "shelf", "-n", "library", "oak", "-o", "jsonpath={.metadata.uid}")
	waitJSONPath(t, h, "3", "{.data.books}", "configmap", "-n", "library", "oak-books")
	waitJSONPath(t, h, "1/True", `{.status.observedGeneration}/{.status.conditions[?(@.type=="Ready")].status}`, "shelf", "-n", "library", "oak")
	if got := h.MustRun("get", "configmap", "-n", "library", "oak-books", "-o",
		"jsonpath={.metadata.ownerReferences[0].apiVersion}/{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}/{.metadata.ownerReferences[0].uid}/{.metadata.ownerReferences[0].controller}"); got != "sample.tether.dev/v1/Shelf/oak/"+uid+"/true" {
		t.Errorf("configmap owner: %q", got)
	}
	if got := h.MustRun("get", "shelf", "-n", "library", "oak", "-o", "jsonpath={.metadata.finalizers}"); got != `["sample.tether.dev/cleanup"]` {
		t.Errorf("shelf finalizers: %s", got)
	}
	if got := h.MustRun("get", "lease", "-n", "library", "sampleoperator.sample.tether.dev", "-o", "jsonpath={.spec.holderIdentity}"); got == "" {
		t.Error("the operator's Lease has no holder")
	}

	// A spec change bumps the generation; the status the operator writes
	// for it does not.
	h.MustRun("patch", "shelf", "-n", "library", "oak", "--type=merge", "-p", `{"spec":{"books":5}}`)
	waitJSONPath(t, h, "2/2/True", `{.metadata.generation}/{.status.observedGeneration}/{.status.conditions[?(@.type=="Ready")].status}`, "shelf", "-n", "library", "oak")
	waitJSONPath(t, h, "5", "{.data.books}", "configmap", "-n", "library", "oak-books")

	// The leader dies without releasing its Lease; the other replica
	// takes over once the Lease expires.
	holder := h.MustRun("get", "lease", "-n", "library", "sampleoperator.sample.tether.dev", "-o", "jsonpath={.spec.holderIdentity}")
	replicas[first].Process.Kill()
	second := leader(first)
	if got := h.MustRun("get", "lease", "-n", "library", "sampleoperator.sample.tether.dev", "-o", "jsonpath={.spec.holderIdentity}"); got == holder {
		t.Errorf("lease still held by %q after its holder was killed", got)
	}
	h.MustRun("patch", "shelf", "-n", "library", "oak", "--type=merge", "-p", `{"spec":{"books":7}}`)
	waitJSONPath(t, h, "7", "{.data.books}", "configmap", "-n", "library", "oak-books")
	waitJSONPath(t, h, "3", "{.status.observedGeneration}", "shelf", "-n", "library", "oak")
	t.Logf("replica %s led, then %s", first, second)

	// Deleting the Shelf: the operator releases its finalizer, the Shelf
	// goes, and the garbage collector deletes the ConfigMap it owned.
	h.MustRun("delete", "shelf", "-n", "library", "oak", "--timeout=30s")
	waitFor(t, "the owned configmap to be garbage collected", func() bool {
		out, err := h.Run("get", "configmap", "-n", "library", "oak-books", "--ignore-not-found", "-o", "name")
		return err == nil && out == ""
	})
	if !strings.Contains(outputs[second].String(), "releasing deleted shelf") {
		t.Errorf("replica %s did not log releasing the deleted shelf", second)
	}
}
