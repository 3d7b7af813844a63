package containerd

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/testbench/images"
)

// These tests join an in-process agent running the containerd runtime to
// a real hub process and drive it with the real kubectl.

type lab struct {
	t     *testing.T // the test that owns the lab (its cleanups outlive subtests)
	hub   *hubtest.Hub
	env   *testEnv
	token string
	dir   string // the agent's data directory (= the runtime's)
	agent *labAgent
	opts  labOptions
}

// labOptions change a lab's hub and agent.
type labOptions struct {
	hubArgs []string
	// localPathRoot is the hub's and the runtime's local-path root.
	localPathRoot string
	// agent adjusts the agent's configuration.
	agent func(*edge.Config)
	// handlers are the runtime's handlers beyond runc.
	handlers map[string]RuntimeHandler
}

type labAgent struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error
}

func (a *labAgent) stop(t *testing.T) {
	a.cancel()
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not stop")
	}
}

func startLab(t *testing.T) *lab {
	t.Helper()
	return startLabWith(t, labOptions{})
}

func startLabWith(t *testing.T, opts labOptions) *lab {
	t.Helper()
	requireContainerd(t)
	if opts.localPathRoot != "" {
		opts.hubArgs = append(opts.hubArgs, "--local-path-root", opts.localPathRoot)
	}
	h := hubtest.Start(t, opts.hubArgs...)
	out, err := exec.Command(h.Bin, "token", "create", "--kubeconfig", h.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, h.Logs())
	}
	env := newTestRuntime(t, "10.42.0.0/24")
	env.rt.Close()
	env.localPathRoot = opts.localPathRoot
	env.handlers = opts.handlers
	l := &lab{t: t, hub: h, env: env, token: strings.TrimSpace(string(out)), dir: env.dir, opts: opts}
	env.rt = nil
	l.startAgent(t)
	return l
}

// startAgent starts the runtime and the agent on the lab's data
// directory, as `tether edge` does after a restart.
func (l *lab) startAgent(t *testing.T) {
	t.Helper()
	l.env.rt = l.env.start(t)
	cfg := edge.Config{
		HubURL: "https://" + l.hub.Addr, Token: l.token, DataDir: l.dir, NodeName: "edge-c",
		NodeIP: netip.MustParseAddr("127.0.0.1"), Runtime: l.env.rt, StatusCheckInterval: time.Second,
		TunnelBackoffCap: 2 * time.Second, MetricsPeriod: labMetricsPeriod,
	}
	if l.opts.agent != nil {
		l.opts.agent(&cfg)
	}
	a, err := edge.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	la := &labAgent{cancel: cancel, done: make(chan struct{})}
	go func() { la.err = a.Run(ctx); close(la.done) }()
	l.agent = la
	l.t.Cleanup(func() { cancel(); <-la.done })
}

func (l *lab) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := l.hub.Run(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (l *lab) apply(t *testing.T, yaml string) {
	t.Helper()
	if out, err := l.hub.RunInput(context.Background(), yaml, nil, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

func (l *lab) waitFor(t *testing.T, timeout time.Duration, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, s := f()
		if ok {
			return
		}
		last = s
		time.Sleep(200 * time.Millisecond)
	}
	pods, _ := l.hub.Run("get", "pods", "-o", "wide")
	events, _ := l.hub.Run("get", "events", "--sort-by", ".lastTimestamp")
	t.Fatalf("%s: not within %v; last: %s\npods:\n%s\nevents:\n%s", what, timeout, last, pods, events)
}

func (l *lab) waitPodPhase(t *testing.T, name, jsonpath, want string) {
	t.Helper()
	l.waitFor(t, 60*time.Second, "pod "+name+" "+jsonpath+"="+want, func() (bool, string) {
		out, err := l.hub.Run("get", "pod", name, "-o", "jsonpath="+jsonpath)
		return err == nil && out == want, out + errString(err)
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return " " + err.Error()
}

const labObjects = `
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data: {greeting: hello, mode: fast}
---
apiVersion: v1
kind: Secret
metadata: {name: app-secret}
stringData: {password: s3cret}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: %[1]s
        imagePullPolicy: Never
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: full, labels: {tier: test}}
spec:
  initContainers:
  - {name: init-1, image: %[2]s, imagePullPolicy: Never, command: [/bin/sh, -c, "echo one > /work/order"], volumeMounts: [{name: work, mountPath: /work}]}
  - {name: init-2, image: %[2]s, imagePullPolicy: Never, command: [/bin/sh, -c, "echo two >> /work/order"], volumeMounts: [{name: work, mountPath: /work}]}
  containers:
  - name: app
    image: %[1]s
    imagePullPolicy: Never
    env:
    - {name: GREETING, valueFrom: {configMapKeyRef: {name: app-config, key: greeting}}}
    - {name: PASSWORD, valueFrom: {secretKeyRef: {name: app-secret, key: password}}}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    - {name: MEM, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    envFrom: [{prefix: CFG_, configMapRef: {name: app-config}}]
    resources: {limits: {memory: 64Mi}}
    volumeMounts:
    - {name: work, mountPath: /work}
    - {name: config, mountPath: /etc/config}
    - {name: secret, mountPath: /etc/secret}
  volumes:
  - {name: work, emptyDir: {}}
  - {name: config, configMap: {name: app-config, items: [{key: greeting, path: greeting.txt, mode: 0600}]}}
  - {name: secret, secret: {secretName: app-secret, defaultMode: 0400}}
`

func TestLabPodsOnContainerd(t *testing.T) {
	if !images.HasShell() {
		t.Skip("needs a static busybox (busybox-static) for the test image's shell")
	}
	l := startLab(t)
	l.waitFor(t, 60*time.Second, "node Ready", func() (bool, string) {
		out, err := l.hub.Run("get", "node", "edge-c", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True", out + errString(err)
	})
	l.apply(t, fmt.Sprintf(labObjects, images.Echo, images.Sleeper))
	l.waitPodPhase(t, "full", "{.status.phase}", "Running")
	l.waitFor(t, 60*time.Second, "deployment available", func() (bool, string) {
		out, err := l.hub.Run("get", "deploy", "web", "-o", "jsonpath={.status.availableReplicas}")
		return out == "1", out + errString(err)
	})

	t.Run("init containers ran in order", func(t *testing.T) {
		if out := l.kubectl(t, "exec", "full", "-c", "app", "--", "cat", "/work/order"); out != "one\ntwo\n" {
			t.Errorf("order file %q", out)
		}
	})
	t.Run("env and volumes", func(t *testing.T) {
		env := l.kubectl(t, "exec", "full", "--", "env")
		for _, want := range []string{"GREETING=hello", "PASSWORD=s3cret", "NODE=edge-c", "MEM=64", "CFG_mode=fast", "CFG_greeting=hello"} {
			if !strings.Contains(env, want+"\n") {
				t.Errorf("env lacks %s:\n%s", want, env)
			}
		}
		if out := l.kubectl(t, "exec", "full", "--", "cat", "/etc/config/greeting.txt"); out != "hello" {
			t.Errorf("config file %q", out)
		}
		if out := l.kubectl(t, "exec", "full", "--", "stat", "-L", "-c", "%a", "/etc/config/greeting.txt", "/etc/secret/password"); out != "600\n400\n" {
			t.Errorf("modes %q", out)
		}
		if out := l.kubectl(t, "exec", "full", "--", "cat", "/etc/secret/password"); out != "s3cret" {
			t.Errorf("secret file %q", out)
		}
	})
	t.Run("configmap update reaches the volume", func(t *testing.T) {
		l.kubectl(t, "patch", "configmap", "app-config", "-p", `{"data":{"greeting":"bonjour"}}`)
		l.waitFor(t, 30*time.Second, "updated file", func() (bool, string) {
			out, err := l.hub.Run("exec", "full", "--", "cat", "/etc/config/greeting.txt")
			return out == "bonjour", out + errString(err)
		})
	})
	t.Run("exec with stdin and exit code", func(t *testing.T) {
		out, err := l.hub.RunInput(context.Background(), "from stdin\n", nil, "exec", "-i", "full", "--", "cat")
		if err != nil || out != "from stdin\n" {
			t.Errorf("exec -i: %q %v", out, err)
		}
		_, err = l.hub.Run("exec", "full", "--", "sh", "-c", "exit 7")
		if err == nil || !strings.Contains(err.Error(), "exit code 7") {
			t.Errorf("exit code: %v", err)
		}
	})
	t.Run("exec -it through a pty", func(t *testing.T) {
		// kubectl sees a real terminal: it asks for a TTY, puts the
		// terminal in raw mode and sends its size; the container's shell
		// runs on a pty of the same size.
		master, slave, err := openPTY()
		if err != nil {
			t.Fatal(err)
		}
		defer master.Close()
		if err := unix.IoctlSetWinsize(int(slave.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 41, Col: 107}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, l.hub.Kubectl, "--kubeconfig", l.hub.Kubeconfig, "--cache-dir", l.hub.CacheDir,
			"exec", "-it", "full", "-c", "app", "--", "sh")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		slave.Close()
		out := &lockedBuffer{}
		copied := make(chan struct{})
		go func() { io.Copy(out, master); close(copied) }()
		l.waitFor(t, 15*time.Second, "a shell prompt", func() (bool, string) {
			return strings.Contains(out.String(), "#") || strings.Contains(out.String(), "$"), out.String()
		})
		io.WriteString(master, "stty size; tty; echo $((6*7))-answer; exit 3\r")
		err = cmd.Wait()
		<-copied
		got := out.String()
		for _, want := range []string{"41 107", "/dev/pts/", "42-answer"} {
			if !strings.Contains(got, want) {
				t.Errorf("terminal output lacks %q:\n%s", want, got)
			}
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Errorf("kubectl exec -it: want exit code 3, got %v", err)
		}
	})
	t.Run("logs", func(t *testing.T) {
		if out := l.kubectl(t, "logs", "deploy/web"); !strings.Contains(out, "listening on :8080") {
			t.Errorf("logs %q", out)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, l.hub.Kubectl, "--kubeconfig", l.hub.Kubeconfig, "logs", "-f", "full", "-c", "app", "--timestamps")
		cmd.Env = append(os.Environ(), "KUBECACHEDIR="+l.hub.CacheDir)
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		// The server prints a line per request of /file: follow must
		// show a line written after the stream opened.
		time.Sleep(500 * time.Millisecond)
		l.kubectl(t, "exec", "full", "--", "sh", "-c", "echo followed-line > /proc/1/fd/1")
		buf := make([]byte, 0, 4096)
		tmp := make([]byte, 1024)
		for !strings.Contains(string(buf), "followed-line") {
			n, err := stdout.Read(tmp)
			if err != nil {
				t.Fatalf("logs -f: %v; got %q", err, buf)
			}
			buf = append(buf, tmp[:n]...)
		}
	})
	t.Run("logs options", func(t *testing.T) {
		// An init container that prints, and a container whose first
		// run prints and fails, and whose second prints and stays.
		l.apply(t, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: chatty}
spec:
  initContainers:
  - {name: prep, image: %[1]s, imagePullPolicy: Never, command: [/bin/sh, -c, "echo prep-ran"]}
  containers:
  - name: talk
    image: %[1]s
    imagePullPolicy: Never
    command: [/bin/sh, -c, "for i in 1 2 3; do echo line-$i; done; if [ ! -f /work/once ]; then touch /work/once; echo first-run; exit 1; fi; echo second-run; exec sleep 3600"]
    volumeMounts: [{name: work, mountPath: /work}]
  volumes: [{name: work, emptyDir: {}}]
`, images.Sleeper))
		defer l.kubectl(t, "delete", "pod", "chatty", "--now", "--wait=true", "--timeout=60s")
		l.waitFor(t, 60*time.Second, "chatty restarted once and running", func() (bool, string) {
			out, err := l.hub.Run("get", "pod", "chatty", "-o", `jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].state.running.startedAt}`)
			return strings.HasPrefix(out, "1 ") && len(out) > 2, out + errString(err)
		})
		lines := func(out string) []string { return strings.Split(strings.TrimSpace(out), "\n") }
		if got := lines(l.kubectl(t, "logs", "chatty", "-c", "talk")); strings.Join(got, ",") != "line-1,line-2,line-3,second-run" {
			t.Errorf("logs: %q", got)
		}
		if got := lines(l.kubectl(t, "logs", "chatty", "-c", "talk", "--previous")); strings.Join(got, ",") != "line-1,line-2,line-3,first-run" {
			t.Errorf("logs --previous: %q", got)
		}
		if got := lines(l.kubectl(t, "logs", "chatty", "-c", "talk", "--tail=2")); strings.Join(got, ",") != "line-3,second-run" {
			t.Errorf("logs --tail=2: %q", got)
		}
		got := lines(l.kubectl(t, "logs", "chatty", "-c", "talk", "--tail=1", "--timestamps"))
		if ts, line, ok := strings.Cut(got[0], " "); len(got) != 1 || !ok || line != "second-run" {
			t.Errorf("logs --tail=1 --timestamps: %q", got)
		} else if at, err := time.Parse(time.RFC3339Nano, ts); err != nil || time.Since(at) > 5*time.Minute || time.Since(at) < 0 {
			t.Errorf("logs --timestamps: timestamp %q: %v", ts, err)
		}
		if out := l.kubectl(t, "logs", "chatty", "-c", "talk", "--since=1h"); !strings.Contains(out, "second-run") {
			t.Errorf("logs --since=1h: %q", out)
		}
		// Nothing was written in the last second: the container has
		// been quiet since its second start.
		time.Sleep(2 * time.Second)
		if out := l.kubectl(t, "logs", "chatty", "-c", "talk", "--since=1s"); out != "" {
			t.Errorf("logs --since=1s: %q, want nothing", out)
		}
		// kubectl asks for each container's log apart, in no set order.
		all := l.kubectl(t, "logs", "chatty", "--all-containers")
		if !strings.Contains(all, "prep-ran") || !strings.Contains(all, "second-run") {
			t.Errorf("logs --all-containers: %q", all)
		}
	})
	t.Run("port-forward with parallel transfers", func(t *testing.T) {
		port := freePort(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cmd := exec.CommandContext(ctx, l.hub.Kubectl, "--kubeconfig", l.hub.Kubeconfig, "port-forward", "deploy/web", fmt.Sprintf("%d:8080", port))
		cmd.Env = append(os.Environ(), "KUBECACHEDIR="+l.hub.CacheDir)
		out := &lockedBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); cmd.Wait() }()
		l.waitFor(t, 20*time.Second, "port-forward ready", func() (bool, string) {
			return strings.Contains(out.String(), "Forwarding from"), out.String()
		})
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/file?path=/testapp", port))
				if err != nil {
					errs <- err
					return
				}
				defer resp.Body.Close()
				n, err := io.Copy(io.Discard, resp.Body)
				if err != nil || n < 1<<20 {
					errs <- fmt.Errorf("read %d bytes: %v", n, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
	t.Run("cp", func(t *testing.T) {
		src := filepath.Join(t.TempDir(), "in.txt")
		os.WriteFile(src, []byte("copied content\n"), 0o644)
		l.kubectl(t, "cp", src, "default/full:/tmp/in.txt", "-c", "app")
		if out := l.kubectl(t, "exec", "full", "--", "cat", "/tmp/in.txt"); out != "copied content\n" {
			t.Errorf("cp in: %q", out)
		}
		dst := filepath.Join(t.TempDir(), "out.txt")
		l.kubectl(t, "cp", "default/full:/tmp/in.txt", dst, "-c", "app")
		if b, _ := os.ReadFile(dst); string(b) != "copied content\n" {
			t.Errorf("cp out: %q", b)
		}
	})
	t.Run("kubelet events", func(t *testing.T) {
		want := []string{
			"Pulled spec.initContainers{init-1} kubelet/edge-c",
			"Created spec.initContainers{init-1} kubelet/edge-c",
			"Started spec.initContainers{init-1} kubelet/edge-c",
			"Started spec.initContainers{init-2} kubelet/edge-c",
			"Pulled spec.containers{app} kubelet/edge-c",
			"Created spec.containers{app} kubelet/edge-c",
			"Started spec.containers{app} kubelet/edge-c",
		}
		l.waitFor(t, 30*time.Second, "the kubelet's events of pod full", func() (bool, string) {
			out, err := l.hub.Run("get", "events", "--field-selector", "involvedObject.name=full", "-o",
				`jsonpath={range .items[*]}{.reason} {.involvedObject.fieldPath} {.source.component}/{.source.host}{"\n"}{end}`)
			for _, w := range want {
				if !strings.Contains(out, w+"\n") {
					return false, out + errString(err)
				}
			}
			return true, ""
		})
		out := l.kubectl(t, "describe", "pod", "full")
		if !strings.Contains(out, "Started container app") || !strings.Contains(out, "already present on machine") {
			t.Errorf("kubectl describe pod shows no kubelet events:\n%s", out)
		}
	})
	t.Run("volume waits", func(t *testing.T) { labVolumeWaits(t, l) })
	t.Run("lifecycle, probes and DNS", func(t *testing.T) { labLifecycle(t, l) })
	t.Run("kubectl top pod of a burner agrees with its cgroup", func(t *testing.T) { labTop(t, l) })
	t.Run("delete", func(t *testing.T) {
		// The agent stops the containers and then finalizes the pod.
		l.kubectl(t, "delete", "pod", "-l", "app=web", "--wait=true", "--timeout=60s")
	})
	t.Run("agent restart adopts running containers", func(t *testing.T) {
		before := l.kubectl(t, "get", "pod", "full", "-o", "jsonpath={.status.containerStatuses[0].containerID}")
		l.agent.stop(t)
		l.env.rt.Close()
		l.startAgent(t)
		time.Sleep(3 * time.Second)
		l.waitPodPhase(t, "full", "{.status.containerStatuses[0].ready}", "true")
		after := l.kubectl(t, "get", "pod", "full", "-o", "jsonpath={.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}")
		if after != before+" 0" {
			t.Errorf("container after agent restart: %q, before %q", after, before)
		}
	})
	t.Run("offline restart", func(t *testing.T) {
		// The hub goes away, then the agent restarts: the pod runs on
		// from the local state, its containers adopted, and the hub
		// hears of it when it is back.
		before := l.kubectl(t, "get", "pod", "full", "-o", "jsonpath={.metadata.uid} {.status.containerStatuses[0].containerID}")
		uid, id, _ := strings.Cut(before, " ")
		l.hub.Stop()
		l.agent.stop(t)
		l.env.rt.Close()
		start := time.Now()
		l.startAgent(t)
		l.waitFor(t, 30*time.Second, "pod running from the local state with the hub down", func() (bool, string) {
			st, err := l.env.rt.PodStatus(context.Background(), types.UID(uid))
			if err != nil {
				return false, err.Error()
			}
			for _, c := range st.Containers {
				if c.Name == "app" {
					return c.State == edge.ContainerRunning && c.Ready && c.ID == id && c.RestartCount == 0,
						fmt.Sprintf("%s %s ready=%v restarts=%d", c.ID, c.State, c.Ready, c.RestartCount)
				}
			}
			return false, "no app container"
		})
		t.Logf("pod ready again %v after the agent restarted with the hub down", time.Since(start).Round(time.Millisecond))
		l.hub.Restart()
		l.waitPodPhase(t, "full", "{.status.containerStatuses[0].ready}", "true")
		after := l.kubectl(t, "get", "pod", "full", "-o", "jsonpath={.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}")
		if after != id+" 0" {
			t.Errorf("container after an offline restart: %q, before %q", after, id)
		}
	})
	t.Run("delete after agent restart", func(t *testing.T) {
		l.kubectl(t, "delete", "pod", "full", "--wait=true", "--timeout=60s")
	})
}

// openPTY opens a pseudo-terminal pair.
func openPTY() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestLabNodeRebootOffline reboots the node while the hub is down: the
// agent, containerd, its shims and every container die. The agent comes
// back before the hub and runs all the node's pods again from its local
// state; the time until all 30 run is the benchmark's figure (≤ 10 s).
func TestLabNodeRebootOffline(t *testing.T) {
	const n = 30
	l := startLab(t)
	l.waitFor(t, 60*time.Second, "node Ready", func() (bool, string) {
		out, err := l.hub.Run("get", "node", "edge-c", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True", out + errString(err)
	})
	l.apply(t, fmt.Sprintf(`
apiVersion: apps/v1
kind: Deployment
metadata: {name: fleet}
spec:
  replicas: %d
  selector: {matchLabels: {app: fleet}}
  template:
    metadata: {labels: {app: fleet}}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{name: app, image: %s, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Pod
metadata: {name: with-init}
spec:
  terminationGracePeriodSeconds: 1
  initContainers: [{name: setup, image: %[2]s, imagePullPolicy: Never, command: [/testapp, crash, "0"]}]
  containers: [{name: app, image: %[2]s, imagePullPolicy: Never}]
`, n, images.Sleeper))
	var uids []string
	l.waitFor(t, 3*time.Minute, fmt.Sprintf("%d pods Running", n), func() (bool, string) {
		out, err := l.hub.Run("get", "pods", "-l", "app=fleet", "-o", `jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.uid}{" "}{end}`)
		uids = strings.Fields(out)
		return len(uids) == n, fmt.Sprintf("%d running%s", len(uids), errString(err))
	})
	var initUID string
	l.waitFor(t, time.Minute, "the pod with an init container Running", func() (bool, string) {
		out, err := l.hub.Run("get", "pod", "with-init", "-o", `jsonpath={.status.phase} {.metadata.uid}`)
		phase, uid, _ := strings.Cut(out, " ")
		initUID = uid
		return phase == "Running", out + errString(err)
	})
	// The pod's API token, issued by the hub for the pod's service
	// account volume.
	tokenBefore := strings.TrimSpace(l.kubectl(t, "exec", "with-init", "-c", "app", "--", "cat", saTokenPath))

	// The reboot, with the hub down.
	l.hub.Stop()
	l.agent.stop(t)
	ctx := context.Background()
	var pids []int
	if conts, err := l.env.rt.client.Containers(ctx); err == nil {
		for _, c := range conts {
			if task, err := c.Task(ctx, nil); err == nil {
				pids = append(pids, int(task.Pid()))
			}
		}
	}
	containers := len(pids)
	daemon := l.env.rt.DaemonPID()
	l.env.rt.Close() // no restart of the daemon it supervises
	shims := shimPIDs(t, l.dir)
	if containers < n+1 || len(shims) == 0 {
		t.Fatalf("found %d container processes and %d shims to kill", containers, len(shims))
	}
	pids = append(pids, shims...)
	if daemon != 0 {
		pids = append(pids, daemon)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, pid := range pids {
		for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Logf("killed containerd (pid %d), %d shims and %d container processes", daemon, len(shims), containers)
	// /var/run is a tmpfs: the pods' network namespaces go with the
	// reboot, and with them the pods' ends of their veths.
	for _, uid := range append(slices.Clone(uids), initUID) {
		if err := netns.DeleteNamed(netnsName(types.UID(uid))); err != nil {
			t.Errorf("remove the network namespace of pod %s: %v", uid, err)
		}
	}
	// So do the NAT rules the CNI bridge plugin made for the pods.
	flushPodNAT(t, append(slices.Clone(uids), initUID))
	// And the in-memory volumes: the pods' Secrets and service account
	// tokens, which the agent must set up again from its local state.
	unmountTmpfsUnder(t, l.dir)

	start := time.Now()
	l.startAgent(t)
	l.waitFor(t, 60*time.Second, "all pods running again from the local state", func() (bool, string) {
		running := 0
		for _, uid := range uids {
			st, err := l.env.rt.PodStatus(ctx, types.UID(uid))
			if err == nil && len(st.Containers) == 1 && st.Containers[0].State == edge.ContainerRunning {
				running++
			}
		}
		return running == n, fmt.Sprintf("%d of %d running", running, n)
	})
	took := time.Since(start)
	t.Logf("node reboot with the hub down: %d pods running again %v after the agent started (target ≤ 10s)", n, took.Round(time.Millisecond))

	// The pod's sandbox was made anew, so its init container ran again,
	// to completion, before its app container started, as the kubelet
	// does.
	l.waitFor(t, 30*time.Second, "the init container run again, then the app container", func() (bool, string) {
		st, err := l.env.rt.PodStatus(ctx, types.UID(initUID))
		if err != nil || len(st.InitContainers) != 1 || len(st.Containers) != 1 {
			return false, fmt.Sprintf("%+v %v", st, err)
		}
		ic, app := st.InitContainers[0], st.Containers[0]
		return ic.State == edge.ContainerExited && ic.ExitCode == 0 && ic.RestartCount == 1 && ic.StartedAt.After(start) &&
				app.State == edge.ContainerRunning && !app.StartedAt.Before(ic.FinishedAt),
			fmt.Sprintf("init %s exit %d restarts %d started %v finished %v; app %s started %v (agent started %v)",
				ic.State, ic.ExitCode, ic.RestartCount, ic.StartedAt, ic.FinishedAt, app.State, app.StartedAt, start)
	})
	if took > 30*time.Second {
		t.Errorf("pods took %v to run again after the reboot", took)
	}

	// The pod runs again, with the hub still down, with the token the
	// agent kept in its local state: still valid and bound to the pod.
	var tok strings.Builder
	if _, err := l.env.rt.Exec(ctx, types.UID(initUID), "app", []string{"cat", saTokenPath}, edge.Streams{Stdout: &tok}); err != nil {
		t.Fatalf("read the token of the restarted pod offline: %v", err)
	}
	tokenAfter := strings.TrimSpace(tok.String())
	if tokenAfter != tokenBefore {
		t.Errorf("the pod restarted offline with another token than the one it had")
	}
	claims := jwtClaims(t, tokenAfter)
	exp, _ := claims["exp"].(float64)
	if left := time.Until(time.Unix(int64(exp), 0)); left < 30*time.Minute {
		t.Errorf("the token of the pod restarted offline expires in %v", left)
	}
	k8s, _ := claims["kubernetes.io"].(map[string]any)
	if bound, _ := k8s["pod"].(map[string]any); bound["name"] != "with-init" || bound["uid"] != initUID {
		t.Errorf("the token of the pod restarted offline is bound to %v, want with-init %s", k8s["pod"], initUID)
	}

	// The hub comes back and hears the pods run.
	l.hub.Restart()
	l.waitFor(t, 60*time.Second, "the hub sees all pods Running and ready", func() (bool, string) {
		out, err := l.hub.Run("get", "pods", "-l", "app=fleet", "-o", `jsonpath={range .items[*]}{.status.containerStatuses[0].ready}{" "}{end}`)
		ready := strings.Count(out, "true")
		return ready == n, fmt.Sprintf("%d ready%s", ready, errString(err))
	})
	// The hub still takes the token the pod restarted with.
	review := l.kubectl(t, "create", "-o", "jsonpath={.status.authenticated} {.status.user.username}", "-f", writeTemp(t, fmt.Sprintf(
		`{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": %q}}`, tokenAfter)))
	if review != "true system:serviceaccount:default:default" {
		t.Errorf("TokenReview of the token the pod restarted with offline: %q", review)
	}
	l.kubectl(t, "delete", "deploy", "fleet", "--wait=true", "--timeout=60s")
	l.kubectl(t, "delete", "pod", "with-init", "--wait=true", "--timeout=60s")
}

// flushPodNAT removes the NAT rules and chains the CNI bridge plugin made
// for the pods, as a reboot does.
func flushPodNAT(t *testing.T, uids []string) {
	t.Helper()
	if _, err := exec.LookPath("iptables"); err != nil {
		return // the bridge plugin made none
	}
	out, err := exec.Command("iptables", "-t", "nat", "-S", "POSTROUTING").Output()
	if err != nil {
		t.Fatalf("iptables -S: %v", err)
	}
	chains := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "-A POSTROUTING ") || !slices.ContainsFunc(uids, func(u string) bool { return strings.Contains(line, u) }) {
			continue
		}
		f := strings.Fields(line)
		if i := slices.Index(f, "-j"); i >= 0 && i+1 < len(f) {
			chains[f[i+1]] = true
		}
		// The rule as iptables-restore would read it, deleted.
		if out, err := exec.Command("sh", "-c", "iptables -t nat -D "+strings.TrimPrefix(line, "-A ")).CombinedOutput(); err != nil {
			t.Fatalf("delete %q: %v\n%s", line, err, out)
		}
	}
	for c := range chains {
		exec.Command("iptables", "-t", "nat", "-F", c).Run()
		if out, err := exec.Command("iptables", "-t", "nat", "-X", c).CombinedOutput(); err != nil {
			t.Fatalf("delete chain %s: %v\n%s", c, err, out)
		}
	}
}

// shimPIDs finds the containerd shims serving the daemon whose state is
// under dir.
func shimPIDs(t *testing.T, dir string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, "containerd-shim") && strings.Contains(cmd, dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// saTokenPath is where a container finds its service account token.
const saTokenPath = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// jwtClaims decodes the claims of a JWT, unverified.
func jwtClaims(t *testing.T, token string) map[string]any {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %q", token)
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatalf("decode JWT claims: %v", err)
	}
	var claims map[string]any
	if err := json.Unmarshal(b, &claims); err != nil {
		t.Fatalf("decode JWT claims: %v", err)
	}
	return claims
}

// writeTemp writes content to a file of the test's and returns its path.
func writeTemp(t *testing.T, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "object.json")
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// unmountTmpfsUnder unmounts the tmpfs file systems mounted below dir, as
// a reboot loses them.
func unmountTmpfsUnder(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 || g[0] != "tmpfs" || !strings.HasPrefix(f[4], dir+"/") {
			continue
		}
		if err := unix.Unmount(f[4], unix.MNT_DETACH); err != nil {
			t.Fatalf("unmount %s: %v", f[4], err)
		}
		n++
	}
	t.Logf("unmounted %d tmpfs volumes", n)
}
