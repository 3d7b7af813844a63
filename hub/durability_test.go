package hub_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

func clientFor(t *testing.T, h *hubtest.Hub) *kubernetes.Clientset {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, 0 // no client-side throttling
	cfg.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestKillNineKeepsAcknowledgedWrites kills the hub with SIGKILL while
// clients write, restarts it and checks that every write the hub
// acknowledged is there, twenty times over.
func TestKillNineKeepsAcknowledgedWrites(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	rounds := 20
	if testing.Short() {
		rounds = 3
	}
	var lastRV string
	for round := range rounds {
		cs := clientFor(t, h)
		ctx, stop := context.WithCancel(t.Context())
		var (
			mu    sync.Mutex
			acked = map[string]bool{}
			wg    sync.WaitGroup
		)
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					name := fmt.Sprintf("r%d-w%d-%d", round, w, i)
					cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"i": fmt.Sprint(i)}}
					if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
						return // the hub died under us; nothing after this was acknowledged
					}
					mu.Lock()
					acked[name] = true
					mu.Unlock()
				}
			}()
		}
		// Kill while the writers are busy: once the restarted hub has
		// acknowledged a first write (a loaded machine may take a while),
		// after a random further moment.
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			n := len(acked)
			mu.Unlock()
			if n > 0 {
				break
			}
		}
		time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
		h.Kill()
		stop()
		wg.Wait()
		h.Restart()

		cs = clientFor(t, h)
		list, err := cs.CoreV1().ConfigMaps("default").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatalf("round %d: list after restart: %v", round, err)
		}
		have := map[string]bool{}
		for _, cm := range list.Items {
			have[cm.Name] = true
		}
		lost := 0
		for name := range acked {
			if !have[name] {
				lost++
				t.Errorf("round %d: acknowledged configmap %s is gone after kill -9", round, name)
			}
		}
		if len(acked) == 0 {
			t.Errorf("round %d: no write was acknowledged before the kill", round)
		}
		if lastRV != "" && rvLess(list.ResourceVersion, lastRV) {
			t.Errorf("round %d: resourceVersion went backwards: %s after %s", round, list.ResourceVersion, lastRV)
		}
		lastRV = list.ResourceVersion
		t.Logf("round %d: %d acknowledged writes, %d lost, resourceVersion %s", round, len(acked), lost, list.ResourceVersion)
	}
}

func rvLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// TestSecondHubOnDataDirRefused starts a second hub on a running hub's
// data directory: it exits at once with an error that names the first,
// and the first keeps serving. (TestKillNineKeepsAcknowledgedWrites
// restarts hubs on a directory whose hub was killed: the lock goes with
// the process.)
func TestSecondHubOnDataDirRefused(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	h.MustRun("create", "configmap", "first")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, h.Bin, "hub", "--data-dir", h.DataDir, "--listen", "127.0.0.1:0").CombinedOutput()
	want := regexp.MustCompile(`a hub runs on ` + regexp.QuoteMeta(h.DataDir) + ` \(process [1-9][0-9]*\): stop it first`)
	if err == nil || !want.Match(out) {
		t.Fatalf("second hub on the data directory: %v, want an error matching %q\n%s", err, want, out)
	}
	if got := strings.TrimSpace(h.MustRun("get", "configmap", "first", "-o", "name")); got != "configmap/first" {
		t.Fatalf("first hub after the second was refused: %q", got)
	}
}
