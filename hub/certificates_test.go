package hub_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tether-edge/tether/hub/hubtest"
)

// newCSR returns a fresh key and a PEM certificate request for cn and orgs.
func newCSR(t *testing.T, cn string, orgs ...string) (keyPEM, csrPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: orgs}}, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// csrManifest is a CertificateSigningRequest as a user writes it.
func csrManifest(name string, req []byte, signer string, usages []string, expiration int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  name: %s\nspec:\n", name)
	fmt.Fprintf(&b, "  request: %s\n  signerName: %s\n", base64.StdEncoding.EncodeToString(req), signer)
	if expiration > 0 {
		fmt.Fprintf(&b, "  expirationSeconds: %d\n", expiration)
	}
	b.WriteString("  usages:\n")
	for _, u := range usages {
		fmt.Fprintf(&b, "  - %s\n", u)
	}
	return b.String()
}

func kubectlIn(t *testing.T, h *hubtest.Hub, stdin string, env []string, args ...string) (string, error) {
	t.Helper()
	return h.RunInput(context.Background(), stdin, env, args...)
}

// waitCSR polls the request until cond holds.
func waitCSR(t *testing.T, cs kubernetes.Interface, name, what string, cond func(*certificatesv1.CertificateSigningRequest) bool) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	var cur *certificatesv1.CertificateSigningRequest
	waitFor(t, what, func() bool {
		c, err := cs.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		cur = c
		return cond(c)
	})
	return cur
}

// userKubeconfig writes a kubeconfig that reaches h as the holder of
// certPEM and keyPEM.
func userKubeconfig(t *testing.T, h *hubtest.Hub, certPEM, keyPEM []byte) string {
	t.Helper()
	admin, err := clientcmd.LoadFromFile(h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	for name, c := range admin.Clusters {
		cfg.Clusters[name] = c
		cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
		cfg.Contexts["u"] = &clientcmdapi.Context{Cluster: name, AuthInfo: "u"}
		cfg.CurrentContext = "u"
	}
	path := filepath.Join(t.TempDir(), "user.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// whoAmI creates a request with the given kubeconfig and returns who the
// hub recorded as asking (spec.username and spec.groups).
func whoAmI(t *testing.T, h *hubtest.Hub, kubeconfig, name string) (string, []string) {
	t.Helper()
	// Under RBAC only those allowed may request certificates: let every
	// authenticated user ask, as a cluster that hands out certificates
	// this way would.
	if _, err := h.Run("get", "clusterrolebinding", "csr-requesters"); err != nil {
		mustKubectl(t, h, "create", "clusterrole", "csr-requester", "--verb=create", "--resource=certificatesigningrequests.certificates.k8s.io")
		mustKubectl(t, h, "create", "clusterrolebinding", "csr-requesters", "--clusterrole=csr-requester", "--group=system:authenticated")
	}
	_, req := newCSR(t, "probe")
	var (
		out string
		err error
	)
	// The binding takes effect once the authorizer has seen it.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, err = kubectlIn(t, h, csrManifest(name, req, "example.com/probe", []string{"client auth"}, 0),
			[]string{"KUBECONFIG=" + kubeconfig}, "create", "-f", "-", "-o", "jsonpath={.spec.username}|{.spec.groups}")
		if err == nil || !strings.Contains(err.Error(), "Forbidden") || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	user, groups, _ := strings.Cut(out, "|")
	var gs []string
	for _, g := range strings.Split(strings.Trim(groups, "[]"), ",") {
		gs = append(gs, strings.Trim(g, `"`))
	}
	return user, gs
}

func parseCert(t *testing.T, data []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("no PEM certificate in %q", data)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCertificateSigningRequests: a user's certificate obtained the
// documented way (kubectl create of a CSR, kubectl certificate approve)
// authenticates as that user with its groups and honours
// expirationSeconds; denied, wrongly used and system:masters requests get
// no certificate; bad requests are 422 with field causes and not stored;
// /status and /approval change only what they own.
func TestCertificateSigningRequests(t *testing.T) {
	h := hubtest.Start(t, "--disable-scheduler")
	cs := clientFor(t, h)
	ctx := context.Background()
	csrs := cs.CertificatesV1().CertificateSigningRequests()
	clientUsages := []string{"digital signature", "client auth"}

	t.Run("approve", func(t *testing.T) {
		keyPEM, req := newCSR(t, "alice", "dev", "ops")
		mustKubectlIn(t, h, csrManifest("alice", req, "kubernetes.io/kube-apiserver-client", clientUsages, 3600), "create", "-f", "-")
		out := mustKubectl(t, h, "get", "csr", "alice")
		for _, want := range []string{"NAME", "AGE", "SIGNERNAME", "REQUESTOR", "REQUESTEDDURATION", "CONDITION",
			"kubernetes.io/kube-apiserver-client", "tether-admin", "60m", "Pending"} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl get csr lacks %q:\n%s", want, out)
			}
		}
		if got := mustKubectl(t, h, "certificate", "approve", "alice"); !strings.Contains(got, "certificatesigningrequest.certificates.k8s.io/alice approved") {
			t.Errorf("kubectl certificate approve said %q", got)
		}
		start := time.Now()
		issued := waitCSR(t, cs, "alice", "alice's certificate", func(c *certificatesv1.CertificateSigningRequest) bool { return len(c.Status.Certificate) > 0 })
		t.Logf("certificate issued %v after approval", time.Since(start))
		if issued.Spec.Username != "tether-admin" || !slices.Contains(issued.Spec.Groups, "system:masters") {
			t.Errorf("requestor = %q %v, want the admin", issued.Spec.Username, issued.Spec.Groups)
		}
		if out := mustKubectl(t, h, "get", "csr", "alice"); !strings.Contains(out, "Approved,Issued") {
			t.Errorf("kubectl get csr after approval:\n%s", out)
		}
		cert := parseCert(t, issued.Status.Certificate)
		if cert.Subject.CommonName != "alice" || !slices.Equal(cert.Subject.Organization, []string{"dev", "ops"}) ||
			!slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
			t.Errorf("certificate subject %v, usages %v", cert.Subject, cert.ExtKeyUsage)
		}
		// A short certificate gets its whole hour from now, after a
		// backdated start.
		if life := time.Until(cert.NotAfter); life < 58*time.Minute || life > 61*time.Minute {
			t.Errorf("certificate valid for %v more, want an hour", life)
		}
		if d := time.Since(cert.NotBefore); d < 4*time.Minute || d > 7*time.Minute {
			t.Errorf("certificate started %v ago, want 5m", d)
		}
		user, groups := whoAmI(t, h, userKubeconfig(t, h, issued.Status.Certificate, keyPEM), "alice-probe")
		if user != "alice" || !slices.Contains(groups, "dev") || !slices.Contains(groups, "ops") || !slices.Contains(groups, "system:authenticated") {
			t.Errorf("the certificate authenticates as %q %v", user, groups)
		}
		// Approving again changes nothing.
		mustKubectl(t, h, "certificate", "approve", "alice")
	})

	t.Run("deny", func(t *testing.T) {
		_, req := newCSR(t, "bob")
		mustKubectlIn(t, h, csrManifest("bob", req, "kubernetes.io/kube-apiserver-client", clientUsages, 0), "create", "-f", "-")
		if got := mustKubectl(t, h, "certificate", "deny", "bob"); !strings.Contains(got, "denied") {
			t.Errorf("kubectl certificate deny said %q", got)
		}
		if out := mustKubectl(t, h, "get", "csr", "bob"); !strings.Contains(out, "Denied") || !strings.Contains(out, "<none>") {
			t.Errorf("kubectl get csr after deny:\n%s", out)
		}
		time.Sleep(500 * time.Millisecond)
		cur, err := csrs.Get(ctx, "bob", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(cur.Status.Certificate) > 0 {
			t.Error("a denied request got a certificate")
		}
		// Approved and Denied together, or a removed condition, are
		// invalid.
		both := cur.DeepCopy()
		both.Status.Conditions = append(both.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test"})
		_, err = csrs.UpdateApproval(ctx, "bob", both, metav1.UpdateOptions{})
		wantInvalid(t, err, "status.conditions[1].type", "Approved and Denied conditions are mutually exclusive")
		none := cur.DeepCopy()
		none.Status.Conditions = nil
		_, err = csrs.UpdateApproval(ctx, "bob", none, metav1.UpdateOptions{})
		wantInvalid(t, err, "status.conditions", `updates may not remove a condition of type "Denied"`)
	})

	t.Run("usages", func(t *testing.T) {
		_, req := newCSR(t, "carol")
		mustKubectlIn(t, h, csrManifest("server", req, "kubernetes.io/kube-apiserver-client", []string{"server auth"}, 0), "create", "-f", "-")
		mustKubectl(t, h, "certificate", "approve", "server")
		c := waitCSR(t, cs, "server", "the Failed condition", func(c *certificatesv1.CertificateSigningRequest) bool {
			return slices.ContainsFunc(c.Status.Conditions, func(x certificatesv1.CertificateSigningRequestCondition) bool {
				return x.Type == certificatesv1.CertificateFailed
			})
		})
		f := c.Status.Conditions[len(c.Status.Conditions)-1]
		if f.Reason != "SignerValidationFailure" || f.Message != "invalid usage for client certificate: server auth" || len(c.Status.Certificate) > 0 {
			t.Errorf("failed condition %+v, certificate %d bytes", f, len(c.Status.Certificate))
		}
		if out := mustKubectl(t, h, "get", "csr", "server"); !strings.Contains(out, "Approved,Failed") {
			t.Errorf("kubectl get csr of a failed request:\n%s", out)
		}
		// Another signer's requests are not the hub's to sign.
		mustKubectlIn(t, h, csrManifest("other", req, "example.com/other", clientUsages, 0), "create", "-f", "-")
		mustKubectl(t, h, "certificate", "approve", "other")
		time.Sleep(500 * time.Millisecond)
		if out := mustKubectl(t, h, "get", "csr", "other"); !strings.Contains(out, "Approved") || strings.Contains(out, "Issued") {
			t.Errorf("a request to another signer:\n%s", out)
		}
		out := mustKubectl(t, h, "get", "csr", "--field-selector", "spec.signerName=example.com/other", "-o", "name")
		if strings.TrimSpace(out) != "certificatesigningrequest.certificates.k8s.io/other" {
			t.Errorf("field selector on spec.signerName gave %q", out)
		}
	})

	t.Run("masters", func(t *testing.T) {
		_, req := newCSR(t, "mallory", "system:masters")
		_, err := kubectlIn(t, h, csrManifest("mallory", req, "kubernetes.io/kube-apiserver-client", clientUsages, 0), nil, "create", "-f", "-")
		want := `certificatesigningrequests.certificates.k8s.io "mallory" is forbidden: use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a system:masters request: %v", err)
		}
		if _, err := csrs.Get(ctx, "mallory", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the refused request is stored: %v", err)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		exp := int32(60)
		bad := &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: "bad"},
			Spec: certificatesv1.CertificateSigningRequestSpec{
				Request:           []byte("not a request"),
				SignerName:        "nodomain",
				Usages:            []certificatesv1.KeyUsage{"client auth", "flying"},
				ExpirationSeconds: &exp,
			},
		}
		_, err := csrs.Create(ctx, bad, metav1.CreateOptions{})
		wantInvalid(t, err, "spec.request", "PEM block type must be CERTIFICATE REQUEST")
		wantInvalid(t, err, "spec.usages[1]", `Unsupported value: "flying"`)
		wantInvalid(t, err, "spec.signerName", "must be a fully qualified domain and path of the form 'example.com/signer-name'")
		wantInvalid(t, err, "spec.expirationSeconds", "may not specify a duration less than 600 seconds (10 minutes)")
		_, req := newCSR(t, "x")
		_, err = kubectlIn(t, h, csrManifest("bad", req, "", nil, 0), nil, "create", "-f", "-")
		if err == nil || !strings.Contains(err.Error(), `The CertificateSigningRequest "bad" is invalid`) ||
			!strings.Contains(err.Error(), "spec.usages: Required value") || !strings.Contains(err.Error(), "spec.signerName: Required value") {
			t.Errorf("kubectl create of a request without usages or signer: %v", err)
		}
		if _, err := csrs.Get(ctx, "bad", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the invalid request is stored: %v", err)
		}
	})

	t.Run("subresources", func(t *testing.T) {
		_, req := newCSR(t, "dave")
		c, err := csrs.Create(ctx, &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: "dave"},
			Spec: certificatesv1.CertificateSigningRequestSpec{Request: req, SignerName: "example.com/dave",
				Usages: []certificatesv1.KeyUsage{"client auth"}, Username: "someone-else", Groups: []string{"system:masters"}},
			Status: certificatesv1.CertificateSigningRequestStatus{Conditions: []certificatesv1.CertificateSigningRequestCondition{
				{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Spec.Username != "tether-admin" || len(c.Status.Conditions) != 0 {
			t.Errorf("create kept the requestor %q or the conditions %v it was given", c.Spec.Username, c.Status.Conditions)
		}
		// The main resource changes metadata only.
		c.Spec.SignerName = "example.com/changed"
		c.Labels = map[string]string{"team": "a"}
		up, err := csrs.Update(ctx, c, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if up.Spec.SignerName != "example.com/dave" || up.Labels["team"] != "a" {
			t.Errorf("update: signer %q, labels %v", up.Spec.SignerName, up.Labels)
		}
		// /status may not approve.
		st := up.DeepCopy()
		st.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}
		_, err = csrs.UpdateStatus(ctx, st, metav1.UpdateOptions{})
		wantInvalid(t, err, "status.conditions", `updates may not add a condition of type "Approved"`)
		// /approval may not issue; it stamps the condition's times.
		ap := up.DeepCopy()
		ap.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test"}}
		ap.Status.Certificate = []byte("junk")
		got, err := csrs.UpdateApproval(ctx, "dave", ap, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Certificate) > 0 || len(got.Status.Conditions) != 1 || got.Status.Conditions[0].LastUpdateTime.IsZero() ||
			got.Status.Conditions[0].LastTransitionTime.IsZero() {
			t.Errorf("approval wrote status %+v", got.Status)
		}
		// A certificate that is not one is refused on /status.
		st = got.DeepCopy()
		st.Status.Certificate = []byte("junk")
		_, err = csrs.UpdateStatus(ctx, st, metav1.UpdateOptions{})
		wantInvalid(t, err, "status.certificate", "must contain at least one CERTIFICATE PEM block")
	})
}

// wantInvalid checks that err is a 422 with a cause for field whose
// message contains msg.
func wantInvalid(t *testing.T, err error, field, msg string) {
	t.Helper()
	if !apierrors.IsInvalid(err) {
		t.Errorf("want 422 Invalid for %s, got %v", field, err)
		return
	}
	var se *apierrors.StatusError
	if !errorsAs(err, &se) || se.ErrStatus.Details == nil {
		t.Errorf("no details in %v", err)
		return
	}
	for _, c := range se.ErrStatus.Details.Causes {
		if c.Field == field && strings.Contains(c.Message, msg) {
			return
		}
	}
	t.Errorf("no cause %s: %q in %+v", field, msg, se.ErrStatus.Details.Causes)
}

func errorsAs(err error, se **apierrors.StatusError) bool {
	s, ok := err.(*apierrors.StatusError)
	*se = s
	return ok
}

func mustKubectlIn(t *testing.T, h *hubtest.Hub, stdin string, args ...string) string {
	t.Helper()
	out, err := h.RunInput(context.Background(), stdin, nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
