package testbench

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/testbench/images"
)

// upgradeVersion is the version the upgrade test builds its new agent as.
const upgradeVersion = "v0.0.0-upgrade-test"

// TestContainerdEdgeUpgrade replaces a containerd node's agent in place
// with `tether edge upgrade`, from the node's installed executable (in a
// directory of its own, as `tether install edge` puts it) to the
// edge-only build at another version:
//   - installed: the agent restarts into the new executable in the same
//     process, the pod's container is the same (ID, task PID, restart
//     count), the Node reports the new version, and the new executable is
//     the installed one with the old one kept beside it;
//   - crash: a new executable that exits at once takes the agent down; the
//     service manager (the test here) starts the installed executable,
//     which records the roll back; the installed file never changed;
//   - unhealthy: a new agent that cannot reach the hub (the node's uplink
//     is cut during its trial) is replaced by the installed executable in
//     the same process once its time is up;
//   - previous: --previous goes back to the first executable the same way;
//   - bundle: `tether bundle create` packs the images and the new
//     executable; the node imports the images and upgrades from it.
//
// The pod runs throughout.
func TestContainerdEdgeUpgrade(t *testing.T) {
	requireContainerdNode(t)
	dir := t.TempDir()
	next := buildEdgeAt(t, dir, upgradeVersion)
	l, h, archive := upCtrLab(t, dir, 1024, SiteSpec{Name: "shop", Nodes: 1, Link: LinkParams{Delay: Duration(5 * time.Millisecond)}})
	installed := filepath.Join(dir, "bin", "tether")
	if err := os.Mkdir(filepath.Dir(installed), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyFileTo(h.tether, installed); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(installed, 0o755); err != nil {
		t.Fatal(err)
	}
	old := sha256File(t, installed)
	n := startCtrNodeFrom(t, l, h, installed, "shop-n1", "shop", []string{archive})
	h.waitReady(90*time.Second, "shop-n1")
	h.applyManifest(t, fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: keeper}\nspec: {containers: [{name: c, image: %s}]}\n", images.Sleeper))
	var pod *corev1.Pod
	eventually(t, 90*time.Second, "pod keeper running", func() (bool, string) {
		p, err := h.pod("keeper")
		if err != nil {
			return false, err.Error()
		}
		pod = p
		cs, ok := containerState(p, "c")
		return ok && cs.State.Running != nil && cs.Ready, string(p.Status.Phase)
	})
	n.track(pod)
	first, _ := containerState(pod, "c")
	task := func() ctrContainer {
		t.Helper()
		cs, err := n.containers()
		if err != nil {
			t.Fatal(err)
		}
		c, _, ok := latestInstance(cs, pod.UID, "c")
		if !ok {
			t.Fatalf("no container c of keeper on the node: %v", cs)
		}
		return c
	}
	firstTask := task()
	// podUnchanged checks that the pod's container is the one it was.
	podUnchanged := func(t *testing.T) {
		t.Helper()
		eventually(t, 30*time.Second, "keeper running its first container", func() (bool, string) {
			p, err := h.pod("keeper")
			if err != nil {
				return false, err.Error()
			}
			cs, _ := containerState(p, "c")
			return cs.ContainerID == first.ContainerID && cs.RestartCount == first.RestartCount && cs.Ready,
				fmt.Sprintf("id %s restarts %d ready %v", cs.ContainerID, cs.RestartCount, cs.Ready)
		})
		if c := task(); c.ID != firstTask.ID || c.PID != firstTask.PID || c.Status != "RUNNING" {
			t.Errorf("keeper's task: %+v, was %+v", c, firstTask)
		}
	}
	// nodeEvent waits for an event of the node with the reason whose
	// message holds want.
	nodeEvent := func(t *testing.T, reason, want string) {
		t.Helper()
		eventually(t, 30*time.Second, "a "+reason+" event of shop-n1", func() (bool, string) {
			out, err := h.run("get", "events", "-n", "default", "--field-selector",
				"involvedObject.kind=Node,involvedObject.name=shop-n1,reason="+reason, "-o", "jsonpath={.items[*].message}")
			return err == nil && strings.Contains(out, want), out
		})
	}
	kubeletVersion := func() string {
		out, _ := h.run("get", "node", "shop-n1", "-o", "jsonpath={.status.nodeInfo.kubeletVersion}")
		return out
	}
	// upgrade runs `tether edge upgrade` on the node's host.
	upgrade := func(bin string, extra ...string) (string, error) {
		args := append([]string{"edge", "upgrade", "--binary", bin, "--data-dir", n.data}, extra...)
		out, err := exec.Command(h.tether, args...).CombinedOutput()
		return string(out), err
	}
	pid := n.agentPID()
	if pid == 0 {
		t.Fatal("no agent process")
	}

	t.Run("installed", func(t *testing.T) {
		began := time.Now()
		out, err := upgrade(next, "--sha256", sha256File(t, next))
		if err != nil || !strings.Contains(out, "installed "+upgradeVersion) {
			t.Fatalf("upgrade: %v\n%s", err, out)
		}
		t.Logf("upgrade installed in %v:\n%s", time.Since(began).Round(time.Millisecond), out)
		if got := n.agentPID(); got != pid {
			t.Errorf("agent process %d, was %d: the service manager would have seen a restart", got, pid)
		}
		if d := sha256File(t, installed); d != sha256File(t, next) {
			t.Error("the installed executable is not the new one")
		}
		if d := sha256File(t, filepath.Join(filepath.Dir(installed), ".tether.previous")); d != old {
			t.Error("the previous executable was not kept")
		}
		want := edge.KubeletVersion(upgradeVersion)
		eventually(t, 30*time.Second, "the node reporting "+want, func() (bool, string) {
			v := kubeletVersion()
			return v == want, v
		})
		nodeEvent(t, "AgentUpgraded", upgradeVersion)
		podUnchanged(t)
	})

	t.Run("crash", func(t *testing.T) {
		bad := filepath.Join(dir, "crashing")
		script := "#!/bin/sh\nif [ \"$1\" = version ]; then echo 'tether v0.0.0-crash (test)'; exit 0; fi\necho 'crashing at start' >&2\nexit 3\n"
		if err := os.WriteFile(bad, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		type result struct {
			out string
			err error
		}
		done := make(chan result, 1)
		go func() {
			out, err := upgrade(bad)
			done <- result{out, err}
		}()
		if !n.waitAgentExit(60 * time.Second) {
			t.Fatal("the agent did not exit into the crashing executable")
		}
		// Restart=always: the installed executable starts again.
		if err := n.agent.Restart(); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err == nil || !strings.Contains(r.out, "rolled back v0.0.0-crash") || !strings.Contains(r.out, "stopped before it became healthy") {
			t.Fatalf("upgrade: %v\n%s", r.err, r.out)
		}
		if d := sha256File(t, installed); d != sha256File(t, next) {
			t.Error("the installed executable changed")
		}
		h.waitReady(60*time.Second, "shop-n1")
		if v := kubeletVersion(); v != edge.KubeletVersion(upgradeVersion) {
			t.Errorf("node reports %s", v)
		}
		nodeEvent(t, "AgentUpgradeRolledBack", "v0.0.0-crash")
		podUnchanged(t)
		pid = n.agentPID()
	})

	t.Run("unhealthy", func(t *testing.T) {
		ctx := t.Context()
		type result struct {
			out string
			err error
		}
		done := make(chan result, 1)
		go func() {
			out, err := upgrade(h.tether, "--timeout", "15s")
			done <- result{out, err}
		}()
		// Once the agent took the request up (connected: the new agent
		// must connect too), the node loses its way to the hub.
		trial := filepath.Join(n.data, "upgrade", "trial.json")
		eventually(t, 30*time.Second, "the trial to start", func() (bool, string) {
			_, err := os.Stat(trial)
			return err == nil, fmt.Sprint(err)
		})
		if err := l.CutNodeUplink(ctx, "shop-n1"); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if err := l.RestoreNodeUplink(ctx, "shop-n1"); err != nil {
			t.Fatal(err)
		}
		if r.err == nil || !strings.Contains(r.out, "rolled back") || !strings.Contains(r.out, "not healthy") {
			t.Fatalf("upgrade: %v\n%s", r.err, r.out)
		}
		if got := n.agentPID(); got != pid {
			t.Errorf("agent process %d, was %d", got, pid)
		}
		if d := sha256File(t, installed); d != sha256File(t, next) {
			t.Error("the installed executable changed")
		}
		// The installed executable started afresh: its first dials
		// after the restore are not held back by a long backoff.
		start := time.Now()
		eventually(t, 90*time.Second, "shop-n1 connected to the hub", func() (bool, string) {
			out, err := h.run("get", "--raw", "/api/v1/nodes/shop-n1/proxy/healthz")
			return err == nil, out
		})
		t.Logf("shop-n1 reconnected %v after its uplink was restored", time.Since(start).Round(time.Second))
		if v := kubeletVersion(); v != edge.KubeletVersion(upgradeVersion) {
			t.Errorf("node reports %s", v)
		}
		nodeEvent(t, "AgentUpgradeRolledBack", "not healthy")
		podUnchanged(t)
	})

	t.Run("previous", func(t *testing.T) {
		// Back to the executable the first upgrade replaced, in the same
		// way.
		out, err := exec.Command(h.tether, "edge", "upgrade", "--previous", "--data-dir", n.data).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "installed ") {
			t.Fatalf("upgrade --previous: %v\n%s", err, out)
		}
		if got := n.agentPID(); got != pid {
			t.Errorf("agent process %d, was %d", got, pid)
		}
		if d := sha256File(t, installed); d != old {
			t.Error("the installed executable is not the first one again")
		}
		if d := sha256File(t, filepath.Join(filepath.Dir(installed), ".tether.previous")); d != sha256File(t, next) {
			t.Error("the replaced executable was not kept")
		}
		eventually(t, 30*time.Second, "the node reporting the first version again", func() (bool, string) {
			v := kubeletVersion()
			return v != "" && v != edge.KubeletVersion(upgradeVersion), v
		})
		podUnchanged(t)
	})

	t.Run("bundle", func(t *testing.T) {
		// An air-gapped site: images and the release in one bundle.
		b := filepath.Join(dir, "site.bundle")
		out, err := exec.Command(h.tether, "bundle", "create", "-o", b, "--release", next, archive).CombinedOutput()
		if err != nil {
			t.Fatalf("bundle create: %v\n%s", err, out)
		}
		out, err = exec.Command(h.tether, "edge", "images", "import", "--containerd-address", n.sock, b).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "imported ") {
			t.Fatalf("images import of the bundle: %v\n%s", err, out)
		}
		out, err = exec.Command(h.tether, "edge", "upgrade", "--binary", b, "--data-dir", n.data).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "installed "+upgradeVersion) {
			t.Fatalf("upgrade from the bundle: %v\n%s", err, out)
		}
		if d := sha256File(t, installed); d != sha256File(t, next) {
			t.Error("the installed executable is not the bundle's")
		}
		eventually(t, 30*time.Second, "the node reporting "+upgradeVersion, func() (bool, string) {
			v := kubeletVersion()
			return v == edge.KubeletVersion(upgradeVersion), v
		})
		podUnchanged(t)
	})
}

// buildEdgeAt builds the edge-only executable, stripped, as releases are,
// stamped with version. Without -trimpath it reuses the packages the tests
// (and CI's release tarball) compiled: only the link is new.
func buildEdgeAt(t *testing.T, dir, version string) string {
	t.Helper()
	out := filepath.Join(dir, "tether-edge-"+version)
	cmd := exec.Command("go", "build", "-tags", "edge", "-ldflags", "-s -w -X main.version="+version, "-o", out, "./cmd/tether")
	cmd.Dir = hubtest.RepoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the edge executable: %v\n%s", err, b)
	}
	return out
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
