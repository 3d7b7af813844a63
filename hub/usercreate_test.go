package hub_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestTetherUserCreate: `tether user create` writes a kubeconfig whose
// certificate authenticates as the user with its groups, for the
// requested lifetime.
func TestTetherUserCreate(t *testing.T) {
	h := hubtest.Start(t, "--disable-scheduler")
	out := filepath.Join(t.TempDir(), "erin.kubeconfig")
	cmd := exec.Command(h.Bin, "user", "create", "erin", "--group", "dev", "--group", "qa",
		"--expiration", "2h", "--kubeconfig", h.Kubeconfig, "--kubeconfig-out", out)
	msg, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tether user create: %v\n%s", err, msg)
	}
	if !strings.Contains(string(msg), `user "erin" (groups dev,qa) written to `+out) {
		t.Errorf("tether user create said %q", msg)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig %v, %v", fi, err)
	}
	user, groups := whoAmI(t, h, out, "erin-probe")
	if user != "erin" || !slices.Contains(groups, "dev") || !slices.Contains(groups, "qa") {
		t.Errorf("the kubeconfig authenticates as %q %v", user, groups)
	}
	// The kubeconfig reaches the hub as erin, who may do nothing RBAC
	// has not granted, then what a binding grants.
	if _, err := kubectlIn(t, h, "", []string{"KUBECONFIG=" + out}, "get", "namespaces"); err == nil ||
		!strings.Contains(err.Error(), `User "erin" cannot list resource "namespaces" in API group "" at the cluster scope`) {
		t.Errorf("kubectl with the user's kubeconfig before a binding: %v", err)
	}
	mustKubectl(t, h, "create", "clusterrolebinding", "erin-view", "--clusterrole=view", "--user=erin")
	waitFor(t, "erin to list namespaces", func() bool {
		_, err := kubectlIn(t, h, "", []string{"KUBECONFIG=" + out}, "get", "namespaces")
		return err == nil
	})
	cfg, err := clientcmd.LoadFromFile(out)
	if err != nil {
		t.Fatal(err)
	}
	cert := parseCert(t, cfg.AuthInfos["erin"].ClientCertificateData)
	if life := time.Until(cert.NotAfter); life < 119*time.Minute || life > 121*time.Minute {
		t.Errorf("certificate valid for %v more, want 2h", life)
	}
	// The hub refuses to sign for system:masters.
	msg, err = exec.Command(h.Bin, "user", "create", "root", "--group", "system:masters", "--kubeconfig", h.Kubeconfig).CombinedOutput()
	if err == nil || !strings.Contains(string(msg), "system:masters group is not allowed") {
		t.Errorf("tether user create for system:masters: %v\n%s", err, msg)
	}
}
