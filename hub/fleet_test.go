package hub_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/store/postgres/pgtest"
)

// TestFleetFailover runs three hubs on one PostgreSQL database and 20 sim
// edges spread over them. The edges learn the fleet; logs and exec reach a
// node through a hub that does not hold its tunnel; every hub judges every
// node alive. Then one hub is killed (SIGKILL): its edges must be on the
// others within 10s, without a single LIST (their watches resume from
// their resourceVersions), and the nodes stay Ready throughout.
func TestFleetFailover(t *testing.T) {
	const edges = 20
	pg := pgtest.Start(t)
	dsn := pg.NewDatabase()
	// A short idle timeout: edges notice a silently dead hub within 6s.
	common := []string{"--datastore", dsn, "--tunnel-idle-timeout", "6s", "--disable-scheduler", "--disable-metrics-api"}
	h1 := hubtest.Start(t, append(common, "--controllers=nodelifecycle,serviceaccount,garbagecollector,namespace")...)
	h2 := hubtest.StartPeer(t, h1, append(common, "--controllers=garbagecollector")...)
	h3 := hubtest.StartPeer(t, h1, append(common, "--controllers=garbagecollector")...)
	hubs := []*hubtest.Hub{h1, h2, h3}

	out, err := exec.Command(h1.Bin, "token", "create", "--kubeconfig", h1.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("tether token create: %v", err)
	}
	token := strings.TrimSpace(string(out))
	dirs := make([]string, edges)
	for i := range edges {
		name := fmt.Sprintf("fleet-%02d", i)
		dirs[i] = filepath.Join(t.TempDir(), name)
		startFleetEdge(t, hubs[i%3], token, name, dirs[i])
	}
	waitFleet(t, "20 Ready nodes", 90*time.Second, func() bool {
		return readyNodes(h1) == edges
	})
	// Each edge learns the three hubs and keeps them.
	waitFleet(t, "every edge knows the three hubs", 30*time.Second, func() bool {
		for _, d := range dirs {
			b, err := os.ReadFile(filepath.Join(d, "hubs.json"))
			var l struct{ Hubs []struct{ Tunnel string } }
			if err != nil || json.Unmarshal(b, &l) != nil || len(l.Hubs) != 3 {
				return false
			}
		}
		return true
	})
	// Every hub serves every node's Lease renewed, whichever holds it.
	for _, h := range hubs {
		waitFleet(t, "fresh node leases on "+h.Addr, 20*time.Second, func() bool {
			return freshLeases(t, h) == edges
		})
	}

	// Logs and exec through a hub that does not hold the node's tunnel:
	// fleet-01 dialed h2.
	waitFleet(t, "the default service account", 30*time.Second, func() bool {
		_, err := h1.Run("get", "serviceaccount", "default")
		return err == nil
	})
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"far","annotations":{"sim.tether.dev/log-interval":"50ms"}},
		"spec":{"nodeName":"fleet-01","containers":[{"name":"c","image":"sim"}]}}`
	if out, err := h1.RunInput(t.Context(), pod, nil, "create", "-f", "-"); err != nil {
		t.Fatalf("create pod: %v\n%s", err, out)
	}
	waitFleet(t, "pod far running", 30*time.Second, func() bool {
		out, _ := h1.Run("get", "pod", "far", "-o", "jsonpath={.status.phase}")
		return out == "Running"
	})
	for _, h := range []*hubtest.Hub{h1, h3} {
		waitFleet(t, "kubectl logs through "+h.Addr, 20*time.Second, func() bool {
			out, err := h.Run("logs", "far", "--tail=2")
			return err == nil && strings.TrimSpace(out) != ""
		})
		_, err := h.Run("exec", "far", "--", "true")
		if err == nil || !strings.Contains(err.Error(), "no processes") {
			t.Fatalf("kubectl exec through %s: want the sim runtime's refusal from the node, got %v", h.Addr, err)
		}
	}

	lists := edgeLists(t, h1, edges)
	onH2 := sessions(t, h2)
	if onH2 == 0 {
		t.Fatal("no edge on the hub to kill")
	}
	t.Logf("%d edges on the hub to kill; LISTs so far %v", onH2, lists)

	killed := time.Now()
	h2.Kill()
	var moved time.Duration
	notReady := 0
	waitFleet(t, "every edge on the surviving hubs", 30*time.Second, func() bool {
		if readyNodes(h1) != edges {
			notReady++
		}
		if sessions(t, h1)+sessions(t, h3) == edges {
			moved = time.Since(killed)
			return true
		}
		return false
	})
	t.Logf("the %d edges of the killed hub were on the others %v after the kill (load average %s)", onH2, moved.Round(10*time.Millisecond), loadavg())
	if moved > 10*time.Second {
		t.Errorf("edges took %v to move, want at most 10s", moved)
	}
	// The nodes stay Ready a while longer, judged on h1 and h3.
	for range 10 {
		if readyNodes(h1) != edges || readyNodes(h3) != edges {
			notReady++
		}
		time.Sleep(300 * time.Millisecond)
	}
	if notReady > 0 {
		t.Errorf("nodes not all Ready in %d checks after the kill", notReady)
	}
	after := edgeLists(t, h3, edges)
	relists := 0
	for n, c := range after {
		relists += c - lists[n]
	}
	t.Logf("full relists after the move: %d", relists)
	if relists != 0 {
		t.Errorf("edges listed %d times after moving hubs (before %v, after %v)", relists, lists, after)
	}
	if out, err := h3.Run("logs", "far", "--tail=1"); err != nil || strings.TrimSpace(out) == "" {
		t.Errorf("kubectl logs after the move: %v %q", err, out)
	}
}

// startFleetEdge runs a sim edge joined through h.
func startFleetEdge(t *testing.T, h *hubtest.Hub, token, name, dir string) {
	t.Helper()
	cmd := exec.Command(h.Bin, "edge", "--hub", "https://"+h.Addr, "--token", token, "--data-dir", dir, "--name", name,
		"--runtime", "sim", "--sim-start-delay", "100ms", "--watch-services=false", "--metrics-period", "0")
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
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("%s log:\n%s", name, b)
		}
	})
}

func waitFleet(t *testing.T, what string, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// readyNodes counts the nodes h says are Ready.
func readyNodes(h *hubtest.Hub) int {
	out, _ := h.Run("get", "nodes", "-o", `jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}`)
	return strings.Count(out, "True")
}

// freshLeases counts the node Leases h serves renewed within 20s.
func freshLeases(t *testing.T, h *hubtest.Hub) int {
	out, err := h.Run("-n", "kube-node-lease", "get", "leases", "-o", `jsonpath={range .items[*]}{.spec.renewTime}{" "}{end}`)
	if err != nil {
		return 0
	}
	n := 0
	for _, f := range strings.Fields(out) {
		if at, err := time.Parse(time.RFC3339Nano, f); err == nil && time.Since(at) < 20*time.Second {
			n++
		}
	}
	return n
}

var sessionsRE = regexp.MustCompile(`(?m)^tether_tunnel_sessions (\d+)$`)

// sessions reads the edge tunnels h holds from its metrics.
func sessions(t *testing.T, h *hubtest.Hub) int {
	out, err := h.Run("get", "--raw", "/metrics")
	if err != nil {
		return 0
	}
	m := sessionsRE.FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

var listsRE = regexp.MustCompile(`(?m)^tether_edge_api_requests_total\{kind="list"\} (\d+)$`)

// edgeLists reads each edge's LIST count through h (node proxy: through
// whichever hub holds the node's tunnel).
func edgeLists(t *testing.T, h *hubtest.Hub, edges int) map[string]int {
	t.Helper()
	lists := map[string]int{}
	for i := range edges {
		name := fmt.Sprintf("fleet-%02d", i)
		var out string
		waitFleet(t, "metrics of "+name, 20*time.Second, func() bool {
			var err error
			out, err = h.Run("get", "--raw", "/api/v1/nodes/"+name+"/proxy/metrics")
			return err == nil
		})
		m := listsRE.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no list counter in %s's metrics", name)
		}
		lists[name], _ = strconv.Atoi(m[1])
	}
	return lists
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
