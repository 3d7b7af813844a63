package hub_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certutil "k8s.io/client-go/util/cert"

	"github.com/tether-edge/tether/hub/hubtest"
)

// webhookServer serves AdmissionReview v1 over TLS on loopback:
// /mutate labels pods webhook=added and warns, /validate refuses pods
// labelled deny=true, /slow answers after a long time.
func webhookServer(t *testing.T) (url string, caBundle []byte) {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	review := func(w http.ResponseWriter, r *http.Request, decide func(pod *corev1.Pod, resp *admissionv1.AdmissionResponse)) {
		var ar admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&ar); err != nil || ar.Request == nil {
			http.Error(w, "bad review", http.StatusBadRequest)
			return
		}
		resp := &admissionv1.AdmissionResponse{UID: ar.Request.UID, Allowed: true}
		var pod corev1.Pod
		if err := json.Unmarshal(ar.Request.Object.Raw, &pod); err == nil {
			decide(&pod, resp)
		}
		ar.Response, ar.Request = resp, nil
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&ar)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/mutate", func(w http.ResponseWriter, r *http.Request) {
		review(w, r, func(pod *corev1.Pod, resp *admissionv1.AdmissionResponse) {
			patch := `[{"op":"add","path":"/metadata/labels","value":{}},{"op":"add","path":"/metadata/labels/webhook","value":"added"}]`
			if pod.Labels != nil {
				patch = `[{"op":"add","path":"/metadata/labels/webhook","value":"added"}]`
			}
			pt := admissionv1.PatchTypeJSONPatch
			resp.Patch, resp.PatchType = []byte(patch), &pt
			resp.Warnings = []string{"labelled by the test webhook"}
		})
	})
	mux.HandleFunc("/validate", func(w http.ResponseWriter, r *http.Request) {
		review(w, r, func(pod *corev1.Pod, resp *admissionv1.AdmissionResponse) {
			if pod.Labels["deny"] == "true" {
				resp.Allowed = false
				resp.Result = &metav1.Status{Code: 403, Message: "pods labelled deny=true are refused"}
			}
		})
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
		}
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL, certPEM
}

// kubectlBoth runs kubectl and returns its standard output and error.
func kubectlBoth(h *hubtest.Hub, stdin string, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.Kubectl, append([]string{"--cache-dir", h.CacheDir}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+h.Kubeconfig)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

const webhookPodRule = `
    rules:
    - operations: ["CREATE"]
      apiGroups: [""]
      apiVersions: ["v1"]
      resources: ["pods"]
    namespaceSelector:
      matchLabels: {webhooks: "on"}
    sideEffects: None
    admissionReviewVersions: ["v1"]`

// TestAdmissionWebhooksKubectl: with real kubectl against a real hub, a
// mutating webhook labels new pods (its warning printed), a validating
// one refuses a pod with the message kubectl prints, a
// ValidatingAdmissionPolicy with a binding denies, and a webhook that does
// not answer is cut off at timeoutSeconds: failurePolicy Ignore admits,
// Fail refuses, and the hub serves other requests meanwhile.
func TestAdmissionWebhooksKubectl(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	url, ca := webhookServer(t)
	caB64 := base64.StdEncoding.EncodeToString(ca)
	h.MustRun("create", "namespace", "wh")
	h.MustRun("label", "namespace", "wh", "webhooks=on")
	h.MustRun("create", "serviceaccount", "default", "-n", "wh")

	manifest := fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: label-pods}
webhooks:
  - name: label.tether.test
    clientConfig: {url: "%[1]s/mutate", caBundle: %[2]s}%[3]s
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: refuse-pods}
webhooks:
  - name: refuse.tether.test
    clientConfig: {url: "%[1]s/validate", caBundle: %[2]s}%[3]s
`, url, caB64, webhookPodRule)
	if _, _, err := kubectlBoth(h, manifest, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	if out := h.MustRun("get", "mutatingwebhookconfigurations"); !strings.Contains(out, "WEBHOOKS") || !strings.Contains(out, "label-pods") {
		t.Errorf("table of mutating webhook configurations:\n%s", out)
	}

	t.Run("mutating webhook labels a pod", func(t *testing.T) {
		var stderr string
		deadline := time.Now().Add(10 * time.Second)
		for i := 0; ; i++ {
			name := fmt.Sprintf("p%d", i)
			_, e, err := kubectlBoth(h, "", "run", name, "-n", "wh", "--image=img", "--restart=Never")
			if err != nil {
				t.Fatalf("create pod: %v\n%s", err, e)
			}
			stderr = e
			if got := h.MustRun("get", "pod", name, "-n", "wh", "-o", "jsonpath={.metadata.labels.webhook}"); got == "added" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s not labelled by the webhook", name)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !strings.Contains(stderr, "Warning: labelled by the test webhook") {
			t.Errorf("kubectl did not print the webhook's warning: %q", stderr)
		}
	})

	t.Run("validating webhook refuses a pod", func(t *testing.T) {
		_, stderr, err := kubectlBoth(h, "", "run", "refused", "-n", "wh", "--image=img", "--restart=Never", "--labels=deny=true")
		want := `admission webhook "refuse.tether.test" denied the request: pods labelled deny=true are refused`
		if err == nil || !strings.Contains(stderr, want) {
			t.Fatalf("create refused pod: %v\nstderr: %s\nwant %s", err, stderr, want)
		}
		if _, err := h.Run("get", "pod", "refused", "-n", "wh"); err == nil {
			t.Fatal("refused pod was stored")
		}
	})

	t.Run("policy with binding denies", func(t *testing.T) {
		h.MustRun("create", "namespace", "vap")
		policy := `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: small-configmaps}
spec:
  matchConstraints:
    resourceRules:
    - operations: ["CREATE", "UPDATE"]
      apiGroups: [""]
      apiVersions: ["v1"]
      resources: ["configmaps"]
  validations:
  - expression: "!has(object.data) || object.data.size() <= 1"
    message: "a configmap may hold one key at most"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: small-configmaps}
spec:
  policyName: small-configmaps
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {kubernetes.io/metadata.name: vap}
`
		if _, _, err := kubectlBoth(h, policy, "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		want := "ValidatingAdmissionPolicy 'small-configmaps' with binding 'small-configmaps' denied request: a configmap may hold one key at most"
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, stderr, err := kubectlBoth(h, "", "create", "configmap", "big", "-n", "vap", "--from-literal=a=1", "--from-literal=b=2")
			if err != nil && strings.Contains(stderr, want) {
				break
			}
			if err == nil {
				h.MustRun("delete", "configmap", "big", "-n", "vap")
			}
			if time.Now().After(deadline) {
				t.Fatalf("policy did not deny: %v\n%s", err, stderr)
			}
			time.Sleep(200 * time.Millisecond)
		}
		h.MustRun("create", "configmap", "small", "-n", "vap", "--from-literal=a=1")
	})

	t.Run("unanswered webhook times out", func(t *testing.T) {
		h.MustRun("create", "namespace", "slow")
		h.MustRun("label", "namespace", "slow", "slow=on")
		slow := func(policy string) string {
			return fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: slow}
webhooks:
  - name: slow.tether.test
    clientConfig: {url: "%s/slow", caBundle: %s}
    timeoutSeconds: 1
    failurePolicy: %s
    rules:
    - operations: ["CREATE"]
      apiGroups: [""]
      apiVersions: ["v1"]
      resources: ["configmaps"]
    namespaceSelector:
      matchLabels: {slow: "on"}
    sideEffects: None
    admissionReviewVersions: ["v1"]
`, url, caB64, policy)
		}
		if _, _, err := kubectlBoth(h, slow("Fail"), "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		// Wait until the webhook applies: a create then takes its timeout.
		want := `failed calling webhook "slow.tether.test"`
		deadline := time.Now().Add(10 * time.Second)
		for i := 0; ; i++ {
			// Meanwhile the hub answers other requests at once.
			done := make(chan time.Duration, 1)
			go func() {
				start := time.Now()
				h.MustRun("get", "namespaces")
				done <- time.Since(start)
			}()
			start := time.Now()
			_, stderr, err := kubectlBoth(h, "", "create", "configmap", fmt.Sprintf("f%d", i), "-n", "slow")
			took := time.Since(start)
			if d := <-done; d > 5*time.Second {
				t.Errorf("kubectl get namespaces took %v while a webhook hung", d)
			}
			if err != nil {
				if !strings.Contains(stderr, want) || !strings.Contains(stderr, "context deadline exceeded") {
					t.Fatalf("failurePolicy Fail: %s, want %s ... context deadline exceeded", stderr, want)
				}
				if took > 8*time.Second {
					t.Errorf("refusal took %v, timeoutSeconds is 1", took)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("failurePolicy Fail never refused")
			}
			time.Sleep(200 * time.Millisecond)
		}
		if _, _, err := kubectlBoth(h, slow("Ignore"), "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		deadline = time.Now().Add(10 * time.Second)
		for i := 0; ; i++ {
			start := time.Now()
			_, stderr, err := kubectlBoth(h, "", "create", "configmap", fmt.Sprintf("i%d", i), "-n", "slow")
			took := time.Since(start)
			if err == nil && took >= time.Second {
				// Admitted after the webhook's timeout: Ignore ignored it.
				if took > 8*time.Second {
					t.Errorf("admission took %v, timeoutSeconds is 1", took)
				}
				break
			}
			if err != nil && !strings.Contains(stderr, want) {
				t.Fatalf("failurePolicy Ignore: %v\n%s", err, stderr)
			}
			if time.Now().After(deadline) {
				t.Fatalf("failurePolicy Ignore never admitted after the timeout: %v %s", err, stderr)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
}
