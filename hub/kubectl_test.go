package hub_test

import (
	"bufio"
	"context"
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestKubectl drives a real hub process with a real kubectl through the
// commands users rely on every day.
func TestKubectl(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)

	t.Run("apply twice", func(t *testing.T) {
		out := h.MustRun("apply", "-f", "testdata/manifests/")
		if n := strings.Count(out, " created"); n < 30 {
			t.Fatalf("first apply created %d objects, want every one of the 32:\n%s", n, out)
		}
		out = h.MustRun("apply", "-f", "testdata/manifests/")
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			// PodDisruptionBudget's selector has patch strategy "replace",
			// so kubectl's three-way patch always carries it and any server,
			// upstream's too, reports the PDB as configured.
			if line == "poddisruptionbudget.policy/web configured" {
				continue
			}
			if !strings.HasSuffix(line, " unchanged") {
				t.Errorf("second apply changed something: %q", line)
			}
		}
	})

	t.Run("get columns", func(t *testing.T) {
		cases := []struct {
			args   []string
			header string
		}{
			{[]string{"get", "pods", "-n", "shop"}, "NAME READY STATUS RESTARTS AGE"},
			{[]string{"get", "pods", "-n", "shop", "-o", "wide"}, "NAME READY STATUS RESTARTS AGE IP NODE NOMINATED NODE READINESS GATES"},
			{[]string{"get", "deploy", "-n", "shop"}, "NAME READY UP-TO-DATE AVAILABLE AGE"},
			{[]string{"get", "svc", "-n", "shop"}, "NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE"},
			{[]string{"get", "nodes"}, "NAME STATUS ROLES AGE VERSION"},
			{[]string{"get", "cm", "-n", "shop"}, "NAME DATA AGE"},
			{[]string{"get", "deploy", "-A"}, "NAMESPACE NAME READY UP-TO-DATE AVAILABLE AGE"},
			{[]string{"get", "cronjobs", "-n", "shop"}, "NAME SCHEDULE TIMEZONE SUSPEND ACTIVE LAST SCHEDULE AGE"},
		}
		for _, c := range cases {
			out := h.MustRun(c.args...)
			first := strings.Join(strings.Fields(strings.SplitN(out, "\n", 2)[0]), " ")
			if first != c.header {
				t.Errorf("kubectl %s: header %q, want %q", strings.Join(c.args, " "), first, c.header)
			}
		}
		if out := h.MustRun("get", "pods", "-n", "shop", "tool"); !regexp.MustCompile(`tool\s+0/1\s+Pending\s+0\s+\S+`).MatchString(out) {
			t.Errorf("pod row: %q", out)
		}
	})

	t.Run("output formats", func(t *testing.T) {
		if out := h.MustRun("get", "deploy", "web", "-n", "shop", "-o", "name"); strings.TrimSpace(out) != "deployment.apps/web" {
			t.Errorf("-o name: %q", out)
		}
		if out := h.MustRun("get", "deploy", "web", "-n", "shop", "-o", "yaml"); !strings.Contains(out, "maxSurge: 25%") {
			t.Errorf("-o yaml lacks the defaulted strategy:\n%s", out)
		}
		if out := h.MustRun("get", "cm", "web-config", "-n", "shop", "-o", "json"); !strings.Contains(out, `"greeting": "hello"`) {
			t.Errorf("-o json:\n%s", out)
		}
		if out := h.MustRun("get", "cm", "web-config", "-n", "shop", "-o", "jsonpath={.metadata.labels.env}"); out != "prod" {
			t.Errorf("jsonpath: %q", out)
		}
	})

	t.Run("selectors", func(t *testing.T) {
		out := h.MustRun("get", "cm,pods,deploy", "-n", "shop", "-l", "env in (prod,dev),app notin (cache)", "-o", "name")
		want := "configmap/web-config\npod/tool\ndeployment.apps/web\n"
		if out != want {
			t.Errorf("set-based selector: got\n%s\nwant\n%s", out, want)
		}
		out = h.MustRun("get", "pods", "-A", "--field-selector", "status.phase=Pending,metadata.namespace=shop", "-o", "name")
		if out != "pod/tool\n" {
			t.Errorf("field selector: %q", out)
		}
		if out := h.MustRun("get", "pods", "-A", "--field-selector", "status.phase!=Pending", "-o", "name"); out != "" {
			t.Errorf("field selector !=: %q", out)
		}
		if _, err := h.Run("get", "pods", "-A", "--field-selector", "spec.color=blue"); err == nil || !strings.Contains(err.Error(), "field label not supported: spec.color") {
			t.Errorf("unsupported field label: %v", err)
		}
	})

	t.Run("describe", func(t *testing.T) {
		out := h.MustRun("describe", "deploy", "web", "-n", "shop")
		for _, want := range []string{"Name:", "web", "Replicas:", "2 desired", "StrategyType:", "RollingUpdate"} {
			if !strings.Contains(out, want) {
				t.Errorf("describe deployment lacks %q:\n%s", want, out)
			}
		}
		out = h.MustRun("describe", "node", "shop-node-1")
		if !strings.Contains(out, "topology.kubernetes.io/zone=shop") {
			t.Errorf("describe node:\n%s", out)
		}
		out = h.MustRun("describe", "svc", "web", "-n", "shop")
		if !strings.Contains(out, "10.") || !strings.Contains(out, "Port:") {
			t.Errorf("describe service:\n%s", out)
		}
	})

	t.Run("label annotate patch", func(t *testing.T) {
		h.MustRun("label", "cm", "web-config", "-n", "shop", "extra=yes")
		h.MustRun("annotate", "cm", "web-config", "-n", "shop", "note=hi")
		h.MustRun("patch", "cm", "web-config", "-n", "shop", "-p", `{"data":{"strategic":"1"}}`)
		h.MustRun("patch", "cm", "web-config", "-n", "shop", "--type", "merge", "-p", `{"data":{"merge":"2"}}`)
		h.MustRun("patch", "cm", "web-config", "-n", "shop", "--type", "json", "-p", `[{"op":"add","path":"/data/json","value":"3"}]`)
		got := h.MustRun("get", "cm", "web-config", "-n", "shop", "-o",
			`jsonpath={.metadata.labels.extra} {.metadata.annotations.note} {.data.strategic} {.data.merge} {.data.json}`)
		if got != "yes hi 1 2 3" {
			t.Errorf("after label/annotate/patches: %q", got)
		}
		// A strategic merge patch on a list with a merge key adds, not replaces.
		h.MustRun("patch", "deploy", "web", "-n", "shop", "-p",
			`{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","image":"registry.example/sidecar:1"}]}}}}`)
		got = h.MustRun("get", "deploy", "web", "-n", "shop", "-o", `jsonpath={.spec.template.spec.containers[*].name}`)
		if got != "sidecar web" && got != "web sidecar" {
			t.Errorf("containers after strategic patch: %q", got)
		}
		if _, err := h.Run("patch", "cm", "web-config", "-n", "shop", "--type", "json", "-p", `[{"op":"remove","path":"/data/missing"}]`); err == nil {
			t.Error("a JSON patch removing a missing path succeeded")
		}
	})

	t.Run("edit replace diff", func(t *testing.T) {
		h.MustRunEnv([]string{"EDITOR=sed -i s/greeting:\\ hello/greeting:\\ edited/"}, "edit", "cm", "web-config", "-n", "shop")
		if got := h.MustRun("get", "cm", "web-config", "-n", "shop", "-o", "jsonpath={.data.greeting}"); got != "edited" {
			t.Errorf("after edit: %q", got)
		}
		y := h.MustRun("get", "cm", "web-config", "-n", "shop", "-o", "yaml")
		y = strings.Replace(y, "greeting: edited", "greeting: replaced", 1)
		if _, err := h.RunInput(context.Background(), y, nil, "replace", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		if got := h.MustRun("get", "cm", "web-config", "-n", "shop", "-o", "jsonpath={.data.greeting}"); got != "replaced" {
			t.Errorf("after replace: %q", got)
		}
		// diff exits 0 when nothing would change and 1 with a diff otherwise.
		if _, err := h.Run("diff", "-f", "testdata/manifests/30-batch.yaml"); err != nil {
			t.Errorf("diff of unchanged manifests: %v", err)
		}
		out, err := h.Run("diff", "-f", "testdata/manifests/10-core.yaml")
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out, "greeting: hello") {
			t.Errorf("diff of changed configmap: err=%v\n%s", err, out)
		}
	})

	t.Run("scale", func(t *testing.T) {
		h.MustRun("scale", "deploy", "web", "-n", "shop", "--replicas=3")
		h.MustRun("scale", "sts", "db", "-n", "shop", "--replicas=2")
		h.MustRun("scale", "rs", "cache", "-n", "shop", "--current-replicas=1", "--replicas=0")
		got := h.MustRun("get", "deploy/web", "sts/db", "rs/cache", "-n", "shop", "-o", `jsonpath={range .items[*]}{.spec.replicas} {end}`)
		if got != "3 2 0 " {
			t.Errorf("replicas after scale: %q", got)
		}
	})

	t.Run("watch", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, h.Kubectl, "--cache-dir", h.CacheDir, "get", "cm", "-n", "shop", "-w", "--output-watch-events")
		cmd.Env = append(cmd.Environ(), "KUBECONFIG="+h.Kubeconfig)
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = cmd.Wait() }()
		lines := make(chan string, 100)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		expect := func(re string) {
			t.Helper()
			for {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("watch ended before %q", re)
					}
					if regexp.MustCompile(re).MatchString(l) {
						return
					}
				case <-ctx.Done():
					t.Fatalf("no watch line matching %q", re)
				}
			}
		}
		expect(`ADDED\s+web-config`)
		h.MustRun("create", "cm", "watched", "-n", "shop", "--from-literal=a=b")
		expect(`ADDED\s+watched\s+1`)
		h.MustRun("label", "cm", "watched", "-n", "shop", "x=y")
		expect(`MODIFIED\s+watched`)
		h.MustRun("delete", "cm", "watched", "-n", "shop")
		expect(`DELETED\s+watched`)
	})

	t.Run("delete and wait", func(t *testing.T) {
		h.MustRun("create", "cm", "doomed", "-n", "shop")
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		waited := make(chan error, 1)
		go func() {
			_, err := h.RunInput(ctx, "", nil, "wait", "--for=delete", "cm/doomed", "-n", "shop", "--timeout=50s")
			waited <- err
		}()
		time.Sleep(500 * time.Millisecond)
		h.MustRun("delete", "cm", "doomed", "-n", "shop", "--wait=false")
		if err := <-waited; err != nil {
			t.Errorf("wait --for=delete: %v", err)
		}
		// An unscheduled pod goes at once, so the default --wait returns.
		h.MustRun("delete", "pod", "tool", "-n", "shop", "--wait=true", "--timeout=30s")
		if _, err := h.Run("get", "pod", "tool", "-n", "shop"); err == nil || !strings.Contains(err.Error(), `pods "tool" not found`) {
			t.Errorf("pod after delete: %v", err)
		}
	})

	t.Run("cascade", func(t *testing.T) {
		// Foreground: the deployment goes only after what it owns.
		h.MustRun("create", "deployment", "fg", "-n", "shop", "--image=registry.example/fg:1")
		h.MustRun("create", "cm", "fg-dep", "-n", "shop")
		uid := h.MustRun("get", "deploy", "fg", "-n", "shop", "-o", "jsonpath={.metadata.uid}")
		owner := `{"metadata":{"ownerReferences":[{"apiVersion":"apps/v1","kind":"Deployment","name":"fg","uid":"` + uid + `","blockOwnerDeletion":true}]}}`
		h.MustRun("patch", "cm", "fg-dep", "-n", "shop", "--type", "merge", "-p", owner)
		h.MustRun("delete", "deploy", "fg", "-n", "shop", "--cascade=foreground", "--timeout=60s")
		if _, err := h.Run("get", "cm", "fg-dep", "-n", "shop"); err == nil {
			t.Error("foreground deletion left the dependent behind")
		}
		// Orphan: the dependent stays, without its owner reference.
		h.MustRun("create", "deployment", "or", "-n", "shop", "--image=registry.example/or:1")
		h.MustRun("create", "cm", "or-dep", "-n", "shop")
		uid = h.MustRun("get", "deploy", "or", "-n", "shop", "-o", "jsonpath={.metadata.uid}")
		owner = `{"metadata":{"ownerReferences":[{"apiVersion":"apps/v1","kind":"Deployment","name":"or","uid":"` + uid + `"}]}}`
		h.MustRun("patch", "cm", "or-dep", "-n", "shop", "--type", "merge", "-p", owner)
		h.MustRun("delete", "deploy", "or", "-n", "shop", "--cascade=orphan", "--timeout=60s")
		if refs := h.MustRun("get", "cm", "or-dep", "-n", "shop", "-o", "jsonpath={.metadata.ownerReferences}"); refs != "" {
			t.Errorf("orphaned dependent still has owner references: %s", refs)
		}
	})

	t.Run("namespace lifecycle", func(t *testing.T) {
		h.MustRun("create", "namespace", "closing")
		h.MustRun("create", "cm", "held", "-n", "closing")
		h.MustRun("patch", "cm", "held", "-n", "closing", "--type", "merge", "-p", `{"metadata":{"finalizers":["example.com/hold"]}}`)
		h.MustRun("delete", "namespace", "closing", "--wait=false")
		if out := h.MustRun("get", "ns", "closing", "-o", "jsonpath={.status.phase}"); out != "Terminating" {
			t.Errorf("namespace phase %q, want Terminating", out)
		}
		_, err := h.Run("create", "cm", "late", "-n", "closing")
		if err == nil || !strings.Contains(err.Error(), "because it is being terminated") {
			t.Errorf("create in a terminating namespace: %v", err)
		}
		h.MustRun("patch", "cm", "held", "-n", "closing", "--type", "merge", "-p", `{"metadata":{"finalizers":null}}`)
		h.MustRun("wait", "--for=delete", "namespace/closing", "--timeout=60s")
	})

	t.Run("api-resources", func(t *testing.T) {
		out := h.MustRun("api-resources")
		for _, re := range []string{`deployments\s+deploy\s+apps/v1\s+true\s+Deployment`, `pods\s+po\s+v1\s+true\s+Pod`,
			`priorityclasses\s+pc\s+scheduling.k8s.io/v1\s+false\s+PriorityClass`, `leases\s+coordination.k8s.io/v1\s+true\s+Lease`} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("api-resources lacks %s:\n%s", re, out)
			}
		}
		if out := h.MustRun("get", "--raw", "/version"); !strings.Contains(out, `"gitVersion": "v1.37`) && !strings.Contains(out, `"gitVersion":"v1.37`) {
			t.Errorf("/version: %s", out)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		cases := []struct {
			name, manifest, want string
		}{
			{"invalid name", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Bad_Name\n  namespace: shop\n", `is invalid: metadata.name: Invalid value: "Bad_Name"`},
			{"missing image", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: shop\nspec:\n  containers:\n  - name: c\n", "spec.containers[0].image: Required value"},
			{"unknown field", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: u\n  namespace: shop\nbogus: 1\n", `unknown field "bogus"`},
			{"missing namespace", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: m\n  namespace: nowhere\n", `namespaces "nowhere" not found`},
			{"selector mismatch", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\n  namespace: shop\nspec:\n  selector:\n    matchLabels: {a: b}\n  template:\n    metadata:\n      labels: {a: c}\n    spec:\n      containers:\n      - name: c\n        image: i\n", "`selector` does not match template `labels`"},
		}
		for _, c := range cases {
			_, err := h.RunInput(context.Background(), c.manifest, nil, "create", "-f", "-")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: want an error containing %q, got %v", c.name, c.want, err)
			}
		}
		if _, err := h.Run("get", "cm", "u", "-n", "shop"); err == nil {
			t.Error("a rejected object was stored")
		}
		// Immutable field.
		_, err := h.Run("patch", "deploy", "web", "-n", "shop", "-p", `{"spec":{"selector":{"matchLabels":{"app":"other"}}}}`)
		if err == nil || !strings.Contains(err.Error(), "field is immutable") {
			t.Errorf("changing an immutable selector: %v", err)
		}
	})
}

// apiOnly are hub flags for tests of the API itself: only the garbage
// collector and the namespace controller run, so that the objects a test
// creates are the only ones it sees (no pods from workload controllers, no
// default ServiceAccounts), and nothing else writes while it counts. The
// scheduler is off too: with no nodes, it would answer every pod a test
// creates with a FailedScheduling event and a status write of its own.
var apiOnly = []string{"--controllers=garbagecollector,namespace", "--disable-scheduler"}
