package openapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/tether-edge/tether/hub/discovery"
)

// TestKubectl runs a real kubectl against discovery and OpenAPI: explain,
// and client-side dry runs that go through kubectl's validation set-up.
func TestKubectl(t *testing.T) {
	// The pinned kubectl that scripts/test.sh builds, else one on PATH.
	kubectl := os.Getenv("TETHER_KUBECTL")
	if kubectl == "" {
		var err error
		if kubectl, err = exec.LookPath("kubectl"); err != nil {
			t.Skip("no kubectl: set TETHER_KUBECTL (scripts/test.sh builds the pinned one into bin/) or put one on PATH")
		}
	}
	oa, err := New(testKinds(), clientgoscheme.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/openapi/", oa)
	disc := discovery.New(testKinds(), discovery.Config{})
	mux.Handle("/api", disc)
	mux.Handle("/api/", disc)
	mux.Handle("/apis", disc)
	mux.Handle("/apis/", disc)
	// A create answers with the object sent and records the query, so the
	// test can see whether kubectl asked for server-side field validation.
	queries := make(chan string, 1)
	mux.HandleFunc("POST /api/v1/namespaces/{ns}/pods", func(w http.ResponseWriter, r *http.Request) {
		select {
		case queries <- r.URL.RawQuery:
		default:
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	dir := t.TempDir()
	manifest := filepath.Join(dir, "pod.yaml")
	os.WriteFile(manifest, []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: a\n    image: x\n"), 0o600)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(kubectl, append([]string{"--server=" + srv.URL, "--cache-dir=" + filepath.Join(dir, "cache")}, args...)...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(dir, "none"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	out := run("explain", "pods.spec.containers")
	for _, want := range []string{"KIND:       Pod", "FIELD: containers <[]Container>", "imagePullPolicy\t<string>"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl explain output lacks %q:\n%s", want, out)
		}
	}
	out = run("explain", "deployments.spec.replicas")
	if !strings.Contains(out, "replicas") {
		t.Errorf("kubectl explain deployments.spec.replicas:\n%s", out)
	}
	out = run("api-resources", "-o", "name")
	if diff := cmp.Diff([]string{"namespaces", "pods", "deployments.apps"}, strings.Fields(out)); diff != "" {
		t.Errorf("kubectl api-resources (-want +got):\n%s", diff)
	}
	out = run("create", "--dry-run=client", "-o", "name", "-f", manifest)
	if strings.TrimSpace(out) != "pod/p" {
		t.Errorf("kubectl create --dry-run=client = %q", out)
	}
	run("create", "-n", "default", "-f", manifest)
	if query := <-queries; !strings.Contains(query, "fieldValidation=Strict") {
		t.Errorf("kubectl create sent query %q, want fieldValidation=Strict", query)
	}
}
