package edge

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tether-edge/tether/edge/kube"
	"github.com/tether-edge/tether/edge/restarts"
)

// killedRuntime runs one container that is killed (as by a failed
// liveness probe) runFor after each start. Like the containerd runtime it
// restarts the container only when the agent syncs the pod, once the
// crash-loop back-off allows, and wakes the pod when an exit happens or a
// back-off ends.
type killedRuntime struct {
	Runtime // only the methods below are used
	runFor  time.Duration

	mu       sync.Mutex
	notify   func(types.UID)
	backoff  restarts.Backoff
	running  bool
	exitedAt time.Time
	starts   []time.Time
	wake     *time.Timer
}

func (r *killedRuntime) Notify(fn func(types.UID)) { r.notify = fn }

func (r *killedRuntime) SyncPod(_ context.Context, pod *corev1.Pod, _ Network) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.running {
		return nil
	}
	if len(r.starts) > 0 {
		at := r.exitedAt.Add(r.backoff.Wait(r.exitedAt))
		if now.Before(at) {
			if r.wake != nil {
				r.wake.Stop()
			}
			uid := pod.UID
			r.wake = time.AfterFunc(time.Until(at), func() { r.notify(uid) })
			return nil
		}
		r.backoff.Restarted(now)
	}
	r.running = true
	r.starts = append(r.starts, now)
	uid := pod.UID
	time.AfterFunc(r.runFor, func() {
		r.mu.Lock()
		r.running, r.exitedAt = false, time.Now()
		r.mu.Unlock()
		r.notify(uid)
	})
	return nil
}

func (r *killedRuntime) PodStatus(_ context.Context, uid types.UID) (*PodStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := ContainerStatus{Name: "app", ID: "fake://app", State: ContainerRunning, Ready: true, StartedAt: t0}
	c.RestartCount = int32(max(len(r.starts)-1, 0))
	if !r.running {
		c.State, c.Reason = ContainerWaiting, "CrashLoopBackOff"
	}
	return &PodStatus{UID: uid, SandboxReady: true, Containers: []ContainerStatus{c}}, nil
}

func (r *killedRuntime) startTimes() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.starts...)
}

// TestPodWorkerRestartsWhileStatusWritesHang: while every status write to
// the hub hangs (its link died, unnoticed), a container killed again and
// again still restarts on its back-off schedule: the pod's worker never
// waits for a status write, which queue and coalesce.
func TestPodWorkerRestartsWhileStatusWritesHang(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "app")
	client := fake.NewClientset(pod)
	release := make(chan struct{})
	var hung atomic.Int32
	client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		hung.Add(1)
		<-release
		return true, nil, errors.New("the hub's link failed")
	})
	defer close(release)

	const base = 200 * time.Millisecond
	rt := &killedRuntime{runFor: 100 * time.Millisecond, backoff: restarts.Backoff{Base: base, Max: 800 * time.Millisecond}}
	a := &Agent{cfg: Config{Runtime: rt}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), client: podDeletions(t, client)}
	a.node = &nodeSync{a: a, ready: make(chan struct{}), kick: make(chan struct{}, 1)}
	close(a.node.ready)
	a.pods = newPodManager(a)
	a.refs = newRefManager(a)
	a.status = newStatusManager(func(ns string) podPatcher { return client.CoreV1().Pods(ns) }, &a.metrics)
	rt.Notify(a.pods.runtimeChanged)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.pods.start(ctx)
	a.pods.update(pod)

	// Starts at 0; killed at 100ms; restarts at once (the first restart),
	// then after 200ms, 400ms, 800ms, 800ms of back-off.
	waits := []time.Duration{0, base, 2 * base, 4 * base, 4 * base}
	deadline := time.Now().Add(10 * time.Second)
	for len(rt.startTimes()) < len(waits)+1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	starts := rt.startTimes()
	if len(starts) < len(waits)+1 {
		t.Fatalf("%d starts in 10s while status writes hang, want %d", len(starts), len(waits)+1)
	}
	for i, wait := range waits {
		exited := starts[i].Add(rt.runFor)
		late := starts[i+1].Sub(exited) - wait
		if late < 0 || late > 150*time.Millisecond {
			t.Errorf("restart %d came %v after its back-off of %v ended, want within 150ms", i+1, late, wait)
		}
	}
	if hung.Load() == 0 {
		t.Fatal("no status write was tried")
	}
	t.Logf("%d restarts on schedule while %d status writes hung", len(starts)-1, hung.Load())
}

// hangingRuntime's SyncPod hangs until its context ends, as a postStart
// hook that never returns does.
type hangingRuntime struct {
	Runtime
	syncing chan struct{} // closed when the first SyncPod began
	once    sync.Once
	killed  chan struct{} // closed by KillPod
	kill    sync.Once
}

func (r *hangingRuntime) Notify(func(types.UID)) {}

func (r *hangingRuntime) SyncPod(ctx context.Context, _ *corev1.Pod, _ Network) error {
	r.once.Do(func() { close(r.syncing) })
	<-ctx.Done()
	return ctx.Err()
}

func (r *hangingRuntime) KillPod(context.Context, types.UID, time.Duration) error {
	r.kill.Do(func() { close(r.killed) })
	return nil
}

func (r *hangingRuntime) PodStatus(context.Context, types.UID) (*PodStatus, error) {
	return nil, ErrPodNotFound
}

// TestPodDeletionInterruptsSync: the deletion of a pod whose sync hangs
// (its postStart hook never returns) cancels the sync, and the pod is
// killed.
func TestPodDeletionInterruptsSync(t *testing.T) {
	pod := specPod(corev1.RestartPolicyAlways, nil, "app")
	client := fake.NewClientset(pod)
	rt := &hangingRuntime{syncing: make(chan struct{}), killed: make(chan struct{})}
	a := &Agent{cfg: Config{Runtime: rt}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), client: podDeletions(t, client)}
	a.node = &nodeSync{a: a, ready: make(chan struct{}), kick: make(chan struct{}, 1)}
	close(a.node.ready)
	a.pods = newPodManager(a)
	a.refs = newRefManager(a)
	a.status = newStatusManager(func(ns string) podPatcher { return client.CoreV1().Pods(ns) }, &a.metrics)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a.pods.start(ctx)
	a.pods.update(pod)
	select {
	case <-rt.syncing:
	case <-time.After(5 * time.Second):
		t.Fatal("the pod was never synced")
	}
	deleting := pod.DeepCopy()
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	a.pods.update(deleting)
	select {
	case <-rt.killed:
	case <-time.After(5 * time.Second):
		t.Fatal("the deleted pod was not killed while its sync hung")
	}
}

// podDeletions returns an API client whose pod deletions (what a pod
// worker sends once a deleted pod stopped) reach client; it serves
// nothing else.
func podDeletions(t *testing.T, client kubernetes.Interface) *kube.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// /api/v1/namespaces/NAMESPACE/pods/NAME
		p := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		var st metav1.Status
		if r.Method != http.MethodDelete || len(p) != 6 || p[2] != "namespaces" || p[4] != "pods" {
			st = apierrors.NewMethodNotSupported(corev1.Resource("pods"), r.Method).ErrStatus
		} else if err := client.CoreV1().Pods(p[3]).Delete(r.Context(), p[5], metav1.DeleteOptions{}); err != nil {
			st = apierrors.NewInternalError(err).ErrStatus
			if s, ok := err.(apierrors.APIStatus); ok {
				st = s.Status()
			}
		} else {
			st = metav1.Status{Status: metav1.StatusSuccess, Code: http.StatusOK}
		}
		st.Kind, st.APIVersion = "Status", "v1"
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(st.Code))
		_ = json.NewEncoder(w).Encode(&st)
	}))
	t.Cleanup(srv.Close)
	c, err := kube.New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
