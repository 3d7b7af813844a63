package hub_test

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/internal/fleetapi"
)

var rolloutBenchFull = flag.Bool("rolloutbench.full", false,
	"TestRolloutOfSimAgents with 50 agents in batches of 10 (default: 10 in batches of 5)")

// TestRolloutOfSimAgents times an EdgeUpgrade across agents with the
// simulated runtime, each its own process run from its own installed
// executable, as a fleet's nodes are: every agent downloads its delta
// through its tunnel, stages it, execs it and commits it after the
// settling time, in batches. It reports the time from the rollout's
// creation to its Complete phase.
func TestRolloutOfSimAgents(t *testing.T) {
	if testing.Short() {
		t.Skip("starts agent processes and builds two agent executables")
	}
	nodes, batch := 10, 5
	if *rolloutBenchFull {
		nodes, batch = 50, 10
	}
	dir := t.TempDir()
	bins := map[string]string{}
	for _, v := range []string{"v0.0.1-bench", "v0.0.2-bench"} {
		bins[v] = filepath.Join(dir, "tether-edge-"+v)
		cmd := exec.Command("go", "build", "-tags", "edge", "-ldflags", "-s -w -X main.version="+v, "-o", bins[v], "./cmd/tether")
		cmd.Dir = hubtest.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", v, err, out)
		}
	}
	h := hubtest.Start(t)
	for _, v := range []string{"v0.0.1-bench", "v0.0.2-bench"} {
		if out, err := exec.Command(h.Bin, "release", "import", bins[v], "--kubeconfig", h.Kubeconfig).CombinedOutput(); err != nil {
			t.Fatalf("release import: %v\n%s", err, out)
		}
	}
	out, err := exec.Command(h.Bin, "token", "create", "--kubeconfig", h.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("tether token create: %v", err)
	}
	token := strings.TrimSpace(string(out))
	for i := range nodes {
		name := fmt.Sprintf("sim-%02d", i)
		home := filepath.Join(dir, name)
		if err := os.MkdirAll(home, 0o755); err != nil {
			t.Fatal(err)
		}
		// One file on disk for all: an upgrade renames its new
		// executable over the link, leaving the others alone.
		installed := filepath.Join(home, "tether-edge")
		if err := os.Link(bins["v0.0.1-bench"], installed); err != nil {
			t.Fatal(err)
		}
		startSimAgent(t, installed, h, token, name, filepath.Join(home, "data"))
	}
	waitFleet(t, fmt.Sprintf("%d nodes ready", nodes), 3*time.Minute, func() bool { return readyNodes(h) == nodes })

	began := time.Now()
	manifest := filepath.Join(dir, "rollout.yaml")
	if err := os.WriteFile(manifest, fmt.Appendf(nil, "apiVersion: fleet.tether.io/v1alpha1\nkind: EdgeUpgrade\nmetadata: {name: bench}\nspec: {version: v0.0.2-bench, batchSize: %d}\n", batch), 0o644); err != nil {
		t.Fatal(err)
	}
	h.MustRun("apply", "-f", manifest)
	deadline := time.Now().Add(time.Duration(nodes) * time.Minute)
	for {
		out, _ := h.Run("get", "edgeupgrade", "bench", "-o", "jsonpath={.status.phase} {.status.upgraded}/{.status.nodes} failed={.status.failed}")
		if strings.HasPrefix(out, fmt.Sprintf("%s %d/%d", fleetapi.PhaseComplete, nodes, nodes)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rollout did not complete: %s", out)
		}
		time.Sleep(250 * time.Millisecond)
	}
	took := time.Since(began)
	out2 := h.MustRun("get", "nodes", "-o", "jsonpath={range .items[*]}{.status.nodeInfo.kubeletVersion}{\"\\n\"}{end}")
	if n := strings.Count(out2, edge.KubeletVersion("v0.0.2-bench")); n != nodes {
		t.Errorf("%d of %d nodes report the new version:\n%s", n, nodes, out2)
	}
	t.Logf("%d agents upgraded in batches of %d in %v", nodes, batch, took.Round(100*time.Millisecond))
	benchfmt.Report(t, benchfmt.Figure{Name: fmt.Sprintf("fleet_rollout_%d_sim_agents_batch%d", nodes, batch), Value: took.Seconds(), Unit: "s",
		Mode: benchfmt.Mode(*rolloutBenchFull)})
}

// startSimAgent runs a sim agent from the executable bin, joined through
// h, with extra flags, stopped when the test ends.
func startSimAgent(t *testing.T, bin string, h *hubtest.Hub, token, name, dir string, extra ...string) {
	t.Helper()
	args := append([]string{"edge", "--hub", "https://" + h.Addr, "--token", token, "--data-dir", dir, "--name", name,
		"--runtime", "sim", "--watch-services=false", "--metrics-period", "0"}, extra...)
	cmd := exec.Command(bin, args...)
	logf, err := os.Create(dir + ".log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(dir + ".log")
			t.Logf("%s's log:\n%s", name, b)
		}
	})
}
