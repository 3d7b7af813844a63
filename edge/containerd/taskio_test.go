package containerd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/testbench/images"
)

// TestTaskIO checks the copy of containers' output to their logs and of
// attached input to their stdin: streams kept apart, no output lost when a
// container writes more than a FIFO holds, a terminal's output, stdin, and
// no read buffer held by containers that write nothing.
func TestTaskIO(t *testing.T) {
	e := newTestRuntime(t, "10.231.7.0/24")
	sh := func(name, script string) corev1.Container {
		return corev1.Container{Name: name, Image: images.Sleeper, Command: []string{"/bin/sh", "-c", script}}
	}
	const lines = 5000
	pod := testPod("io",
		sh("streams", "echo to-stdout; echo to-stderr >&2; exec sleep 3600"),
		// About 60 KB at once: more than a FIFO's 64 KiB pipe holds
		// with the log prefixes the agent writes, in many reads.
		sh("bulk", fmt.Sprintf("i=0; while [ $i -lt %d ]; do echo bulk-line-$i; i=$((i+1)); done; exec sleep 3600", lines)),
		func() corev1.Container {
			c := sh("tty", "echo from-the-terminal; exec sleep 3600")
			c.TTY, c.Stdin = true, true
			return c
		}(),
		corev1.Container{Name: "cat", Image: images.Sleeper, Command: []string{"/bin/cat"}, Stdin: true},
	)
	e.syncUntil(t, pod, 60*time.Second, "all running", func(st *edge.PodStatus) bool {
		for _, c := range []string{"streams", "bulk", "tty", "cat"} {
			if !running(c)(st) {
				return false
			}
		}
		return true
	})
	logs := func(container string) string {
		var b bytes.Buffer
		if err := e.rt.ContainerLogs(context.Background(), pod.UID, container, edge.LogOptions{TailLines: -1}, &b); err != nil {
			t.Fatalf("logs of %s: %v", container, err)
		}
		return b.String()
	}
	waitLog := func(container, want string) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			l := logs(container)
			if strings.Contains(l, want) {
				return l
			}
			if time.Now().After(deadline) {
				t.Fatalf("log of %s lacks %q after 20s:\n%.2000s", container, want, l)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// Each line's stream is the one it was written to.
	raw := func(container string) string {
		t.Helper()
		p := e.rt.pod(pod.UID)
		p.mu.Lock()
		path := p.find(container).cur.logPath
		p.mu.Unlock()
		f, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		for _, line := range bytes.Split(bytes.TrimSuffix(f, []byte("\n")), []byte("\n")) {
			l, ok := parseLogLine(line)
			if !ok {
				t.Fatalf("log line %q", line)
			}
			fmt.Fprintf(&b, "%s %s\n", l.stream, l.msg)
		}
		return b.String()
	}
	waitLog("streams", "to-stderr")
	if r := raw("streams"); !strings.Contains(r, "stdout to-stdout\n") || !strings.Contains(r, "stderr to-stderr\n") {
		t.Errorf("streams log:\n%s", r)
	}

	l := waitLog("bulk", fmt.Sprintf("bulk-line-%d\n", lines-1))
	for i := range lines {
		if !strings.Contains(l, fmt.Sprintf("bulk-line-%d\n", i)) {
			t.Fatalf("bulk log lacks line %d of %d", i, lines)
		}
	}
	if n := strings.Count(l, "\n"); n != lines {
		t.Errorf("bulk log has %d lines, want %d", n, lines)
	}

	waitLog("tty", "from-the-terminal")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		_ = e.rt.Attach(ctx, pod.UID, "cat", edge.Streams{Stdin: strings.NewReader("through-stdin\n"), Stdout: io.Discard})
	}()
	waitLog("cat", "through-stdin")

	// Containers that write nothing hold no read buffer.
	deadline := time.Now().Add(5 * time.Second)
	for outputBufsHeld.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d output buffers held by idle containers", outputBufsHeld.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Stopping the pod ends the copies (KillPod deletes the tasks, which
	// waits for them).
	if err := e.rt.KillPod(context.Background(), pod.UID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.RemovePod(context.Background(), pod.UID); err != nil {
		t.Fatal(err)
	}
}

// TestTaskIOKeepsOutputAtExit checks that a container's last output is in
// its log when it has exited: what its shim still held in the pipe and the
// FIFO when the exit was seen is copied before the copies stop. A crashing
// container's last lines are the ones its user reads.
func TestTaskIOKeepsOutputAtExit(t *testing.T) {
	if !images.HasShell() {
		t.Skip("needs a static busybox for the container's shell")
	}
	e := newTestRuntime(t, "10.231.8.0/24")
	// About 250 KB, written as fast as the shell can: more than the pipe
	// and the FIFO hold together, so that the exit comes while output is
	// still on its way.
	const lines = 20000
	pod := testPod("burst", corev1.Container{Name: "burst", Image: images.Sleeper, Command: []string{"/bin/sh", "-c",
		fmt.Sprintf("i=0; while [ $i -lt %d ]; do echo burst-line-$i; i=$((i+1)); done; echo last-words; exit 3", lines)}})
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	st := e.syncUntil(t, pod, 60*time.Second, "burst exited", func(st *edge.PodStatus) bool {
		return len(st.Containers) == 1 && st.Containers[0].State == edge.ContainerExited
	})
	if c := st.Containers[0]; c.ExitCode != 3 {
		t.Errorf("exit code %d, want 3", c.ExitCode)
	}
	var b bytes.Buffer
	if err := e.rt.ContainerLogs(context.Background(), pod.UID, "burst", edge.LogOptions{TailLines: -1}, &b); err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(got) != lines+1 || got[len(got)-1] != "last-words" {
		last := ""
		if len(got) > 0 {
			last = got[len(got)-1]
		}
		t.Fatalf("the log of the exited container has %d lines ending with %q, want %d ending with \"last-words\"", len(got), last, lines+1)
	}
	for i, l := range got[:lines] {
		if want := fmt.Sprintf("burst-line-%d", i); l != want {
			t.Fatalf("line %d of the log is %q, want %q", i, l, want)
		}
	}
}
