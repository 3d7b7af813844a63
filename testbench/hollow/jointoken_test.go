package hollow_test

import (
	"os/exec"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

// joinToken creates a join token on h with `tether token create` and
// returns it with the client configuration of h's admin kubeconfig.
func joinToken(t *testing.T, h *hubtest.Hub) (string, *rest.Config) {
	t.Helper()
	out, err := exec.Command(h.Bin, "token", "create", "--kubeconfig", h.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("tether token create: %v\n%s", err, h.Logs())
	}
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out)), rc
}
