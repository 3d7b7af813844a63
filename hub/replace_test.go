package hub_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestKubectlReplace sends objects back as they were created, with
// replace, create --save-config and apply (client-side and server-side),
// and checks that a write the stored object already satisfies succeeds
// and changes nothing, as upstream, while a real change to an immutable
// field is still refused with upstream's message.
func TestKubectlReplace(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	h.MustRun("create", "-f", "testdata/manifests/")
	// The quota's status is computed after its pod is admitted; the
	// snapshots below compare whole objects, status included.
	waitFor(t, "the quota to count its pod", func() bool {
		out, err := h.Run("get", "resourcequota", "compute", "-n", "shop", "-o", "jsonpath={.status.used.pods}")
		return err == nil && strings.TrimSpace(out) == "1"
	})

	t.Run("manifests", func(t *testing.T) {
		before := snapshot(t, h, "-f", "testdata/manifests/")
		out, err := h.Run("replace", "-f", "testdata/manifests/")
		if n := strings.Count(out, " replaced\n"); n != len(before)-2 {
			t.Errorf("replaced %d of %d objects:\n%s\n%v", n, len(before), out, err)
		}
		// Upstream refuses these two as well: the pod was given the
		// default service account at create, which admission names on
		// create only, and the job its generated selector.
		for _, want := range []string{
			`Pod "tool" is invalid: spec: Forbidden: pod updates may not change fields other than`,
			`Job.batch "migrate" is invalid: [spec.selector: Required value`,
		} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("replace: want an error containing %q, got %v", want, err)
			}
		}
		after := snapshot(t, h, "-f", "testdata/manifests/")
		// The protection finalizers are added by admission on create
		// only, upstream too, whose protection controllers then put them
		// back; a replace that does not name them removes them.
		for _, key := range []string{"PersistentVolume//local-pv", "PersistentVolumeClaim/shop/data"} {
			delete(before[key]["metadata"].(map[string]any), "finalizers")
		}
		sameObjects(t, before, after)
	})

	t.Run("what get prints", func(t *testing.T) {
		// The events are also read and written through events.k8s.io/v1,
		// the core/v1 one included.
		for _, sel := range [][]string{{"-f", "testdata/manifests/"}, {"events.events.k8s.io", "-n", "shop"}} {
			before := snapshot(t, h, sel...)
			list := getJSON(t, h, sel...)
			for _, it := range list["items"].([]any) {
				obj := it.(map[string]any)
				delete(obj, "status")
				m := obj["metadata"].(map[string]any)
				for _, f := range []string{"resourceVersion", "uid", "creationTimestamp", "managedFields"} {
					delete(m, f)
				}
			}
			b, _ := json.Marshal(list)
			out, err := h.RunInput(context.Background(), string(b), nil, "replace", "-f", "-")
			if err != nil || strings.Count(out, " replaced\n") != len(before) {
				t.Fatalf("replace of what get %s printed: %v\n%s", strings.Join(sel, " "), err, out)
			}
			sameObjects(t, before, snapshot(t, h, sel...))
		}
	})

	h.MustRun("create", "namespace", "saved")
	createDefaultAccounts(t, h, "saved")
	saved := manifests("saved", false)

	t.Run("save-config", func(t *testing.T) {
		for _, step := range [][]string{
			{"create", "--save-config", "-f", "-"},
			{"replace", "--save-config", "-f", "-"},
			{"apply", "-f", "-"},
		} {
			out, err := h.RunInput(context.Background(), saved, nil, step...)
			if err != nil {
				t.Fatalf("kubectl %s: %v", strings.Join(step, " "), err)
			}
			if step[0] == "apply" {
				for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
					if !strings.HasSuffix(line, " unchanged") {
						t.Errorf("apply after replace --save-config: %q", line)
					}
				}
			}
		}
		got := h.MustRun("get", "pod/runner", "deploy/web", "svc/web", "cm/settings", "-n", "saved", "-o",
			`jsonpath={range .items[*]}{.metadata.annotations.kubectl\.kubernetes\.io/last-applied-configuration}{"\n"}{end}`)
		if n := strings.Count(got, `"namespace":"saved"`); n != 4 {
			t.Errorf("last-applied annotations:\n%s", got)
		}
	})

	t.Run("immutable fields", func(t *testing.T) {
		get := func(m map[string]any, path ...string) map[string]any {
			for _, p := range path {
				m = m[p].(map[string]any)
			}
			return m
		}
		cases := []struct {
			obj, ns string
			change  func(obj map[string]any)
			want    string
		}{
			{"pod/runner", "saved", func(o map[string]any) {
				get(o, "spec")["containers"].([]any)[0].(map[string]any)["name"] = "other"
			}, "pod updates may not change fields other than"},
			{"svc/web", "saved", func(o map[string]any) { get(o, "spec")["clusterIP"] = "10.0.255.254" }, "may not change once set"},
			{"job/migrate", "shop", func(o map[string]any) {
				get(o, "spec", "selector", "matchLabels")["batch.kubernetes.io/controller-uid"] = "x"
				get(o, "spec", "template", "metadata", "labels")["batch.kubernetes.io/controller-uid"] = "x"
			}, "field is immutable"},
			{"events.events.k8s.io/tool.start", "shop", func(o map[string]any) { o["note"] = "rewritten" },
				`message: Invalid value: "rewritten": field is immutable`},
			{"pvc/claim", "saved", func(o map[string]any) { get(o, "spec")["storageClassName"] = "other" },
				"spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"},
		}
		for _, c := range cases {
			cur := h.MustRun("get", c.obj, "-n", c.ns, "-o", "json")
			var obj map[string]any
			if err := json.Unmarshal([]byte(cur), &obj); err != nil {
				t.Fatal(err)
			}
			c.change(obj)
			changed, _ := json.Marshal(obj)
			_, err := h.RunInput(context.Background(), string(changed), nil, "replace", "-f", "-")
			if err == nil || !strings.Contains(err.Error(), "is invalid") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: want a 422 containing %q, got %v", c.obj, c.want, err)
			}
			if now := h.MustRun("get", c.obj, "-n", c.ns, "-o", "json"); now != cur {
				t.Errorf("%s changed after a refused replace", c.obj)
			}
		}
	})

	t.Run("server-side apply", func(t *testing.T) {
		h.MustRun("create", "namespace", "ssa")
		createDefaultAccounts(t, h, "ssa")
		m := manifests("ssa", true)
		if _, err := h.RunInput(context.Background(), m, nil, "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, h, "pod,deploy,svc,cm,job,pvc", "-n", "ssa")
		// kubectl moves what its client-side apply owned to its
		// server-side manager, then applies again.
		out := kubectlCombined(t, h, m, "apply", "--server-side", "-f", "-")
		if strings.Contains(out, "Warning") || strings.Count(out, "serverside-applied") != 7 {
			t.Errorf("server-side apply after client-side apply:\n%s", out)
		}
		migrated := snapshot(t, h, "pod,deploy,svc,cm,job,pvc", "-n", "ssa")
		// Only who owns what changes, and kubectl's record of what it
		// applied (which a deployment's generation follows).
		for key, obj := range migrated {
			for _, f := range []string{"managedFields", "annotations", "generation"} {
				delete(obj["metadata"].(map[string]any), f)
				delete(before[key]["metadata"].(map[string]any), f)
			}
		}
		sameObjects(t, before, migrated)
		if fields := h.MustRun("get", "pod", "bare", "-n", "ssa", "-o", "jsonpath={.metadata.managedFields[*].manager}"); strings.Contains(fields, "client-side") {
			t.Errorf("managers after the migration: %s", fields)
		}

		// Applying the same manifest again changes nothing, whether the
		// objects were migrated or only ever applied server-side.
		h.MustRun("create", "namespace", "ssa2")
		createDefaultAccounts(t, h, "ssa2")
		m2 := manifests("ssa2", true)
		for _, c := range []struct{ ns, manifest string }{{"ssa", m}, {"ssa2", m2}, {"ssa2", m2}} {
			if _, err := h.RunInput(context.Background(), c.manifest, nil, "apply", "--server-side", "-f", "-"); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range []struct{ ns, manifest string }{{"ssa", m}, {"ssa2", m2}} {
			was := snapshot(t, h, "pod,deploy,svc,cm,job,pvc", "-n", c.ns)
			if _, err := h.RunInput(context.Background(), c.manifest, nil, "apply", "--server-side", "-f", "-"); err != nil {
				t.Fatal(err)
			}
			rv := func() string {
				return h.MustRun("get", "pod,deploy,svc,cm,job,pvc", "-n", c.ns, "-o", "jsonpath={.items[*].metadata.resourceVersion}")
			}
			first := rv()
			if _, err := h.RunInput(context.Background(), c.manifest, nil, "apply", "--server-side", "-f", "-"); err != nil {
				t.Fatal(err)
			}
			if again := rv(); again != first {
				t.Errorf("%s: a repeated server-side apply wrote: resourceVersions %s, then %s", c.ns, first, again)
			}
			sameObjects(t, was, snapshot(t, h, "pod,deploy,svc,cm,job,pvc", "-n", c.ns))
		}
		// The pod applied without a service account, tolerations or
		// priority keeps what admission gave it at create.
		got := h.MustRun("get", "pod", "bare", "-n", "ssa2", "-o",
			`jsonpath={.spec.serviceAccountName} {.spec.priority} {.spec.tolerations[*].key} {.spec.dnsPolicy}`)
		if got != "default 0 node.kubernetes.io/not-ready node.kubernetes.io/unreachable ClusterFirst" {
			t.Errorf("pod after server-side applies: %q", got)
		}
	})
}

// manifests returns objects of several kinds in namespace ns, written as
// users write them: the pods name no priority or tolerations, the service
// no cluster IP or node port. Pod "runner" names its service account and,
// as upstream would mount no token into it, replaces there too. With
// generated, pod "bare" names no service account and job "batch" no
// selector: upstream gives them theirs on create only, so that these two
// cannot be replaced as they were created.
func manifests(ns string, generated bool) string {
	m := `apiVersion: v1
kind: Pod
metadata:
  name: runner
  namespace: NS
spec:
  serviceAccountName: default
  automountServiceAccountToken: false
  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: NS
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: registry.example/web:1.0
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: NS
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - name: http
    port: 80
    targetPort: 8080
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: NS
data:
  mode: fast
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: claim
  namespace: NS
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: local
  resources:
    requests: {storage: 1Gi}
`
	if generated {
		m += `---
apiVersion: v1
kind: Pod
metadata:
  name: bare
  namespace: NS
spec:
  containers:
  - name: main
    image: busybox:1.36
---
apiVersion: batch/v1
kind: Job
metadata:
  name: batch
  namespace: NS
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: work
        image: registry.example/work:1
`
	}
	return strings.ReplaceAll(m, "NS", ns)
}

// getJSON returns `kubectl get ARGS -o json` decoded.
func getJSON(t *testing.T, h *hubtest.Hub, args ...string) map[string]any {
	t.Helper()
	out := h.MustRun(append(append([]string{"get"}, args...), "-o", "json")...)
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("decode kubectl get: %v\n%s", err, out)
	}
	return v
}

// snapshot returns the objects `kubectl get ARGS` lists, by kind,
// namespace and name, without what every write changes: the
// resourceVersion and the times of managedFields entries.
func snapshot(t *testing.T, h *hubtest.Hub, args ...string) map[string]map[string]any {
	t.Helper()
	objs := map[string]map[string]any{}
	for _, it := range getJSON(t, h, args...)["items"].([]any) {
		obj := it.(map[string]any)
		m := obj["metadata"].(map[string]any)
		delete(m, "resourceVersion")
		if mf, ok := m["managedFields"].([]any); ok {
			for _, e := range mf {
				delete(e.(map[string]any), "time")
			}
		}
		ns, _ := m["namespace"].(string)
		objs[obj["kind"].(string)+"/"+ns+"/"+m["name"].(string)] = obj
	}
	if len(objs) == 0 {
		t.Fatalf("kubectl get %s listed nothing", strings.Join(args, " "))
	}
	return objs
}

func sameObjects(t *testing.T, before, after map[string]map[string]any) {
	t.Helper()
	for key, obj := range before {
		if !reflect.DeepEqual(obj, after[key]) {
			a, _ := json.MarshalIndent(obj, "", " ")
			b, _ := json.MarshalIndent(after[key], "", " ")
			t.Errorf("%s changed:\nbefore %s\nafter %s", key, a, b)
		}
	}
	if len(after) != len(before) {
		t.Errorf("%d objects before, %d after", len(before), len(after))
	}
}

// kubectlCombined runs kubectl with stdin and returns what it printed on
// both outputs, failing the test if it fails.
func kubectlCombined(t *testing.T, h *hubtest.Hub, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), h.Kubectl, append([]string{"--cache-dir", h.CacheDir}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+h.Kubeconfig)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
