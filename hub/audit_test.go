package hub_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/tether-edge/tether/hub/hubtest"
)

// readAudit parses every audit log file of dir (the live one and rotated
// ones).
func readAudit(t *testing.T, dir string) []auditv1.Event {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "audit*.log"))
	var evs []auditv1.Event
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			var ev auditv1.Event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("%s: line is not an audit event: %v\n%s", f, err, sc.Text())
			}
			if ev.Kind != "Event" || ev.APIVersion != "audit.k8s.io/v1" {
				t.Fatalf("event has kind %q apiVersion %q", ev.Kind, ev.APIVersion)
			}
			evs = append(evs, ev)
		}
	}
	return evs
}

// kubectlEvents are the events of resource requests made by kubectl as user.
func kubectlEvents(evs []auditv1.Event, user string) []auditv1.Event {
	var out []auditv1.Event
	for _, ev := range evs {
		if ev.User.Username == user && strings.HasPrefix(ev.UserAgent, "kubectl") && ev.ObjectRef != nil {
			out = append(out, ev)
		}
	}
	return out
}

// tokenKubeconfig writes a copy of h's kubeconfig that authenticates with
// a bearer token instead of the admin's certificate.
func tokenKubeconfig(t *testing.T, h *hubtest.Hub, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	raw := h.MustRun("config", "view", "--raw", "--minify", "-o", "json")
	var cfg map[string]any
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	users := cfg["users"].([]any)
	users[0].(map[string]any)["user"] = map[string]any{"token": token}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  users: [quiet-user]
- level: None
  resources: [{group: "", resources: [configmaps]}]
  namespaces: [quiet]
- level: None
  nonResourceURLs: ["/readyz*", "/healthz*", "/livez*"]
- level: RequestResponse
`

// TestAuditLog shows the audit log of `tether hub --audit-log-path`: one
// event per kubectl request at ResponseComplete with its user, verb,
// object and code; a policy's None rules; a Secret's data nowhere in the
// log even when the policy asks for RequestResponse; and rotation at
// --audit-log-maxsize.
func TestAuditLog(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "audit.log")
	h := hubtest.Start(t, append(apiOnly[:len(apiOnly):len(apiOnly)], "--audit-log-path", logPath)...)

	// Without a policy file: Metadata for everything, no RequestReceived
	// stage, and the Audit-Id header names the event.
	cmd := exec.Command(h.Kubectl, "--cache-dir", h.CacheDir, "--kubeconfig", h.Kubeconfig, "get", "namespace", "default", "-v=8")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get namespace: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^.*Audit-Id: ([0-9a-f-]+)`).FindAllSubmatch(out, -1)
	if len(m) == 0 {
		t.Fatalf("no Audit-Id response header in kubectl's log:\n%s", out)
	}
	auditID := string(m[len(m)-1][1])

	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := "node-token,system:node:n1,n1,system:nodes\nquiet-token,quiet-user,q1,system:masters\n"
	if err := os.WriteFile(filepath.Join(h.DataDir, "tokens.csv"), []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	h.Stop()
	evs := readAudit(t, dir)
	found := 0
	for _, ev := range evs {
		if ev.Stage == auditv1.StageRequestReceived {
			t.Fatalf("default policy logged stage RequestReceived: %+v", ev)
		}
		if ev.Level != auditv1.LevelMetadata {
			t.Fatalf("default policy logged level %s", ev.Level)
		}
		if string(ev.AuditID) == auditID {
			found++
			if ev.Stage != auditv1.StageResponseComplete || ev.Verb != "get" || ev.ObjectRef == nil ||
				ev.ObjectRef.Resource != "namespaces" || ev.ObjectRef.Name != "default" || ev.ResponseStatus.Code != 200 {
				t.Fatalf("event of Audit-Id %s: %+v", auditID, ev)
			}
		}
	}
	if found != 1 {
		t.Fatalf("%d events carry the Audit-Id %s kubectl received, want 1", found, auditID)
	}
	if err := os.Remove(logPath); err != nil {
		t.Fatal(err)
	}

	h.Restart(append(apiOnly[:len(apiOnly):len(apiOnly)], "--audit-log-path", logPath, "--audit-policy-file", policy,
		"--audit-log-maxsize", "1", "--audit-log-maxbackups", "0")...)
	const secretValue = "s3cr3t-Pa55w0rd-value"
	const configValue = "plain-config-value"
	h.MustRun("create", "secret", "generic", "s1", "--from-literal=password="+secretValue)
	h.MustRun("get", "secret", "s1", "-o", "yaml")
	h.MustRun("get", "secrets")
	h.MustRun("patch", "secret", "s1", "-p", `{"stringData":{"extra":"`+secretValue+`"}}`)
	if _, err := h.Run("get", "secret", "missing"); err == nil {
		t.Fatal("get of a missing secret succeeded")
	}
	h.MustRun("create", "configmap", "c1", "--from-literal=key="+configValue)
	h.MustRun("create", "namespace", "quiet")
	h.MustRun("create", "configmap", "hidden", "-n", "quiet", "--from-literal=key=v")
	h.MustRun("delete", "secret", "s1")
	nodeCfg := tokenKubeconfig(t, h, "node-token")
	if _, err := h.Run("--kubeconfig", nodeCfg, "get", "secret", "other"); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Fatalf("a node read a secret it has no business with: %v", err)
	}
	h.MustRun("--kubeconfig", tokenKubeconfig(t, h, "quiet-token"), "get", "configmaps")
	// Events of ~400 KiB each (a ConfigMap's request and response at
	// RequestResponse) fill the 1 MiB of --audit-log-maxsize quickly.
	big := strings.Repeat("x", 200<<10)
	for i := range 6 {
		cm := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big-%d"},"data":{"k":%q}}`, i, big)
		if _, err := h.RunInput(context.Background(), cm, nil, "create", "-f", "-"); err != nil {
			t.Fatal(err)
		}
	}
	// Events reach the file while the hub runs (what kill -9 would lose
	// is only what is still queued): the last request's is there at once.
	h.MustRun("get", "configmap", "c1")
	done := time.Now()
	for !strings.Contains(lastLines(t, logPath), `"/api/v1/namespaces/default/configmaps/c1"`) {
		if time.Since(done) > 5*time.Second {
			t.Fatal("the last request's event is not in the file 5s after kubectl returned")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("event in the file %v after kubectl returned", time.Since(done))
	h.Kill()

	evs = readAudit(t, dir)
	type want struct {
		user, verb, resource, namespace, name string
		code                                  int32
	}
	wants := []want{
		{"tether-admin", "create", "secrets", "default", "s1", 201},
		{"tether-admin", "get", "secrets", "default", "s1", 200},
		{"tether-admin", "list", "secrets", "default", "", 200},
		{"tether-admin", "get", "secrets", "default", "s1", 200}, // kubectl patch reads first
		{"tether-admin", "patch", "secrets", "default", "s1", 200},
		{"tether-admin", "get", "secrets", "default", "missing", 404},
		{"tether-admin", "create", "configmaps", "default", "c1", 201},
		{"tether-admin", "create", "namespaces", "", "quiet", 201},
		{"tether-admin", "delete", "secrets", "default", "s1", 200},
		{"tether-admin", "get", "secrets", "default", "s1", 404}, // kubectl delete waits for it to go
	}
	for i := range 6 {
		wants = append(wants, want{"tether-admin", "create", "configmaps", "default", fmt.Sprintf("big-%d", i), 201})
	}
	wants = append(wants, want{"tether-admin", "get", "configmaps", "default", "c1", 200})
	// The events of each user, in order.
	wants = append(wants, want{"system:node:n1", "get", "secrets", "default", "other", 403})
	var got []want
	for _, u := range []string{"tether-admin", "system:node:n1", "quiet-user"} {
		for _, ev := range kubectlEvents(evs, u) {
			if ev.Stage != auditv1.StageResponseComplete {
				t.Errorf("kubectl's request logged at stage %s: %s %s", ev.Stage, ev.Verb, ev.RequestURI)
				continue
			}
			r := ev.ObjectRef
			got = append(got, want{ev.User.Username, ev.Verb, r.Resource, r.Namespace, r.Name, ev.ResponseStatus.Code})
			if ev.Annotations["authorization.k8s.io/decision"] == "" || len(ev.SourceIPs) == 0 || ev.RequestReceivedTimestamp.IsZero() ||
				ev.StageTimestamp.Before(&ev.RequestReceivedTimestamp) {
				t.Errorf("event lacks metadata: %+v", ev)
			}
			if r.Resource == "secrets" && ev.Level != auditv1.LevelMetadata {
				t.Errorf("a secrets request logged at level %s", ev.Level)
			}
			if ev.ResponseStatus.Code == 403 && (ev.Annotations["authorization.k8s.io/decision"] != "forbid" ||
				!strings.Contains(ev.ResponseStatus.Message, "forbidden")) {
				t.Errorf("denied request's event: %+v", ev)
			}
			if ev.ResponseStatus.Code == 404 && ev.ResponseStatus.Reason != "NotFound" {
				t.Errorf("404's event has reason %q", ev.ResponseStatus.Reason)
			}
		}
	}
	if strings.Join(fmtWants(got), "\n") != strings.Join(fmtWants(wants), "\n") {
		t.Fatalf("kubectl's requests in the audit log:\n%s\nwant exactly once each:\n%s",
			strings.Join(fmtWants(got), "\n"), strings.Join(fmtWants(wants), "\n"))
	}

	files, _ := filepath.Glob(filepath.Join(dir, "audit*.log"))
	if len(files) < 3 {
		t.Fatalf("audit log files %v, want the live one and at least two rotated at 1 MiB", files)
	}
	var raw []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 1<<20 {
			t.Errorf("%s has %d bytes, more than --audit-log-maxsize 1 (MiB)", f, len(b))
		}
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", f, st.Mode().Perm(), err)
		}
		raw = append(raw, b...)
	}
	for _, s := range []string{secretValue, base64.StdEncoding.EncodeToString([]byte(secretValue)),
		base64.StdEncoding.EncodeToString([]byte(secretValue))[:16]} {
		if bytes.Contains(raw, []byte(s)) {
			t.Fatalf("the audit log holds the secret's data %q", s)
		}
	}
	// RequestResponse applies to what is not secret: the ConfigMap's
	// request and response bodies are logged.
	if n := bytes.Count(raw, []byte(configValue)); n < 2 {
		t.Fatalf("the ConfigMap's value appears %d times in the log, want its request and response bodies", n)
	}
	var started bool
	for _, ev := range evs {
		if ev.Stage == auditv1.StageRequestReceived {
			t.Fatalf("stage RequestReceived logged despite omitStages: %+v", ev)
		}
		if ev.Stage == auditv1.StageResponseStarted && ev.Verb == "watch" && ev.ResponseStatus.Code == 200 {
			started = true
		}
	}
	if !started {
		t.Fatal("no ResponseStarted event for the controllers' watches")
	}
	if len(evs) == 0 || time.Since(evs[len(evs)-1].StageTimestamp.Time) > time.Minute {
		t.Fatal("no recent events")
	}
}

func fmtWants[T any](ws []T) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = fmt.Sprintf("%+v", w)
	}
	return out
}

// TestAuditPolicyMalformed shows that the hub refuses to start with a
// policy file it cannot use, saying why.
func TestAuditPolicyMalformed(t *testing.T) {
	tether, _ := hubtest.Binaries(t)
	for name, tc := range map[string]struct{ policy, want string }{
		"bad level": {"apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Everything\n",
			`rules[0].level: Unsupported value: "Everything"`},
		"no rules":     {"apiVersion: audit.k8s.io/v1\nkind: Policy\n", "loaded illegal policy with 0 rules"},
		"not yaml":     {"apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [\n", "failed decoding"},
		"wrong kind":   {"apiVersion: v1\nkind: ConfigMap\n", "failed decoding"},
		"bad stage":    {"apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [Sometime]\nrules:\n- level: None\n", `omitStages[0]: Invalid value: "Sometime"`},
		"missing file": {"", "failed to read file path"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			policy := filepath.Join(dir, "policy.yaml")
			if tc.policy != "" {
				if err := os.WriteFile(policy, []byte(tc.policy), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, tether, "hub", "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0",
				"--audit-log-path", filepath.Join(dir, "audit.log"), "--audit-policy-file", policy).CombinedOutput()
			if err == nil || ctx.Err() != nil {
				t.Fatalf("hub started with a malformed audit policy (err %v):\n%s", err, out)
			}
			if !strings.Contains(string(out), "load audit policy") || !strings.Contains(string(out), tc.want) {
				t.Fatalf("hub's error does not say %q:\n%s", tc.want, out)
			}
		})
	}
}

// lastLines returns the end of the file at path.
func lastLines(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b[max(0, len(b)-4096):])
}
