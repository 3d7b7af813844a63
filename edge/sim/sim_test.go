package sim

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
)

var testNet = edge.Network{
	HostIPs:  []netip.Addr{netip.MustParseAddr("192.0.2.10")},
	PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.42.3.0/24")},
}

func testPod(name string, policy corev1.RestartPolicy, ann map[string]string, containers ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), Annotations: ann},
		Spec:       corev1.PodSpec{RestartPolicy: policy, NodeName: "n1"},
	}
	if len(containers) == 0 {
		containers = []string{"app"}
	}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "registry.example/" + c + ":1"})
	}
	return p
}

func status(t *testing.T, r *Runtime, uid types.UID) *edge.PodStatus {
	t.Helper()
	st, err := r.PodStatus(context.Background(), uid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func syncPod(t *testing.T, r *Runtime, p *corev1.Pod) {
	t.Helper()
	if err := r.SyncPod(context.Background(), p, testNet); err != nil {
		t.Fatal(err)
	}
}

func TestStartDelayAndReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{StartDelay: 2 * time.Second})
		notified := 0
		r.Notify(func(types.UID) { notified++ })
		p := testPod("web", corev1.RestartPolicyAlways, nil)
		syncPod(t, r, p)
		st := status(t, r, p.UID)
		if !st.SandboxReady || len(st.IPs) != 1 || st.IPs[0].String() != "10.42.3.2" {
			t.Fatalf("sandbox: ready=%v ips=%v, want ready with 10.42.3.2", st.SandboxReady, st.IPs)
		}
		if c := st.Containers[0]; c.State != edge.ContainerWaiting || c.Reason != "ContainerCreating" {
			t.Fatalf("before the delay: %+v, want Waiting/ContainerCreating", c)
		}
		time.Sleep(1999 * time.Millisecond)
		if st := status(t, r, p.UID); st.Containers[0].State != edge.ContainerWaiting {
			t.Fatalf("started before the delay: %+v", st.Containers[0])
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		c := status(t, r, p.UID).Containers[0]
		if c.State != edge.ContainerRunning || !c.Ready || c.RestartCount != 0 || !strings.HasPrefix(c.ID, "sim://") {
			t.Fatalf("after the delay: %+v, want Running, ready, sim:// id", c)
		}
		if notified == 0 {
			t.Fatal("runtime did not notify the start")
		}
		// A second pod gets the next address; a removed pod's address is
		// handed out again.
		p2 := testPod("web2", corev1.RestartPolicyAlways, nil)
		syncPod(t, r, p2)
		if ip := status(t, r, p2.UID).IPs[0].String(); ip != "10.42.3.3" {
			t.Fatalf("second pod IP %s, want 10.42.3.3", ip)
		}
		if err := r.RemovePod(context.Background(), p.UID); err != nil {
			t.Fatal(err)
		}
		p3 := testPod("web3", corev1.RestartPolicyAlways, nil)
		syncPod(t, r, p3)
		if ip := status(t, r, p3.UID).IPs[0].String(); ip != "10.42.3.2" {
			t.Fatalf("pod after removal got %s, want the freed 10.42.3.2", ip)
		}
		if _, err := r.PodStatus(context.Background(), p.UID); !errors.Is(err, edge.ErrPodNotFound) {
			t.Fatalf("status of removed pod: %v, want ErrPodNotFound", err)
		}
		r.RemovePod(context.Background(), p2.UID)
		r.RemovePod(context.Background(), p3.UID)
	})
}

func TestNoPodCIDR(t *testing.T) {
	r := New(Config{})
	p := testPod("web", corev1.RestartPolicyAlways, nil)
	err := r.SyncPod(context.Background(), p, edge.Network{})
	if err == nil || !strings.Contains(err.Error(), "pod CIDR") {
		t.Fatalf("sync without pod CIDR: %v, want an error naming the pod CIDR", err)
	}
	if st := status(t, r, p.UID); st.SandboxReady || st.SandboxError == "" {
		t.Fatalf("sandbox %+v, want not ready with an error", st)
	}
	// Host-network pods use the node's address.
	hp := testPod("host", corev1.RestartPolicyAlways, nil)
	hp.Spec.HostNetwork = true
	syncPod(t, r, hp)
	if ip := status(t, r, hp.UID).IPs[0].String(); ip != "192.0.2.10" {
		t.Fatalf("host-network pod IP %s, want the host's", ip)
	}
	r.RemovePod(context.Background(), hp.UID)
}

func TestNotReadyAndHang(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{})
		p := testPod("web", corev1.RestartPolicyAlways, map[string]string{NotReady: "true", HangStart + ".b": "true"}, "a", "b")
		syncPod(t, r, p)
		time.Sleep(time.Hour)
		st := status(t, r, p.UID)
		if a := st.Containers[0]; a.State != edge.ContainerRunning || a.Ready {
			t.Fatalf("not-ready container %+v, want Running and not ready", a)
		}
		if b := st.Containers[1]; b.State != edge.ContainerWaiting || b.Reason != "ContainerCreating" {
			t.Fatalf("hanging container %+v, want Waiting/ContainerCreating", b)
		}
		var buf bytes.Buffer
		err := r.ContainerLogs(context.Background(), p.UID, "b", edge.LogOptions{TailLines: -1}, &buf)
		if !errors.Is(err, edge.ErrContainerWaiting) {
			t.Fatalf("logs of hanging container: %v, want ErrContainerWaiting", err)
		}
		r.RemovePod(context.Background(), p.UID)
	})
}

func TestExitCodesAndRestartPolicy(t *testing.T) {
	for _, tt := range []struct {
		name      string
		policy    corev1.RestartPolicy
		ann       map[string]string
		state     edge.ContainerState
		reason    string
		code      int32
		restarted bool
	}{
		{"never fails", corev1.RestartPolicyNever, map[string]string{ExitCode: "3"}, edge.ContainerExited, "Error", 3, false},
		{"never completes", corev1.RestartPolicyNever, map[string]string{ExitCode: "0"}, edge.ContainerExited, "Completed", 0, false},
		{"on-failure completes", corev1.RestartPolicyOnFailure, map[string]string{ExitCode: "0"}, edge.ContainerExited, "Completed", 0, false},
		{"on-failure fails", corev1.RestartPolicyOnFailure, map[string]string{CrashAfter: "1s"}, edge.ContainerWaiting, "CrashLoopBackOff", 0, true},
		{"always completes", corev1.RestartPolicyAlways, map[string]string{ExitCode: "0", CrashAfter: "1s"}, edge.ContainerWaiting, "CrashLoopBackOff", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := New(Config{})
				p := testPod("job", tt.policy, tt.ann)
				syncPod(t, r, p)
				// Long enough for the immediate first restart and the
				// second exit, short of the 10s back-off.
				time.Sleep(2500 * time.Millisecond)
				synctest.Wait()
				c := status(t, r, p.UID).Containers[0]
				if c.State != tt.state || c.Reason != tt.reason {
					t.Fatalf("container %+v, want %s/%s", c, tt.state, tt.reason)
				}
				if c.State == edge.ContainerExited && c.ExitCode != tt.code {
					t.Fatalf("exit code %d, want %d", c.ExitCode, tt.code)
				}
				if tt.restarted != (c.RestartCount > 0) {
					t.Fatalf("restart count %d, restarted want %v", c.RestartCount, tt.restarted)
				}
				r.RemovePod(context.Background(), p.UID)
			})
		})
	}
}

func TestCrashLoopBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{BackoffBase: 10 * time.Second, BackoffMax: 40 * time.Second})
		p := testPod("crash", corev1.RestartPolicyAlways, map[string]string{CrashAfter: "1s", ExitCode: "2"})
		syncPod(t, r, p)
		start := time.Now()
		// Record when each instance starts: restarts come at once, then
		// after 10s, 20s, 40s, 40s of back-off, each instance running 1s.
		var starts []time.Duration
		var lastID string
		for len(starts) < 6 {
			time.Sleep(100 * time.Millisecond)
			c := status(t, r, p.UID).Containers[0]
			if c.State == edge.ContainerRunning && c.ID != lastID {
				lastID = c.ID
				starts = append(starts, time.Since(start).Round(time.Second))
				if int(c.RestartCount) != len(starts)-1 {
					t.Fatalf("restart count %d at start %d", c.RestartCount, len(starts))
				}
			}
			if c.State == edge.ContainerWaiting && c.Reason == "CrashLoopBackOff" {
				if c.Last == nil || c.Last.ExitCode != 2 || c.Last.Reason != "Error" {
					t.Fatalf("back-off without the last termination: %+v", c)
				}
				// As the kubelet reports it, the container's ID is the
				// exited instance's while it waits.
				if c.ID == "" || c.ID != c.Last.ID {
					t.Fatalf("back-off with ID %q, last %q", c.ID, c.Last.ID)
				}
				if !strings.Contains(c.Message, "back-off") || !strings.Contains(c.Message, "container=app") {
					t.Fatalf("back-off message %q", c.Message)
				}
			}
		}
		want := []time.Duration{0, 1 * time.Second, 12 * time.Second, 33 * time.Second, 74 * time.Second, 115 * time.Second}
		for i := range want {
			if starts[i] != want[i] {
				t.Fatalf("starts at %v, want %v", starts, want)
			}
		}
		r.RemovePod(context.Background(), p.UID)
	})
}

func TestInitContainers(t *testing.T) {
	withInit := func(p *corev1.Pod, names ...string) *corev1.Pod {
		for _, n := range names {
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: n, Image: "busybox"})
		}
		return p
	}
	t.Run("in order", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := New(Config{})
			p := withInit(testPod("p", corev1.RestartPolicyAlways, map[string]string{CrashAfter + ".i1": "5s", ExitCode + ".i1": "0"}), "i1", "i2")
			syncPod(t, r, p)
			synctest.Wait()
			st := status(t, r, p.UID)
			if len(st.InitContainers) != 1 || st.InitContainers[0].State != edge.ContainerRunning || len(st.Containers) != 0 {
				t.Fatalf("while i1 runs: init %+v, containers %+v", st.InitContainers, st.Containers)
			}
			time.Sleep(5 * time.Second)
			synctest.Wait()
			st = status(t, r, p.UID)
			if len(st.InitContainers) != 2 || st.InitContainers[1].State != edge.ContainerExited || st.InitContainers[1].ExitCode != 0 {
				t.Fatalf("after i1: init %+v", st.InitContainers)
			}
			if len(st.Containers) != 1 || st.Containers[0].State != edge.ContainerRunning {
				t.Fatalf("app after init: %+v", st.Containers)
			}
			r.RemovePod(context.Background(), p.UID)
		})
	})
	t.Run("failure with Never", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := New(Config{})
			p := withInit(testPod("p", corev1.RestartPolicyNever, map[string]string{ExitCode + ".i1": "1"}), "i1")
			syncPod(t, r, p)
			time.Sleep(time.Minute)
			st := status(t, r, p.UID)
			if st.InitContainers[0].State != edge.ContainerExited || st.InitContainers[0].ExitCode != 1 || len(st.Containers) != 0 {
				t.Fatalf("failed init: %+v, app %+v", st.InitContainers, st.Containers)
			}
			r.RemovePod(context.Background(), p.UID)
		})
	})
	t.Run("failure with Always restarts", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := New(Config{})
			p := withInit(testPod("p", corev1.RestartPolicyAlways, map[string]string{ExitCode + ".i1": "1"}), "i1")
			syncPod(t, r, p)
			time.Sleep(time.Second)
			st := status(t, r, p.UID)
			if c := st.InitContainers[0]; c.State != edge.ContainerWaiting || c.Reason != "CrashLoopBackOff" || c.RestartCount != 1 {
				t.Fatalf("failing init with Always: %+v", c)
			}
			r.RemovePod(context.Background(), p.UID)
		})
	})
}

func TestKillPod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{})
		quick := testPod("quick", corev1.RestartPolicyAlways, nil)
		slow := testPod("slow", corev1.RestartPolicyAlways, map[string]string{StopDelay: "1m"})
		syncPod(t, r, quick)
		syncPod(t, r, slow)
		synctest.Wait()
		start := time.Now()
		if err := r.KillPod(context.Background(), quick.UID, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("well-behaved pod took %v to stop", d)
		}
		if c := status(t, r, quick.UID).Containers[0]; c.State != edge.ContainerExited || c.ExitCode != 0 {
			t.Fatalf("stopped container %+v, want exit 0", c)
		}
		if err := r.KillPod(context.Background(), slow.UID, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 30*time.Second {
			t.Fatalf("slow pod stopped after %v, want the 30s grace", d)
		}
		if c := status(t, r, slow.UID).Containers[0]; c.ExitCode != 137 || c.Reason != "Error" {
			t.Fatalf("killed container %+v, want 137/Error", c)
		}
		// No restart after a kill, whatever the policy.
		time.Sleep(time.Hour)
		if c := status(t, r, slow.UID).Containers[0]; c.State != edge.ContainerExited {
			t.Fatalf("killed container restarted: %+v", c)
		}
		r.RemovePod(context.Background(), quick.UID)
		r.RemovePod(context.Background(), slow.UID)
	})
}

func TestLogs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New(Config{LogInterval: time.Second})
		p := testPod("web", corev1.RestartPolicyAlways, map[string]string{CrashAfter: "3500ms"})
		syncPod(t, r, p)
		synctest.Wait()
		start := time.Now()
		time.Sleep(2500 * time.Millisecond)
		logs := func(opts edge.LogOptions) string {
			t.Helper()
			var b bytes.Buffer
			if err := r.ContainerLogs(context.Background(), p.UID, "app", opts, &b); err != nil {
				t.Fatal(err)
			}
			return b.String()
		}
		all := logs(edge.LogOptions{TailLines: -1})
		if n := strings.Count(all, "\n"); n != 3 || !strings.HasPrefix(all, "sim: container app started") {
			t.Fatalf("logs after 2.5s:\n%s", all)
		}
		if tail := logs(edge.LogOptions{TailLines: 1}); tail != "sim: container app is running: line 2\n" {
			t.Fatalf("tail 1: %q", tail)
		}
		if ts := logs(edge.LogOptions{TailLines: 1, Timestamps: true}); !strings.HasPrefix(ts, start.Add(2*time.Second).UTC().Format(time.RFC3339Nano)+" ") {
			t.Fatalf("timestamps: %q", ts)
		}
		if since := logs(edge.LogOptions{TailLines: -1, Since: start.Add(1500 * time.Millisecond)}); strings.Count(since, "\n") != 1 {
			t.Fatalf("since 1.5s: %q", since)
		}
		if lim := logs(edge.LogOptions{TailLines: -1, LimitBytes: 10}); lim != "sim: conta" {
			t.Fatalf("limit 10 bytes: %q", lim)
		}
		// Follow returns when the instance exits, after its last lines.
		followed := logs(edge.LogOptions{TailLines: 0, Follow: true})
		if followed != "sim: container app is running: line 3\nsim: container app exited with code 1\n" {
			t.Fatalf("follow: %q", followed)
		}
		time.Sleep(100 * time.Millisecond) // restarted at once
		synctest.Wait()
		prev := logs(edge.LogOptions{TailLines: -1, Previous: true})
		if !strings.HasSuffix(prev, "exited with code 1\n") {
			t.Fatalf("previous: %q", prev)
		}
		if cur := logs(edge.LogOptions{TailLines: -1}); !strings.Contains(cur, "(restart 1)") {
			t.Fatalf("current after restart: %q", cur)
		}
		var b bytes.Buffer
		if err := r.ContainerLogs(context.Background(), p.UID, "nope", edge.LogOptions{}, &b); !errors.Is(err, edge.ErrContainerNotFound) {
			t.Fatalf("unknown container: %v", err)
		}
		r.RemovePod(context.Background(), p.UID)
	})
}

func TestBadAnnotation(t *testing.T) {
	r := New(Config{})
	p := testPod("bad", corev1.RestartPolicyAlways, map[string]string{CrashAfter: "soon"})
	if err := r.SyncPod(context.Background(), p, testNet); err == nil || !strings.Contains(err.Error(), CrashAfter) {
		t.Fatalf("bad annotation: %v, want an error naming it", err)
	}
}

func TestSidecars(t *testing.T) {
	withSidecar := func(p *corev1.Pod) *corev1.Pod {
		always := corev1.ContainerRestartPolicyAlways
		p.Spec.InitContainers = []corev1.Container{
			{Name: "s", Image: "proxy", RestartPolicy: &always},
			{Name: "i1", Image: "busybox"},
		}
		return p
	}
	t.Run("run beside the app and stop when it is done", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := New(Config{StartDelay: time.Second})
			p := withSidecar(testPod("p", corev1.RestartPolicyNever, map[string]string{CrashAfter: "10s", ExitCode: "0"}))
			syncPod(t, r, p)
			time.Sleep(1500 * time.Millisecond)
			synctest.Wait()
			st := status(t, r, p.UID)
			if len(st.InitContainers) != 2 || st.InitContainers[0].State != edge.ContainerRunning || st.InitContainers[1].State != edge.ContainerWaiting {
				t.Fatalf("once the sidecar runs, i1 starts: %+v", st.InitContainers)
			}
			if !st.InitContainers[0].Ready {
				t.Fatalf("sidecar not ready: %+v", st.InitContainers[0])
			}
			time.Sleep(2 * time.Second)
			synctest.Wait()
			st = status(t, r, p.UID)
			if st.InitContainers[0].State != edge.ContainerRunning || st.InitContainers[1].State != edge.ContainerExited || st.Containers[0].State != edge.ContainerRunning {
				t.Fatalf("app with its sidecar: init %+v, app %+v", st.InitContainers, st.Containers)
			}
			time.Sleep(10 * time.Second)
			synctest.Wait()
			st = status(t, r, p.UID)
			if s, a := st.InitContainers[0], st.Containers[0]; s.State != edge.ContainerExited || s.RestartCount != 0 || a.State != edge.ContainerExited || a.ExitCode != 0 {
				t.Fatalf("after the app completed: sidecar %+v, app %+v", s, a)
			}
			r.RemovePod(context.Background(), p.UID)
		})
	})
	t.Run("back-off ends when the app is done", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := New(Config{})
			p := withSidecar(testPod("p", corev1.RestartPolicyNever, map[string]string{
				CrashAfter + ".s": "1s", ExitCode + ".s": "0", CrashAfter: "3s", ExitCode: "0"}))
			syncPod(t, r, p)
			time.Sleep(2500 * time.Millisecond)
			synctest.Wait()
			if s := status(t, r, p.UID).InitContainers[0]; s.State != edge.ContainerWaiting || s.Reason != "CrashLoopBackOff" {
				t.Fatalf("sidecar before the app is done: %+v", s)
			}
			time.Sleep(time.Second)
			synctest.Wait()
			st := status(t, r, p.UID)
			if s := st.InitContainers[0]; s.State != edge.ContainerExited || s.Reason != "Completed" || s.RestartCount != 1 {
				t.Fatalf("sidecar once the app is done: %+v", s)
			}
			if a := st.Containers[0]; a.State != edge.ContainerExited || a.ExitCode != 0 {
				t.Fatalf("app: %+v", a)
			}
			time.Sleep(time.Minute)
			synctest.Wait()
			if s := status(t, r, p.UID).InitContainers[0]; s.State != edge.ContainerExited || s.RestartCount != 1 {
				t.Fatalf("sidecar restarted after the app was done: %+v", s)
			}
			r.RemovePod(context.Background(), p.UID)
		})
	})
	t.Run("restarted whatever the pod's policy", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := New(Config{})
			p := withSidecar(testPod("p", corev1.RestartPolicyNever, map[string]string{CrashAfter + ".s": "1s", ExitCode + ".s": "0"}))
			syncPod(t, r, p)
			time.Sleep(2500 * time.Millisecond)
			synctest.Wait()
			st := status(t, r, p.UID)
			if s := st.InitContainers[0]; s.State != edge.ContainerWaiting || s.Reason != "CrashLoopBackOff" || s.RestartCount != 1 || s.Last == nil {
				t.Fatalf("exited sidecar: %+v", s)
			}
			if a := st.Containers[0]; a.State != edge.ContainerRunning {
				t.Fatalf("app while its sidecar restarts: %+v", a)
			}
			time.Sleep(10 * time.Second)
			synctest.Wait()
			if s := status(t, r, p.UID).InitContainers[0]; s.State != edge.ContainerRunning || s.RestartCount != 2 {
				t.Fatalf("sidecar after its back-off: %+v", s)
			}
			r.RemovePod(context.Background(), p.UID)
		})
	})
}
