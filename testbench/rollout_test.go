package testbench

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/internal/fleetapi"
	"github.com/tether-edge/tether/testbench/images"
)

// Versions of the rollout test's builds.
const (
	rolloutOld    = "v0.0.1-rollout" // what the nodes run, held by the hub
	rolloutNew    = "v0.0.2-rollout" // what the rollout brings
	rolloutStray  = "v0.0.0-rollout" // one node runs it; the hub never held it
	rolloutBroken = "v0.0.3-broken"  // exits as soon as it runs as an agent
)

// TestContainerdEdgeRollout rolls agent upgrades out from the hub across
// two sites of three containerd nodes each (the lab, real containerd,
// pods running), with EdgeUpgrade objects:
//   - to a new build in batches of two: never more than two nodes at
//     once, every node ends on the new version with its agent in the same
//     process and its pod's container the same; nodes running a release
//     the hub holds download a delta, the node running one it never held
//     downloads the whole executable, at the rollout's bandwidth cap, and
//     resumes where it stopped after its uplink was cut mid-download;
//   - to a build that dies at start: the first batch's agents roll back
//     by themselves (the test restarts them as systemd would), the
//     rollout pauses with the failures recorded, and no other node is
//     asked;
//   - to a release whose signature does not match it: the agent refuses
//     it and the rollout records why;
//   - to a version the hub does not hold: 422, nothing stored.
func TestContainerdEdgeRollout(t *testing.T) {
	requireContainerdNode(t)
	dir := t.TempDir()
	bins := map[string]string{}
	for _, v := range []string{rolloutOld, rolloutNew, rolloutStray} {
		bins[v] = buildEdgeAt(t, dir, v)
	}
	bins[rolloutBroken] = buildBrokenEdgeAt(t, dir, rolloutBroken)

	archive := filepath.Join(dir, "test-images.tar")
	if err := images.Build(archive); err != nil {
		t.Fatalf("build test images: %v", err)
	}
	link := LinkParams{Delay: Duration(10 * time.Millisecond)}
	l, err := Up(context.Background(), Config{
		Spec:       Spec{DiskSize: 1024, Sites: []SiteSpec{{Name: "east", Nodes: 3, Link: link}, {Name: "west", Nodes: 3, Link: link}}},
		PlainDisks: true,
		Log:        slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	h := startLabHub(t, l)

	names := []string{"east-n1", "east-n2", "east-n3", "west-n1", "west-n2", "west-n3"}
	const stray = "west-n3"
	nodes := map[string]*ctrNode{}
	for _, name := range names {
		v := rolloutOld
		if name == stray {
			v = rolloutStray
		}
		installed := filepath.Join(dir, name, "tether-edge")
		if err := os.MkdirAll(filepath.Dir(installed), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := copyFileTo(bins[v], installed); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(installed, 0o755); err != nil {
			t.Fatal(err)
		}
		nodes[name] = startCtrNodeFrom(t, l, h, installed, name, strings.Split(name, "-")[0], []string{archive})
	}
	h.waitReady(3*time.Minute, names...)

	// A pod on every node, whose container must outlive the upgrades.
	for _, name := range names {
		h.applyManifest(t, fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: keep-%s}\nspec: {nodeName: %s, containers: [{name: c, image: %s}]}\n",
			name, name, images.Sleeper))
	}
	first := map[string]string{} // node → container ID
	eventually(t, 3*time.Minute, "every keep pod running", func() (bool, string) {
		for _, name := range names {
			p, err := h.pod("keep-" + name)
			if err != nil {
				return false, err.Error()
			}
			cs, ok := containerState(p, "c")
			if !ok || cs.State.Running == nil {
				return false, name + ": " + string(p.Status.Phase)
			}
			first[name] = cs.ContainerID
			nodes[name].track(p)
		}
		return true, ""
	})
	pids := map[string]int{}
	for _, name := range names {
		pids[name] = nodes[name].agentPID()
	}
	podsUnchanged := func(t *testing.T) {
		t.Helper()
		for _, name := range names {
			eventually(t, 60*time.Second, "keep-"+name+" running its first container", func() (bool, string) {
				p, err := h.pod("keep-" + name)
				if err != nil {
					return false, err.Error()
				}
				cs, _ := containerState(p, "c")
				return cs.ContainerID == first[name] && cs.RestartCount == 0 && cs.State.Running != nil,
					fmt.Sprintf("id %s restarts %d", cs.ContainerID, cs.RestartCount)
			})
		}
	}

	// The releases, imported as an operator would.
	for _, v := range []string{rolloutOld, rolloutNew, rolloutBroken} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		out, err := l.Exec(ctx, "hub", h.tether, "release", "import", bins[v], "--kubeconfig", h.kubeconfig())
		cancel()
		if err != nil {
			t.Fatalf("release import %s: %v\n%s", v, err, out)
		}
		t.Logf("imported: %s", strings.TrimSpace(string(out)))
	}

	t.Run("batches", func(t *testing.T) {
		watch := startRolloutWatch(t, h, fleetapi.ReleaseName(rolloutNew, fleetapi.BuildEdge, "amd64"), rolloutNew)
		// The stray node's download is cut once a quarter has come.
		cut := make(chan error, 1)
		go func() {
			cut <- watch.cutWhen(t.Context(), stray, 0.25, func(ctx context.Context) error {
				if err := l.CutNodeUplink(ctx, stray); err != nil {
					return err
				}
				time.Sleep(5 * time.Second)
				return l.RestoreNodeUplink(ctx, stray)
			})
		}()
		began := time.Now()
		h.applyManifest(t, fmt.Sprintf(`apiVersion: fleet.tether.io/v1alpha1
kind: EdgeUpgrade
metadata: {name: to-new}
spec: {version: %s, batchSize: 2, bandwidthLimit: 4Mi, nodeTimeout: 5m}
`, rolloutNew))
		eventually(t, 8*time.Minute, "rollout to-new complete", func() (bool, string) {
			out, _ := h.run("get", "edgeupgrade", "to-new", "-o", "jsonpath={.status.phase} {.status.upgraded}/{.status.nodes} failed={.status.failed}")
			return strings.HasPrefix(out, fleetapi.PhaseComplete+" 6/6"), out
		})
		took := time.Since(began)
		watch.stop()
		if err := <-cut; err != nil {
			t.Errorf("cutting %s's download: %v", stray, err)
		}
		t.Logf("6 nodes upgraded in %v; nodes upgrading at once, in order: %v", took.Round(time.Second), watch.concurrency)
		if m := slices.Max(watch.concurrency); m != 2 {
			t.Errorf("at most %d nodes upgraded at once, want 2 (batch size)", m)
		}
		for _, name := range names {
			if v := watch.kubeletVersion(name); v != edge.KubeletVersion(rolloutNew) {
				t.Errorf("%s reports %s", name, v)
			}
			if got := nodes[name].agentPID(); got != pids[name] {
				t.Errorf("%s: agent process %d, was %d", name, got, pids[name])
			}
		}
		podsUnchanged(t)

		// What travelled: deltas, and the stray node's whole executable
		// resumed after the cut.
		full := fileSize(t, bins[rolloutNew])
		var deltaBytes, eastBytes int64
		for _, name := range names {
			d := downloadLog(t, nodes[name])
			if strings.HasPrefix(name, "east-") {
				eastBytes += d.transferred
			}
			switch {
			case name == stray:
				if d.delta || d.resumedAt == 0 {
					t.Errorf("%s: %+v, want the whole executable, resumed after the cut", name, d)
				}
				if d.transferred > full+full/20 {
					t.Errorf("%s received %d bytes for an executable of %d: the download started over", name, d.transferred, full)
				}
				t.Logf("%s: whole executable, %d bytes received, resumed at %d", name, d.transferred, d.resumedAt)
			case !d.delta:
				t.Errorf("%s downloaded the whole executable, not a delta", name)
			default:
				deltaBytes = d.size
			}
		}
		t.Logf("delta %s → %s: %d bytes; the executable: %d bytes (%.2f%%)", rolloutOld, rolloutNew, deltaBytes, full, 100*float64(deltaBytes)/float64(full))
		benchfmt.Report(t, benchfmt.Figure{Name: "fleet_upgrade_wan_bytes_per_node", Value: float64(deltaBytes), Unit: "bytes",
			Target: "ratio<=0.1", Peer: "copy_executable", PeerValue: float64(full), Mode: "short",
			Extra: []string{"from=" + rolloutOld, "to=" + rolloutNew}})
		// A site of three nodes, each of which downloaded its delta.
		benchfmt.Report(t, benchfmt.Figure{Name: "fleet_upgrade_wan_bytes_site3", Value: float64(eastBytes), Unit: "bytes",
			Target: "ratio<=0.1", Peer: "copy_executable", PeerValue: float64(3 * full), Mode: "short",
			Extra: []string{"from=" + rolloutOld, "to=" + rolloutNew}})
		benchfmt.Report(t, benchfmt.Figure{Name: "fleet_rollout_6_nodes_batch2", Value: took.Seconds(), Unit: "s", Mode: "short"})
	})

	t.Run("rolled back pauses", func(t *testing.T) {
		h.applyManifest(t, fmt.Sprintf(`apiVersion: fleet.tether.io/v1alpha1
kind: EdgeUpgrade
metadata: {name: to-broken}
spec: {version: %s, batchSize: 2, failureThreshold: 0}
`, rolloutBroken))
		// The broken agent exits at once; Restart=always brings the
		// installed one back, which finds the trial and rolls it back.
		var wg sync.WaitGroup
		for _, name := range names[:2] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := nodes[name]
				if !n.waitAgentExit(3 * time.Minute) {
					t.Errorf("%s's agent did not exit into the broken build", name)
					return
				}
				if err := n.agent.Restart(); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		eventually(t, 3*time.Minute, "rollout to-broken paused", func() (bool, string) {
			out, _ := h.run("get", "edgeupgrade", "to-broken", "-o", "jsonpath={.status.phase} failed={.status.failed} {.status.failures[*].reason}")
			return strings.HasPrefix(out, fleetapi.PhasePaused) && strings.Contains(out, fleetapi.ReasonRolledBack), out
		})
		out := h.mustRun("get", "edgeupgrade", "to-broken", "-o", "jsonpath={.status.failures[*].node} {.status.failures[*].message}")
		t.Logf("failures: %s", out)
		// The rollout pauses at the first failure recorded, which may
		// be either node of the batch.
		if !strings.Contains(out, names[0]) && !strings.Contains(out, names[1]) {
			t.Errorf("failures name neither %s nor %s: %s", names[0], names[1], out)
		}
		h.waitReady(2*time.Minute, names...)
		for _, name := range names[2:] {
			if ann := nodeAnnotation(t, h, name, fleetapi.AnnotationRelease); strings.Contains(ann, "broken") {
				t.Errorf("%s was asked for the broken release after the rollout paused", name)
			}
		}
		for _, name := range names {
			out, _ := h.run("get", "node", name, "-o", "jsonpath={.status.nodeInfo.kubeletVersion}")
			if out != edge.KubeletVersion(rolloutNew) {
				t.Errorf("%s reports %s", name, out)
			}
		}
		podsUnchanged(t)
	})

	t.Run("forged release refused", func(t *testing.T) {
		// A Release claiming another version with the new build's bytes
		// and signature: the signature covers the version, so it fails.
		var rel fleetapi.Release
		raw := h.mustRun("get", "release", fleetapi.ReleaseName(rolloutNew, fleetapi.BuildEdge, "amd64"), "-o", "json")
		if err := json.Unmarshal([]byte(raw), &rel); err != nil {
			t.Fatal(err)
		}
		forged := rel.Spec
		forged.Version = "v0.0.9-forged"
		b, _ := json.Marshal(map[string]any{
			"apiVersion": fleetapi.Group + "/" + fleetapi.Version, "kind": "Release",
			"metadata": map[string]any{"name": fleetapi.ReleaseName(forged.Version, fleetapi.BuildEdge, "amd64"),
				"labels": map[string]string{fleetapi.LabelVersion: forged.Version, fleetapi.LabelArch: "amd64", fleetapi.LabelBuild: fleetapi.BuildEdge}},
			"spec": forged,
		})
		h.applyManifest(t, string(b))
		h.applyManifest(t, `apiVersion: fleet.tether.io/v1alpha1
kind: EdgeUpgrade
metadata: {name: to-forged}
spec: {version: v0.0.9-forged, nodeSelector: {matchLabels: {kubernetes.io/hostname: east-n3}}}
`)
		eventually(t, 2*time.Minute, "rollout to-forged records the refusal", func() (bool, string) {
			out, _ := h.run("get", "edgeupgrade", "to-forged", "-o", "jsonpath={.status.failures[*].reason}: {.status.failures[*].message}")
			return strings.Contains(out, fleetapi.ReasonRefused) && strings.Contains(out, "signature"), out
		})
		out, _ := h.run("get", "node", "east-n3", "-o", "jsonpath={.status.nodeInfo.kubeletVersion}")
		if out != edge.KubeletVersion(rolloutNew) {
			t.Errorf("east-n3 reports %s", out)
		}
	})

	t.Run("unknown version", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "eu.yaml")
		os.WriteFile(f, []byte("apiVersion: fleet.tether.io/v1alpha1\nkind: EdgeUpgrade\nmetadata: {name: to-nowhere}\nspec: {version: v9.9.9}\n"), 0o644)
		out, err := h.run("apply", "-f", f)
		if err == nil || !strings.Contains(out, "spec.version") {
			t.Errorf("an EdgeUpgrade to a version the hub lacks: %v\n%s", err, out)
		}
		if out, err := h.run("get", "edgeupgrade", "to-nowhere"); err == nil {
			t.Errorf("stored anyway: %s", out)
		}
	})
}

// buildBrokenEdgeAt builds the edge executable with one more file, laid
// over the sources, that makes the agent exit as soon as it starts (while
// `version` still answers): a release with a defect its staging cannot
// see.
func buildBrokenEdgeAt(t *testing.T, dir, version string) string {
	t.Helper()
	src := filepath.Join(dir, "broken.go")
	code := "package main\n\nimport \"os\"\n\nfunc init() {\n\tif len(os.Args) > 1 && os.Args[1] == \"edge\" {\n\t\tos.Stderr.WriteString(\"broken build: exiting\\n\")\n\t\tos.Exit(3)\n\t}\n}\n"
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, "overlay.json")
	b, _ := json.Marshal(map[string]any{"Replace": map[string]string{
		filepath.Join(hubtest.RepoRoot(), "cmd", "tether", "zz_broken_test_build.go"): src}})
	if err := os.WriteFile(overlay, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "tether-edge-"+version)
	cmd := exec.Command("go", "build", "-overlay", overlay, "-tags", "edge", "-ldflags", "-s -w -X main.version="+version, "-o", out, "./cmd/tether")
	cmd.Dir = hubtest.RepoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the broken executable: %v\n%s", err, b)
	}
	return out
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func nodeAnnotation(t *testing.T, h *labHub, node, key string) string {
	t.Helper()
	out, _ := h.run("get", "node", node, "-o", "jsonpath={.metadata.annotations}")
	var ann map[string]string
	_ = json.Unmarshal([]byte(out), &ann)
	return ann[key]
}

// download is what an agent's log says of its last upgrade download.
type download struct {
	delta                        bool
	size, transferred, resumedAt int64
}

var downloadLine = regexp.MustCompile(`msg="upgrade downloaded".* delta=(\w+) size=(\d+) transferred=(\d+) resumedAt=(\d+)`)

func downloadLog(t *testing.T, n *ctrNode) download {
	t.Helper()
	b, err := os.ReadFile(n.agent.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	m := downloadLine.FindAllStringSubmatch(string(b), -1)
	if len(m) == 0 {
		t.Errorf("%s's log has no finished upgrade download", n.name)
		return download{}
	}
	last := m[len(m)-1]
	num := func(s string) int64 { v, _ := strconv.ParseInt(s, 10, 64); return v }
	return download{delta: last[1] == "true", size: num(last[2]), transferred: num(last[3]), resumedAt: num(last[4])}
}

// rolloutWatch follows the nodes while a rollout runs: how many are
// asked for the release and not yet running it, at each change.
type rolloutWatch struct {
	h       *labHub
	release string
	version string
	done    chan struct{}
	stopped chan struct{}

	mu          sync.Mutex
	concurrency []int
	nodes       map[string]corev1.Node
}

func startRolloutWatch(t *testing.T, h *labHub, release, version string) *rolloutWatch {
	w := &rolloutWatch{h: h, release: release, version: version, done: make(chan struct{}), stopped: make(chan struct{}), nodes: map[string]corev1.Node{}}
	go func() {
		defer close(w.stopped)
		last := -1
		for {
			select {
			case <-w.done:
				return
			case <-time.After(200 * time.Millisecond):
			}
			out, err := h.run("get", "nodes", "-o", "json")
			if err != nil {
				continue
			}
			var list corev1.NodeList
			if json.Unmarshal([]byte(out), &list) != nil {
				continue
			}
			busy := 0
			w.mu.Lock()
			for _, n := range list.Items {
				w.nodes[n.Name] = n
				if n.Annotations[fleetapi.AnnotationRelease] == release && n.Status.NodeInfo.KubeletVersion != edge.KubeletVersion(version) {
					busy++
				}
			}
			if busy != last {
				w.concurrency = append(w.concurrency, busy)
				last = busy
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *rolloutWatch) stop() {
	close(w.done)
	<-w.stopped
}

func (w *rolloutWatch) kubeletVersion(node string) string {
	out, _ := w.h.run("get", "node", node, "-o", "jsonpath={.status.nodeInfo.kubeletVersion}")
	return out
}

var progressRE = regexp.MustCompile(`([\d.]+) of ([\d.]+) MB`)

// cutWhen runs cut once node's AgentUpgrade condition shows its download
// past fraction.
func (w *rolloutWatch) cutWhen(ctx context.Context, node string, fraction float64, cut func(context.Context) error) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.done:
			return fmt.Errorf("the rollout ended before %s's download passed %.0f%%", node, 100*fraction)
		case <-time.After(100 * time.Millisecond):
		}
		w.mu.Lock()
		n := w.nodes[node]
		w.mu.Unlock()
		for _, c := range n.Status.Conditions {
			if c.Type != fleetapi.ConditionAgentUpgrade || c.Reason != fleetapi.ReasonDownloading {
				continue
			}
			m := progressRE.FindStringSubmatch(c.Message)
			if m == nil {
				continue
			}
			done, _ := strconv.ParseFloat(m[1], 64)
			size, _ := strconv.ParseFloat(m[2], 64)
			if size > 0 && done/size >= fraction && done < size {
				return cut(ctx)
			}
		}
	}
}
