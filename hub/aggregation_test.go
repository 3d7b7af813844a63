package hub_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestLocalAPIServices shows the APIServices of the hub's own
// group/versions: `kubectl get apiservices` lists them as Local and
// Available, and the front-proxy configuration extension API servers
// read is published in kube-system.
var storageLocal = regexp.MustCompile(`(?m)^v1\.storage\.k8s\.io +Local +True`)

func TestLocalAPIServices(t *testing.T) {
	start := time.Now()
	h := hubtest.Start(t)
	t.Logf("hub up in %v", time.Since(start))
	var out string
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, _ = h.Run("get", "apiservices")
		if storageLocal.MatchString(out) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("listed in %v", time.Since(start))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 10 || strings.Join(strings.Fields(lines[0]), " ") != "NAME SERVICE AVAILABLE AGE" {
		t.Fatalf("kubectl get apiservices:\n%s", out)
	}
	for _, want := range []string{"v1.", "v1.apps", "v1.batch", "v1.rbac.authorization.k8s.io", "v1.apiregistration.k8s.io", "v1.authorization.k8s.io"} {
		found := false
		for _, l := range lines[1:] {
			f := strings.Fields(l)
			if len(f) >= 3 && f[0] == want {
				found = true
				if f[1] != "Local" || f[2] != "True" {
					t.Errorf("%s: %s", want, l)
				}
			}
		}
		if !found {
			t.Errorf("no APIService %s in\n%s", want, out)
		}
	}
	cm := h.MustRun("get", "configmap", "-n", "kube-system", "extension-apiserver-authentication", "-o", "jsonpath={.data}")
	for _, key := range []string{"requestheader-client-ca-file", "client-ca-file", `"requestheader-allowed-names":"[\"front-proxy-client\"]"`,
		`"requestheader-username-headers":"[\"X-Remote-User\"]"`, `"requestheader-group-headers":"[\"X-Remote-Group\"]"`,
		`"requestheader-extra-headers-prefix":"[\"X-Remote-Extra-\"]"`} {
		if !strings.Contains(cm, key) {
			t.Errorf("extension-apiserver-authentication lacks %s: %s", key, cm)
		}
	}
	// Bad input: a name that is not <version>.<group> is refused with the
	// field path, and nothing is stored.
	out, err := h.RunInput(t.Context(), `apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: wrong
spec:
  group: echo.example.com
  version: v1
  groupPriorityMinimum: 30000
  versionPriority: 10
  insecureSkipTLSVerify: true
  service: {namespace: default, name: echo}
`, nil, "create", "-f", "-")
	if err != nil {
		out += err.Error()
	}
	if err == nil || !strings.Contains(out, "metadata.name") || !strings.Contains(out, "spec.groupPriorityMinimum") || !strings.Contains(out, "is invalid") {
		t.Fatalf("invalid APIService: err=%v\n%s", err, out)
	}
	if out, err := h.Run("get", "apiservice", "wrong"); err == nil {
		t.Fatalf("invalid APIService stored:\n%s", out)
	}
}
