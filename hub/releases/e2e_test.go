package releases_test

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/internal/fleetapi"
)

// builds holds the executables TestMain built: two edge builds that
// differ only in their version.
var builds struct {
	dir    string
	v1, v2 string
	err    error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tether-releases-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	builds.dir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// edgeBuilds builds, once per test process, the edge executable at two
// versions as scripts/release.sh would stamp them.
func edgeBuilds(t *testing.T) (v1, v2 string) {
	t.Helper()
	if builds.v1 == "" && builds.err == nil {
		for _, v := range []string{"v0.9.0-test", "v1.0.0-test"} {
			out := filepath.Join(builds.dir, "tether-edge-"+v)
			cmd := exec.Command("go", "build", "-tags", "edge", "-ldflags", "-s -w -X main.version="+v, "-o", out, "./cmd/tether")
			cmd.Dir = hubtest.RepoRoot()
			if b, err := cmd.CombinedOutput(); err != nil {
				builds.err = fmt.Errorf("build the edge executable %s: %v\n%s", v, err, b)
				break
			}
			if builds.v1 == "" {
				builds.v1 = out
			} else {
				builds.v2 = out
			}
		}
	}
	if builds.err != nil {
		t.Fatal(builds.err)
	}
	return builds.v1, builds.v2
}

// client is an HTTP client of the hub with a kubeconfig's credentials.
type client struct {
	t    *testing.T
	host string
	hc   *http.Client
}

func newClient(t *testing.T, kubeconfig string) *client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &client{t: t, host: strings.TrimSuffix(cfg.Host, "/"), hc: hc}
}

// do sends a request and returns the answer with its body read.
func (c *client) do(method, path string, body io.Reader, header http.Header) (*http.Response, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.host+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	return resp, b
}

// status decodes a Status answer.
func status(t *testing.T, b []byte) metav1.Status {
	t.Helper()
	var st metav1.Status
	if err := json.Unmarshal(b, &st); err != nil || st.Kind != "Status" {
		t.Fatalf("not a Status (%v): %s", err, b)
	}
	return st
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// importFile runs `tether release import` and returns what it printed.
func importFile(h *hubtest.Hub, path string) (string, error) {
	out, err := exec.Command(h.Bin, "release", "import", path, "--kubeconfig", h.Kubeconfig).CombinedOutput()
	return string(out), err
}

func getRelease(t *testing.T, h *hubtest.Hub, name string) *fleetapi.Release {
	t.Helper()
	rel := &fleetapi.Release{}
	if err := json.Unmarshal([]byte(h.MustRun("get", "release", name, "-o", "json")), rel); err != nil {
		t.Fatal(err)
	}
	return rel
}

func releaseCount(t *testing.T, h *hubtest.Hub) int {
	t.Helper()
	out := h.MustRun("get", "releases", "-o", "name")
	return len(strings.Fields(out))
}

// TestReleases drives the hub's release store end to end: the kinds served
// from the start, imports with the tether command (signed, idempotent,
// refused for what is not a versioned tether), downloads whole, resumed
// and as deltas, who may do what, and the admission of EdgeUpgrades.
func TestReleases(t *testing.T) {
	v1Path, v2Path := edgeBuilds(t)
	h := hubtest.Start(t, "--disable-scheduler")
	v1, err := os.ReadFile(v1Path)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := os.ReadFile(v2Path)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(h.DataDir, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	admin := newClient(t, h.Kubeconfig)

	// Both kinds are served as soon as the hub is ready.
	if out, err := h.RunInput(t.Context(), "", nil, "get", "releases,edgeupgrades"); err != nil {
		t.Fatalf("kubectl get releases,edgeupgrades right after start: %v\n%s", err, out)
	}

	// Import, as the command does; the Release is signed by a signer of
	// the cluster CA.
	out, err := importFile(h, v1Path)
	if err != nil {
		t.Fatalf("tether release import: %v\n%s", err, out)
	}
	name1 := fleetapi.ReleaseName("v0.9.0-test", fleetapi.BuildEdge, runtimeArch(t, v1Path))
	want := fmt.Sprintf("release %s imported: %s, %d bytes", name1, digestOf(v1), len(v1))
	if !strings.Contains(out, want) {
		t.Errorf("tether release import said %q, want %q", out, want)
	}
	rel1 := getRelease(t, h, name1)
	if rel1.Spec.Digest != digestOf(v1) || rel1.Spec.Size != int64(len(v1)) || rel1.Spec.Version != "v0.9.0-test" ||
		rel1.Spec.Build != fleetapi.BuildEdge || rel1.Labels[fleetapi.LabelVersion] != "v0.9.0-test" ||
		rel1.Labels[fleetapi.LabelBuild] != fleetapi.BuildEdge || rel1.Labels[fleetapi.LabelArch] != rel1.Spec.Arch {
		t.Errorf("Release %s: labels %v, spec %+v", name1, rel1.Labels, rel1.Spec)
	}
	if err := fleetapi.Verify(rel1.Spec, roots, time.Now()); err != nil {
		t.Errorf("the Release's signature: %v", err)
	}

	// The same executable again: the same Release, untouched.
	if out, err := importFile(h, v1Path); err != nil || !strings.Contains(out, "release "+name1+" already held") {
		t.Errorf("second import: %v\n%s", err, out)
	}
	if again := getRelease(t, h, name1); again.ResourceVersion != rel1.ResourceVersion {
		t.Errorf("a second import changed the Release: resourceVersion %s → %s", rel1.ResourceVersion, again.ResourceVersion)
	}

	// What is not a versioned tether executable is refused, 400, saying why.
	notGo := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(notGo, []byte("not an executable\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, says string }{
		{notGo, "not a Go executable"},
		{self, "not tether: the executable is"},
		{h.Bin, "has no version"},
	} {
		out, err := importFile(h, c.file)
		if err == nil || !strings.Contains(out, c.says) {
			t.Errorf("import %s: %v\n%s, want an error saying %q", filepath.Base(c.file), err, out, c.says)
		}
		t.Logf("refused: %s", strings.TrimSpace(out))
	}
	resp, body := admin.do(http.MethodPost, fleetapi.ImportPath, bytes.NewReader([]byte("#!/bin/sh\n")), nil)
	if st := status(t, body); resp.StatusCode != http.StatusBadRequest || st.Reason != metav1.StatusReasonBadRequest {
		t.Errorf("POST of a script: %d %+v", resp.StatusCode, st)
	}
	// Another executable under the same name (here: the same one with a
	// byte appended, which reads the same) is a conflict.
	resp, body = admin.do(http.MethodPost, fleetapi.ImportPath, bytes.NewReader(append(bytes.Clone(v1), 0)), nil)
	if st := status(t, body); resp.StatusCode != http.StatusConflict || st.Reason != metav1.StatusReasonConflict ||
		!strings.Contains(st.Message, "the Release holds another executable") {
		t.Errorf("import of another executable under %s: %d %+v", name1, resp.StatusCode, st)
	}
	if n := releaseCount(t, h); n != 1 {
		t.Errorf("%d Releases after refused imports, want 1", n)
	}
	if again := getRelease(t, h, name1); again.ResourceVersion != rel1.ResourceVersion {
		t.Errorf("a refused import changed the Release: resourceVersion %s → %s", rel1.ResourceVersion, again.ResourceVersion)
	}

	testDownloads(t, h, admin, v1, v2, v2Path)
	testRights(t, h, v1)
	testEdgeUpgradeAdmission(t, h)

	// A restart rewrites no definition and keeps the store.
	gen := h.MustRun("get", "crd", "releases.fleet.tether.io", "-o", "jsonpath={.metadata.resourceVersion}")
	h.Restart()
	if after := h.MustRun("get", "crd", "releases.fleet.tether.io", "-o", "jsonpath={.metadata.resourceVersion}"); after != gen {
		t.Errorf("the definition was written at restart: resourceVersion %s → %s", gen, after)
	}
	if n := releaseCount(t, h); n != 2 {
		t.Errorf("%d Releases after a restart, want 2", n)
	}
	admin = newClient(t, h.Kubeconfig)
	if resp, body := admin.do(http.MethodGet, fleetapi.DownloadPath(digestOf(v2))+"?from="+digestOf(v1), nil, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("the kept delta after a restart: %d %s", resp.StatusCode, body)
	}
}

// testDownloads: the whole executable, a resumed download from the middle,
// and a delta between two imports.
func testDownloads(t *testing.T, h *hubtest.Hub, admin *client, v1, v2 []byte, v2Path string) {
	d1 := digestOf(v1)
	resp, body := admin.do(http.MethodGet, fleetapi.DownloadPath(d1), nil, nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, v1) || resp.Header.Get("ETag") != `"`+d1+`"` {
		t.Fatalf("download: %d, %d bytes (want %d), ETag %q", resp.StatusCode, len(body), len(v1), resp.Header.Get("ETag"))
	}
	mid := len(v1) / 2
	resp, body = admin.do(http.MethodGet, fleetapi.DownloadPath(d1), nil, http.Header{
		"Range": {fmt.Sprintf("bytes=%d-", mid)}, "If-Range": {`"` + d1 + `"`}})
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, v1[mid:]) {
		t.Errorf("resumed download from byte %d: %d, %d bytes (want %d)", mid, resp.StatusCode, len(body), len(v1)-mid)
	}
	// A resume against another version of the file gets it whole.
	resp, body = admin.do(http.MethodGet, fleetapi.DownloadPath(d1), nil, http.Header{
		"Range": {fmt.Sprintf("bytes=%d-", mid)}, "If-Range": {`"sha256:0000"`}})
	if resp.StatusCode != http.StatusOK || len(body) != len(v1) {
		t.Errorf("resume with a stale If-Range: %d, %d bytes", resp.StatusCode, len(body))
	}
	unknown := "sha256:" + strings.Repeat("0", 64)
	resp, body = admin.do(http.MethodGet, fleetapi.DownloadPath(unknown), nil, nil)
	if st := status(t, body); resp.StatusCode != http.StatusNotFound || st.Reason != metav1.StatusReasonNotFound {
		t.Errorf("download of an unknown digest: %d %+v", resp.StatusCode, st)
	}

	if out, err := importFile(h, v2Path); err != nil {
		t.Fatalf("import v2: %v\n%s", err, out)
	}
	d2 := digestOf(v2)
	resp, body = admin.do(http.MethodGet, fleetapi.DownloadPath(d2)+"?from="+unknown, nil, nil)
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("delta from an executable the hub does not hold: %d %s", resp.StatusCode, body)
	}
	start := time.Now()
	resp, delta := admin.do(http.MethodGet, fleetapi.DownloadPath(d2)+"?from="+d1, nil, nil)
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("delta: %d %s", resp.StatusCode, delta)
	}
	if got := resp.Header.Get(fleetapi.DeltaHeader); got != digestOf(delta) || resp.Header.Get("ETag") != `"`+got+`"` {
		t.Errorf("delta digest header %q, ETag %q; the delta's digest is %s", got, resp.Header.Get("ETag"), digestOf(delta))
	}
	var rebuilt bytes.Buffer
	if err := fleetapi.DecodeDelta(&rebuilt, v1, bytes.NewReader(delta), int64(len(v2))); err != nil {
		t.Fatalf("decode the delta: %v", err)
	}
	if !bytes.Equal(rebuilt.Bytes(), v2) {
		t.Fatal("the delta does not decode to the new executable")
	}
	// Kept: the second request is served from the file, and resumes.
	start2 := time.Now()
	resp, again := admin.do(http.MethodGet, fleetapi.DownloadPath(d2)+"?from="+d1, nil, http.Header{"Range": {"bytes=10-"}})
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(again, delta[10:]) {
		t.Errorf("resumed delta: %d, %d bytes", resp.StatusCode, len(again))
	}
	t.Logf("delta between two edge builds differing in version only: %d bytes for a %d-byte executable (%.3f%%), computed in %v, served again in %v",
		len(delta), len(v2), 100*float64(len(delta))/float64(len(v2)), took.Round(time.Millisecond), time.Since(start2).Round(time.Millisecond))
	benchfmt.Report(t, benchfmt.Figure{Name: "release_delta_bytes", Value: float64(len(delta)), Unit: "bytes",
		Peer: "full_executable", PeerValue: float64(len(v2)), Target: "ratio<=0.1", Mode: benchfmt.Mode(false),
		Extra: []string{"change=version_only", "build=edge", fmt.Sprintf("encode_s=%s", benchfmt.FormatValue(took.Seconds()))}})
}

// testRights: a node may read Releases and download but not import; a
// user without rights gets upstream's 403.
func testRights(t *testing.T, h *hubtest.Hub, v1 []byte) {
	d1 := digestOf(v1)
	node := newClient(t, h.UserKubeconfig("system:node:edge-1", "system:nodes"))
	resp, body := node.do(http.MethodGet, fleetapi.DownloadPath(d1), nil, nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, v1) {
		t.Errorf("a node's download: %d, %d bytes", resp.StatusCode, len(body))
	}
	resp, body = node.do(http.MethodPost, fleetapi.ImportPath, bytes.NewReader(v1), nil)
	if st := status(t, body); resp.StatusCode != http.StatusForbidden || st.Reason != metav1.StatusReasonForbidden {
		t.Errorf("a node's import: %d %+v", resp.StatusCode, st)
	}
	resp, body = node.do(http.MethodGet, "/apis/fleet.tether.io/v1alpha1/releases", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a node's list of Releases: %d %s", resp.StatusCode, body)
	}

	nobody := newClient(t, h.UserKubeconfig("mallory"))
	resp, body = nobody.do(http.MethodGet, fleetapi.DownloadPath(d1), nil, nil)
	wantMsg := fmt.Sprintf(`forbidden: User "mallory" cannot get path "%s"`, fleetapi.DownloadPath(d1))
	if st := status(t, body); resp.StatusCode != http.StatusForbidden || st.Message != wantMsg {
		t.Errorf("an unprivileged download: %d %q, want 403 %q", resp.StatusCode, st.Message, wantMsg)
	}
	resp, body = nobody.do(http.MethodPost, fleetapi.ImportPath, bytes.NewReader(v1), nil)
	wantMsg = fmt.Sprintf(`forbidden: User "mallory" cannot post path "%s"`, fleetapi.ImportPath)
	if st := status(t, body); resp.StatusCode != http.StatusForbidden || st.Message != wantMsg {
		t.Errorf("an unprivileged import: %d %q, want 403 %q", resp.StatusCode, st.Message, wantMsg)
	}
}

// testEdgeUpgradeAdmission: a rollout of a version the hub holds no
// release of, or with an unknown time zone, is refused and not stored.
func testEdgeUpgradeAdmission(t *testing.T, h *hubtest.Hub) {
	manifest := func(name, version, tz string) string {
		m := fmt.Sprintf("apiVersion: fleet.tether.io/v1alpha1\nkind: EdgeUpgrade\nmetadata:\n  name: %s\nspec:\n  version: %s\n", name, version)
		if tz != "" {
			m += fmt.Sprintf("  window:\n    start: \"02:00\"\n    duration: 2h\n    timeZone: %s\n", tz)
		}
		return m
	}
	_, err := h.RunInput(t.Context(), manifest("to-v9", "v9", ""), nil, "create", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), `The EdgeUpgrade "to-v9" is invalid: spec.version: Not found: "v9": the hub holds no release of this version`) {
		t.Errorf("an EdgeUpgrade to a version without release: %v", err)
	}
	// The API's answer: 422 with the cause on spec.version.
	admin := newClient(t, h.Kubeconfig)
	resp, body := admin.do(http.MethodPost, "/apis/fleet.tether.io/v1alpha1/edgeupgrades",
		strings.NewReader(`{"apiVersion":"fleet.tether.io/v1alpha1","kind":"EdgeUpgrade","metadata":{"name":"to-v9"},"spec":{"version":"v9"}}`),
		http.Header{"Content-Type": {"application/json"}})
	st := status(t, body)
	if resp.StatusCode != http.StatusUnprocessableEntity || st.Reason != metav1.StatusReasonInvalid || st.Details == nil ||
		len(st.Details.Causes) != 1 || st.Details.Causes[0].Field != "spec.version" || st.Details.Causes[0].Type != metav1.CauseTypeFieldValueNotFound {
		t.Errorf("POST of an EdgeUpgrade to a version without release: %d %+v", resp.StatusCode, st)
	}
	_, err = h.RunInput(t.Context(), manifest("bad-zone", "v0.9.0-test", "Mars/Olympus"), nil, "create", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), `spec.window.timeZone: Invalid value: "Mars/Olympus"`) {
		t.Errorf("an EdgeUpgrade with an unknown time zone: %v", err)
	}
	if out := h.MustRun("get", "edgeupgrades", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("refused EdgeUpgrades were stored: %q", out)
	}
	if _, err := h.RunInput(t.Context(), manifest("to-v09", "v0.9.0-test", "Europe/Berlin"), nil, "create", "-f", "-"); err != nil {
		t.Errorf("an EdgeUpgrade to a held version: %v", err)
	}
	// Changing the version to one without release is refused too.
	_, err = h.RunInput(t.Context(), "", nil, "patch", "edgeupgrade", "to-v09", "--type=merge", "-p", `{"spec":{"version":"v9"}}`)
	if err == nil || !strings.Contains(err.Error(), `spec.version: Not found: "v9"`) {
		t.Errorf("an update to a version without release: %v", err)
	}
	if got := strings.TrimSpace(h.MustRun("get", "edgeupgrade", "to-v09", "-o", "jsonpath={.spec.version}")); got != "v0.9.0-test" {
		t.Errorf("after a refused update the version is %q", got)
	}
}

// runtimeArch reads the architecture an executable was built for.
func runtimeArch(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	exe, err := fleetapi.ReadExecutable(f)
	if err != nil {
		t.Fatal(err)
	}
	return exe.Arch
}
