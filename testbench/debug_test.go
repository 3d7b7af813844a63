package testbench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/testbench/images"
)

// TestKubectlDebugContainerd runs `kubectl debug` against a pod of a real
// containerd node, through the hub and the node's tunnel: the debug
// container targets the pod's container, so ps in it lists the target's
// process, it runs in the target's UTS namespace (the pod's host name)
// and the pod's network namespace (the pod's address), it is reached by
// attach (kubectl debug -i, and -it on a terminal) and exec like any
// container, and it is never restarted once it exited.
func TestKubectlDebugContainerd(t *testing.T) {
	requireContainerdNode(t)
	began := time.Now()
	l, h, archive := upCtrLab(t, t.TempDir(), 512, SiteSpec{Name: "dbg", Nodes: 1})
	startCtrNode(t, l, h, "dbg-n1", "dbg", []string{archive})
	h.waitReady(90*time.Second, "dbg-n1")
	h.applyManifest(t, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: app}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: %s, imagePullPolicy: Never}
`, images.Sleeper))
	var app *corev1.Pod
	eventually(t, 60*time.Second, "pod app Running", func() (bool, string) {
		p, err := h.pod("app")
		if err != nil {
			return false, err.Error()
		}
		app = p
		return p.Status.Phase == corev1.PodRunning, p.Status.String()
	})

	t.Logf("pod running %v after the test began", time.Since(began).Round(time.Millisecond))
	debugAt := time.Now()

	// Attached: kubectl waits for the container to run and attaches to
	// it (or, had it exited already, reads its log).
	out := h.must(t, "debug", "-i", "app", "--image="+images.Sleeper, "--image-pull-policy=Never",
		"--target=c", "--container=ps", "--", "sh", "-c", "sleep 2; ps")
	if !strings.Contains(out, "/testapp sleep") {
		t.Errorf("ps in the debug container does not show the target's process:\n%s", out)
	}
	eventually(t, 30*time.Second, "the ps container exited", func() (bool, string) {
		p, err := h.pod("app")
		if err != nil {
			return false, err.Error()
		}
		s := ephemeralStatus(p, "ps")
		return s != nil && s.State.Terminated != nil && s.State.Terminated.ExitCode == 0, p.Status.String()
	})

	t.Logf("kubectl debug -i answered in %v", time.Since(debugAt).Round(time.Millisecond))

	// Detached, then exec'd into.
	h.must(t, "debug", "app", "--image="+images.Sleeper, "--image-pull-policy=Never", "--target=c", "--container=sh", "--", "sleep", "3600")
	eventually(t, 30*time.Second, "the sh container runs", func() (bool, string) {
		p, err := h.pod("app")
		if err != nil {
			return false, err.Error()
		}
		s := ephemeralStatus(p, "sh")
		return s != nil && s.State.Running != nil, p.Status.String()
	})
	if out := h.must(t, "exec", "app", "-c", "sh", "--", "ps"); !strings.Contains(out, "/testapp sleep") {
		t.Errorf("ps exec'd in the debug container does not show the target's process:\n%s", out)
	}
	if out := strings.TrimSpace(h.must(t, "exec", "app", "-c", "sh", "--", "hostname")); out != "app" {
		t.Errorf("host name in the debug container: %q, want app", out)
	}
	if out := h.must(t, "exec", "app", "-c", "sh", "--", "cat", "/proc/net/fib_trie"); !strings.Contains(out, app.Status.PodIP) {
		t.Errorf("the debug container is not in the pod's network namespace (no %s):\n%s", app.Status.PodIP, out)
	}

	// Interactive, on a terminal: kubectl debug -it, as a user types it.
	debugTerminal(t, h)

	// An exited ephemeral container stays exited.
	time.Sleep(3 * time.Second)
	p, err := h.pod("app")
	if err != nil {
		t.Fatal(err)
	}
	if s := ephemeralStatus(p, "ps"); s == nil || s.State.Terminated == nil || s.RestartCount != 0 {
		t.Errorf("the exited debug container was restarted: %+v", s)
	}
	if s := p.Status.ContainerStatuses; len(s) != 1 || !s[0].Ready || s[0].RestartCount != 0 || p.Status.Phase != corev1.PodRunning {
		t.Errorf("debugging changed the pod's own status: %s", p.Status.String())
	}
}

// ephemeralStatus returns the status of a pod's ephemeral container.
func ephemeralStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for i, s := range p.Status.EphemeralContainerStatuses {
		if s.Name == name {
			return &p.Status.EphemeralContainerStatuses[i]
		}
	}
	return nil
}

// debugTerminal runs `kubectl debug -it app --target=c` on a pseudo-terminal
// and types into the shell of the debug container: it runs on a terminal
// and sees the target container's process.
func debugTerminal(t *testing.T, h *labHub) {
	t.Helper()
	master, slave, err := openTerminal()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := h.streamCmd(ctx, "debug", "-it", "app", "--image="+images.Sleeper, "--image-pull-policy=Never",
		"--target=c", "--container=tty", "--", "sh")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	out := &syncBuffer{}
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(out, master); close(copied) }()
	// kubectl attaches once the container runs; the shell's first prompt
	// may have gone before, so a new line asks for another.
	eventually(t, 30*time.Second, "a shell prompt in the debug container", func() (bool, string) {
		if strings.Contains(out.String(), "# ") {
			return true, ""
		}
		_, _ = io.WriteString(master, "\r")
		return false, out.String()
	})
	if _, err := io.WriteString(master, "tty; ps; exit\r"); err != nil {
		t.Fatal(err)
	}
	waitErr := cmd.Wait()
	master.Close()
	<-copied
	got := out.String()
	for _, want := range []string{"/dev/pts/", "/testapp sleep"} {
		if !strings.Contains(got, want) {
			t.Errorf("kubectl debug -it: the terminal lacks %q:\n%s", want, got)
		}
	}
	if ctx.Err() != nil {
		t.Errorf("kubectl debug -it did not end when the shell exited: %v\n%s", waitErr, got)
	}
}
