package edge_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/sim"
	"github.com/tether-edge/tether/edge/state"
)

// These tests cover the agent's autonomy: what it runs is kept in its local
// state, it starts from it while the hub is unreachable, and it resumes its
// watches from it when the hub answers again.

// sourcedSim is the sim runtime with the Sources the agent hands runtimes
// that read ConfigMaps and Secrets, so tests can see what reached them.
type sourcedSim struct {
	*sim.Runtime
	mu  sync.Mutex
	src edge.Sources
}

func newSourcedSim() *sourcedSim {
	return &sourcedSim{Runtime: sim.New(sim.Config{StartDelay: 100 * time.Millisecond, BackoffBase: 500 * time.Millisecond, LogInterval: -1})}
}

func (s *sourcedSim) SetSources(src edge.Sources) {
	s.mu.Lock()
	s.src = src
	s.mu.Unlock()
}

func (s *sourcedSim) configMap(ns, name string) (*corev1.ConfigMap, error) {
	s.mu.Lock()
	src := s.src
	s.mu.Unlock()
	if src == nil {
		return nil, errors.New("no sources yet")
	}
	return src.ConfigMap(ns, name)
}

// running reports whether the runtime runs every container of the pod.
func (s *sourcedSim) running(uid types.UID) (bool, string) {
	st, err := s.PodStatus(context.Background(), uid)
	if err != nil {
		return false, err.Error()
	}
	if len(st.Containers) == 0 {
		return false, "no containers"
	}
	for _, c := range st.Containers {
		if c.State != edge.ContainerRunning {
			return false, fmt.Sprintf("%s %s", c.Name, c.State)
		}
	}
	return true, ""
}

// containerIDs returns the IDs of the pod's containers in the runtime.
func (s *sourcedSim) containerIDs(uid types.UID) []string {
	st, err := s.PodStatus(context.Background(), uid)
	if err != nil {
		return nil
	}
	var ids []string
	for _, c := range st.Containers {
		ids = append(ids, fmt.Sprintf("%s@%d", c.ID, c.RestartCount))
	}
	return ids
}

func (s *sourcedSim) gone(uid types.UID) bool {
	_, err := s.PodStatus(context.Background(), uid)
	return errors.Is(err, edge.ErrPodNotFound)
}

func configPod(name, node, cm string) *corev1.Pod {
	p := newPod(name, node, nil, corev1.RestartPolicyAlways)
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "MODE", ValueFrom: &corev1.EnvVarSource{
		ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: cm}, Key: "mode"}}}}
	return p
}

func createPods(t *testing.T, e *env, pods ...*corev1.Pod) map[string]types.UID {
	t.Helper()
	uids := map[string]types.UID{}
	for _, p := range pods {
		out, err := e.client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[p.Name] = out.UID
	}
	for _, p := range pods {
		waitPod(t, e, p.Name, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning && podReady(p) })
	}
	return uids
}

func createConfigMap(t *testing.T, e *env, name, mode string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Data: map[string]string{"mode": mode}}
	if _, err := e.client.CoreV1().ConfigMaps("default").Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func updateConfigMap(t *testing.T, e *env, name, mode string) {
	t.Helper()
	cm, err := e.client.CoreV1().ConfigMaps("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["mode"] = mode
	if _, err := e.client.CoreV1().ConfigMaps("default").Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestOfflineRestart restarts the agent while the hub is down: the pods run
// again from the local state within seconds, with no hub at all, after a
// reboot (a fresh runtime) and after an agent restart (the runtime still
// runs them: adopted, not restarted). When the hub is back the agent
// resumes its watches without listing.
func TestOfflineRestart(t *testing.T) {
	e := startHub(t)
	dir := t.TempDir()
	cfg := edge.Config{HubURL: e.url, Token: e.token, DataDir: dir, NodeName: "edge-o", NodeIP: netip.MustParseAddr("192.0.2.30")}
	rt := newSourcedSim()
	cfg.Runtime = rt
	a := startAgent(t, cfg)
	waitNodeReady(t, e, "edge-o")
	createConfigMap(t, e, "conf", "v1")
	uids := createPods(t, e, configPod("web-0", "edge-o", "conf"), newPod("web-1", "edge-o", nil, corev1.RestartPolicyAlways),
		newPod("web-2", "edge-o", nil, corev1.RestartPolicyAlways))
	a.stop(t)
	e.hub.Stop()
	cfg.Token = ""

	// A reboot: the runtime lost everything.
	rt = newSourcedSim()
	cfg.Runtime = rt
	start := time.Now()
	a = startAgent(t, cfg)
	eventually(t, 5*time.Second, "pods running from the local state", func() (bool, string) {
		for name, uid := range uids {
			if ok, why := rt.running(uid); !ok {
				return false, name + ": " + why
			}
		}
		return true, ""
	})
	t.Logf("after a reboot with the hub down, %d pods ran again in %v", len(uids), time.Since(start).Round(time.Millisecond))
	if cm, err := rt.configMap("default", "conf"); err != nil || cm.Data["mode"] != "v1" {
		t.Errorf("ConfigMap from the local state: %v %v", cm, err)
	}
	if s := a.Stats(); s.Connected || s.Registered || s.Pods != len(uids) {
		t.Errorf("stats offline: %+v", s)
	}

	// An agent restart: the runtime still runs the containers.
	ids := map[string][]string{}
	for name, uid := range uids {
		ids[name] = rt.containerIDs(uid)
	}
	a.stop(t)
	a = startAgent(t, cfg)
	time.Sleep(2 * time.Second)
	for name, uid := range uids {
		if got := rt.containerIDs(uid); fmt.Sprint(got) != fmt.Sprint(ids[name]) {
			t.Errorf("pod %s after an agent restart: containers %v, before %v", name, got, ids[name])
		}
	}

	// The hub comes back: watches resume, nothing is listed, and the
	// status the agent kept reaches the hub.
	e.hub.Restart()
	eventually(t, 30*time.Second, "agent reconnects and registers", func() (bool, string) {
		s := a.Stats()
		return s.Connected && s.Registered, fmt.Sprintf("%+v", s)
	})
	createPods(t, e, newPod("web-3", "edge-o", nil, corev1.RestartPolicyAlways))
	for name := range uids {
		waitPod(t, e, name, "Running and reported by the restarted agent", func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			return p.Status.Phase == corev1.PodRunning && len(cs) == 1 && fmt.Sprintf("%s@%d", cs[0].ContainerID, cs[0].RestartCount) == ids[name][0]
		})
	}
	s := a.Stats()
	if s.Lists != 0 || s.Watches == 0 {
		t.Errorf("after reconnecting: %d LISTs, %d watches; want 0 LISTs (watches resumed)", s.Lists, s.Watches)
	}
	t.Logf("restarted agent after the hub came back: %d LISTs, %d watches, %d gets, %d writes", s.Lists, s.Watches, s.Gets, s.Writes)
}

// TestOfflineChangesApplied stops the agent, changes what its node must run
// on the hub, and starts it again: the changes are applied from the resumed
// watches (no list) and the pods that did not change keep running.
func TestOfflineChangesApplied(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hubArgs []string
		expire  bool // the hub's change log moves past the agent's versions
	}{
		{name: "resumed"},
		{name: "expired", hubArgs: []string{"--change-log-retain", "50", "--compact-interval", "200ms"}, expire: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startHubArgs(t, tc.hubArgs...)
			ctx := context.Background()
			rt := newSourcedSim()
			cfg := edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "edge-c", NodeIP: netip.MustParseAddr("192.0.2.31"), Runtime: rt}
			a := startAgent(t, cfg)
			waitNodeReady(t, e, "edge-c")
			createConfigMap(t, e, "conf", "v1")
			uids := createPods(t, e, configPod("keep", "edge-c", "conf"), newPod("doomed", "edge-c", nil, corev1.RestartPolicyAlways),
				newPod("graceful", "edge-c", nil, corev1.RestartPolicyAlways))
			eventually(t, 10*time.Second, "ConfigMap reaches the runtime", func() (bool, string) {
				cm, err := rt.configMap("default", "conf")
				return err == nil && cm.Data["mode"] == "v1", fmt.Sprint(err)
			})
			keepIDs := rt.containerIDs(uids["keep"])

			// The agent goes away; its pods go on running.
			a.stop(t)
			zero, grace := int64(0), int64(30)
			if err := e.client.CoreV1().Pods("default").Delete(ctx, "doomed", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatal(err)
			}
			if err := e.client.CoreV1().Pods("default").Delete(ctx, "graceful", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
				t.Fatal(err)
			}
			updateConfigMap(t, e, "conf", "v2")
			if tc.expire {
				for i := range 120 {
					createConfigMap(t, e, fmt.Sprintf("filler-%d", i), "x")
				}
				time.Sleep(time.Second) // a compaction ran
			}

			cfg.Token = ""
			a = startAgent(t, cfg)
			eventually(t, 20*time.Second, "pod deleted on the hub stopped", func() (bool, string) {
				return rt.gone(uids["doomed"]), "still in the runtime"
			})
			eventually(t, 20*time.Second, "gracefully deleted pod stopped and finalised", func() (bool, string) {
				_, err := e.client.CoreV1().Pods("default").Get(ctx, "graceful", metav1.GetOptions{})
				return apierrors.IsNotFound(err) && rt.gone(uids["graceful"]), errString(err)
			})
			eventually(t, 20*time.Second, "ConfigMap update reaches the runtime", func() (bool, string) {
				cm, err := rt.configMap("default", "conf")
				if err != nil {
					return false, err.Error()
				}
				return cm.Data["mode"] == "v2", cm.Data["mode"]
			})
			if got := rt.containerIDs(uids["keep"]); fmt.Sprint(got) != fmt.Sprint(keepIDs) {
				t.Errorf("unchanged pod restarted: containers %v, before %v", got, keepIDs)
			}
			s := a.Stats()
			if tc.expire {
				if s.Lists == 0 {
					t.Errorf("the hub's window moved on, yet the agent did not list: %+v", s)
				}
			} else if s.Lists != 0 {
				t.Errorf("the agent listed although the hub still had its window: %d LISTs, %d watches", s.Lists, s.Watches)
			}
			t.Logf("after the restart: %d LISTs, %d watches", s.Lists, s.Watches)
		})
	}
}

// TestOfflineCrashAfterPersist kills the agent (no clean shutdown) between
// writing an event to the local state and acting on it: the next agent
// acts on it, once.
func TestOfflineCrashAfterPersist(t *testing.T) {
	e := startHub(t)
	ctx := context.Background()
	var (
		mu      sync.Mutex
		target  string // pod name and event type to stop at
		reached = make(chan struct{}, 1)
		release = make(chan struct{})
	)
	afterPersist := func(kind string, ev watch.EventType, obj metav1.Object) {
		mu.Lock()
		hit := kind == "pods" && target == obj.GetName()+"/"+string(ev)
		if hit {
			target = ""
		}
		mu.Unlock()
		if hit {
			reached <- struct{}{}
			<-release // the agent is dead from here on
		}
	}
	stopAt := func(s string) {
		mu.Lock()
		target = s
		mu.Unlock()
	}
	rt := newSourcedSim()
	dir := t.TempDir()
	cfg := edge.Config{HubURL: e.url, Token: e.token, DataDir: dir, NodeName: "edge-k", NodeIP: netip.MustParseAddr("192.0.2.32"), Runtime: rt}
	edge.SetAfterPersist(&cfg, afterPersist)
	a := startAgent(t, cfg)
	t.Cleanup(func() { close(release) })
	waitNodeReady(t, e, "edge-k")
	cfg.Token = ""

	// Crash after the new pod was written, before it ran.
	stopAt("born/" + string(watch.Added))
	p, err := e.client.CoreV1().Pods("default").Create(ctx, newPod("born", "edge-k", nil, corev1.RestartPolicyAlways), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-reached:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent never wrote the new pod")
	}
	a.cancel() // gone, without a clean shutdown
	if !rt.gone(p.UID) {
		t.Fatal("the pod ran before the crash; the test hook came too late")
	}
	a = startAgent(t, cfg)
	eventually(t, 10*time.Second, "pod written before the crash runs", func() (bool, string) { return rt.running(p.UID) })
	waitPod(t, e, "born", "Running once", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return p.Status.Phase == corev1.PodRunning && len(cs) == 1 && cs[0].RestartCount == 0
	})
	if n := stateRows(t, dir, "born"); n != 1 {
		t.Errorf("local state holds %d rows for the pod, want 1", n)
	}

	// Crash after the deletion was written, before the pod stopped.
	stopAt("born/" + string(watch.Deleted))
	zero := int64(0)
	if err := e.client.CoreV1().Pods("default").Delete(ctx, "born", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reached:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent never wrote the deletion")
	}
	a.cancel()
	if rt.gone(p.UID) {
		t.Fatal("the pod stopped before the crash; the test hook came too late")
	}
	a = startAgent(t, cfg)
	eventually(t, 10*time.Second, "pod deleted before the crash stops", func() (bool, string) {
		return rt.gone(p.UID), "still in the runtime"
	})
	eventually(t, 5*time.Second, "its tombstone is forgotten", func() (bool, string) {
		n := stateRows(t, dir, "born")
		return n == 0, fmt.Sprint(n, " rows")
	})
	_ = a
}

// stateRows counts the rows the local state in dir holds for a pod.
func stateRows(t *testing.T, dir, name string) int {
	t.Helper()
	s, err := state.Open(filepath.Join(dir, edge.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, err := s.List("pods", "default", name)
	if err != nil {
		t.Fatal(err)
	}
	return len(rows)
}
