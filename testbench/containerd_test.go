package testbench

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/testbench/images"
)

var labPartition = flag.Duration("lab.partition", 60*time.Second,
	"how long TestContainerdEdgeThroughNAT cuts its site off from the hub (the acceptance scenario's length is 10m)")

// The registry on the hub's side of the lab, and its only credentials.
const (
	labRegistry                = "10.213.0.1:5000"
	labRegUser, labRegPassword = "edge", "pull-s3cret"
)

// TestContainerdEdgeThroughNAT runs a real `tether edge --runtime
// containerd` agent on a node behind its site's NAT router, with the hub
// on the other side of the site's uplink; the agent starts its own
// containerd. Every kubectl command runs in the hub's namespace, so logs,
// exec, port-forward and cp reach the node only through the hub and the
// node's QUIC tunnel. The site is then cut off (-lab.partition, 60s by
// default; the acceptance scenario runs 10m): the pods keep running and
// a pod failing its liveness probe keeps restarting; the agent restarts
// inside the partition and adopts the running containers; then the node
// reboots inside the partition (agent, containerd, shims and containers
// killed, memory cleared) and runs every pod again from its local state.
// After the heal the hub shows the restart counts and readiness the node
// has, and the same pods. The node also runs the built-in ingress
// controller (natIngress).
func TestContainerdEdgeThroughNAT(t *testing.T) {
	requireContainerdNode(t)
	began := time.Now()
	dir := t.TempDir()
	l, h, archive := upCtrLab(t, dir, 1024, SiteSpec{Name: "shop", Nodes: 1,
		Link: LinkParams{Delay: Duration(10 * time.Millisecond)}})
	reg := startLabRegistry(t, l, dir)
	regDir := filepath.Join(dir, "certs.d")
	if err := os.MkdirAll(filepath.Join(regDir, labRegistry), 0o755); err != nil {
		t.Fatal(err)
	}
	hosts := fmt.Sprintf("server = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", labRegistry)
	if err := os.WriteFile(filepath.Join(regDir, labRegistry, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	// The eBPF dataplane balances Services and masquerades the pods'
	// connections on the node's uplink (see natEgress).
	pins := fmt.Sprintf("/sys/fs/bpf/tether-nat-%d", os.Getpid())
	t.Cleanup(func() { _ = os.RemoveAll(pins) })
	// With its default addresses the built-in ingress controller serves
	// HTTPS on the node's address, beside the API relay's 443.
	n := startCtrNode(t, l, h, "shop-n1", "shop", []string{archive}, "--registry-config-dir", regDir,
		"--dataplane", "ebpf", "--dataplane-cgroup", containersCgroup(t), "--bpf-pin-dir", pins, "--ingress")
	h.waitReady(90*time.Second, "shop-n1")
	t.Logf("shop-n1 Ready %v after the test began (test images built, lab, hub and node up)", time.Since(began).Round(time.Millisecond))

	if !t.Run("workloads", func(t *testing.T) { natWorkloads(t, h, n) }) {
		return
	}
	t.Run("egress", func(t *testing.T) { natEgress(t, l, h, n) })
	t.Run("hostport", func(t *testing.T) { natHostPort(t, l, h, n) })
	t.Run("ingress", func(t *testing.T) { natIngress(t, l, h, n) })
	t.Run("streams", func(t *testing.T) { natStreams(t, l, h) })
	t.Run("failures", func(t *testing.T) { natFailures(t, h, n) })
	t.Run("images", func(t *testing.T) { natImages(t, l, h, n, reg) })
	t.Run("partition", func(t *testing.T) { natPartition(t, l, h, n, *labPartition) })
	t.Logf("whole scenario: %v", time.Since(began).Round(time.Second))
}

const natWorkloadObjects = `
apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data: {greeting: hello, mode: fast}
---
apiVersion: v1
kind: Secret
metadata: {name: app-secret}
stringData: {password: s3cret, token: t0k3n}
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
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: %[1]s
        imagePullPolicy: Never
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 2}
---
apiVersion: v1
kind: Pod
metadata: {name: init}
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - {name: init-1, image: %[2]s, imagePullPolicy: Never, command: [/bin/sh, -c, "echo one >> /work/order"], volumeMounts: [{name: work, mountPath: /work}]}
  - {name: init-2, image: %[2]s, imagePullPolicy: Never, command: [/bin/sh, -c, "echo two >> /work/order"], volumeMounts: [{name: work, mountPath: /work}]}
  containers:
  - {name: main, image: %[2]s, imagePullPolicy: Never, volumeMounts: [{name: work, mountPath: /work}]}
  volumes: [{name: work, emptyDir: {}}]
---
apiVersion: v1
kind: Pod
metadata: {name: conf}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: %[1]s
    imagePullPolicy: Never
    env:
    - {name: GREETING, valueFrom: {configMapKeyRef: {name: app-config, key: greeting}}}
    - {name: PASSWORD, valueFrom: {secretKeyRef: {name: app-secret, key: password}}}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    - {name: LITERAL, value: "two words"}
    envFrom: [{prefix: CFG_, configMapRef: {name: app-config}}]
    volumeMounts:
    - {name: config, mountPath: /etc/config}
    - {name: config-all, mountPath: /etc/config-all}
    - {name: secret, mountPath: /etc/secret, readOnly: true}
  volumes:
  - {name: config, configMap: {name: app-config, items: [{key: greeting, path: greeting.txt, mode: 0600}]}}
  - {name: config-all, configMap: {name: app-config, defaultMode: 0440}}
  - {name: secret, secret: {secretName: app-secret, defaultMode: 0400}}
---
apiVersion: v1
kind: Pod
metadata: {name: live}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %[2]s
    imagePullPolicy: Never
    command: [/bin/sh, -c, "touch /tmp/alive; sleep 5; rm /tmp/alive; exec /testapp sleep"]
    livenessProbe: {exec: {command: [test, -f, /tmp/alive]}, periodSeconds: 1, failureThreshold: 2}
`

// natWorkloads runs a Deployment, a pod with two init containers, a pod
// with configMap and secret volumes and env, and a pod that fails its
// liveness probe every few seconds.
func natWorkloads(t *testing.T, h *labHub, n *ctrNode) {
	start := time.Now()
	h.applyManifest(t, fmt.Sprintf(natWorkloadObjects, images.Echo, images.Sleeper))
	eventually(t, 90*time.Second, "web available; init, conf and live Running on shop-n1", func() (bool, string) {
		pods, err := h.podsByName()
		if err != nil {
			return false, err.Error()
		}
		var states []string
		ok := true
		for _, p := range pods {
			states = append(states, p.Name+"="+string(p.Status.Phase)+"@"+p.Spec.NodeName)
			ok = ok && p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == "shop-n1"
		}
		avail, _ := h.run("get", "deploy", "web", "-o", "jsonpath={.status.availableReplicas}")
		sort.Strings(states)
		return ok && len(pods) == 4 && avail == "1", strings.Join(states, " ") + " web available=" + avail
	})
	t.Logf("4 pods Running on the NAT'd node %v after they were created", time.Since(start).Round(time.Millisecond))
	pods, err := h.podsByName()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		n.track(p)
	}

	if out := h.must(t, "exec", "init", "-c", "main", "--", "cat", "/work/order"); out != "one\ntwo\n" {
		t.Errorf("the init containers wrote %q, want one then two", out)
	}
	for _, name := range []string{"init-1", "init-2"} {
		cs, ok := containerState(pods["init"], name)
		if !ok || cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 || cs.State.Terminated.Reason != "Completed" {
			t.Errorf("init container %s: %+v", name, cs.State)
		}
	}

	env := h.must(t, "exec", "conf", "--", "env")
	for _, want := range []string{"GREETING=hello", "PASSWORD=s3cret", "NODE=shop-n1", "LITERAL=two words", "CFG_greeting=hello", "CFG_mode=fast"} {
		if !strings.Contains(env, want+"\n") {
			t.Errorf("env lacks %s:\n%s", want, env)
		}
	}
	for file, want := range map[string]string{
		"/etc/config/greeting.txt": "hello", "/etc/config-all/mode": "fast",
		"/etc/secret/password": "s3cret", "/etc/secret/token": "t0k3n",
	} {
		if out := h.must(t, "exec", "conf", "--", "cat", file); out != want {
			t.Errorf("%s: %q, want %q", file, out, want)
		}
	}
	if out := h.must(t, "exec", "conf", "--", "stat", "-L", "-c", "%a", "/etc/config/greeting.txt", "/etc/config-all/greeting", "/etc/secret/password"); out != "600\n440\n400\n" {
		t.Errorf("modes of the configMap item, the configMap and the secret files: %q, want 600, 440, 400", out)
	}

	h.must(t, "patch", "configmap", "app-config", "-p", `{"data":{"greeting":"bonjour"}}`)
	patched := time.Now()
	eventually(t, 60*time.Second, "the updated configMap in the mounted files", func() (bool, string) {
		out, err := h.run("exec", "conf", "--", "cat", "/etc/config/greeting.txt", "/etc/config-all/greeting")
		return err == nil && out == "bonjourbonjour", out
	})
	t.Logf("configMap update in the pod's files %v after the patch", time.Since(patched).Round(time.Millisecond))
	if env := h.must(t, "exec", "conf", "--", "env"); !strings.Contains(env, "GREETING=hello\n") {
		t.Errorf("a running container's environment changed with its configMap:\n%s", env)
	}
}

const natFailureObjects = `
apiVersion: v1
kind: Pod
metadata: {name: oom}
spec:
  restartPolicy: Never
  containers:
  - {name: app, image: %[1]s, imagePullPolicy: Never, command: [/testapp, memhog, "256"], resources: {limits: {memory: 32Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: app, image: %[1]s, imagePullPolicy: Never, command: [/testapp, crash, "3"]}
---
apiVersion: v1
kind: Pod
metadata: {name: stop}
spec:
  terminationGracePeriodSeconds: 4
  containers:
  - name: app
    image: %[1]s
    imagePullPolicy: Never
    command: [/bin/sh, -c, 'trap "echo term >> /log/events" TERM; echo start >> /log/events; while true; do sleep 1; done']
    lifecycle: {preStop: {exec: {command: [/bin/sh, -c, "echo prestop >> /log/events"]}}}
    volumeMounts: [{name: log, mountPath: /log}]
  volumes: [{name: log, hostPath: {path: %[2]s, type: DirectoryOrCreate}}]
`

// natFailures: through the hub, on the NAT'd node, a container over its
// memory limit is OOMKilled with exit code 137; a crashing container, and
// one its liveness probe restarts, wait in CrashLoopBackOff; a container
// that ignores SIGTERM gets its preStop hook, then SIGTERM, and is killed
// once its grace period is over.
func natFailures(t *testing.T, h *labHub, n *ctrNode) {
	const logDir = "/var/lib/tether-test-stop"
	h.applyManifest(t, fmt.Sprintf(natFailureObjects, images.Sleeper, logDir))
	eventually(t, 60*time.Second, "oom OOMKilled with exit code 137", func() (bool, string) {
		p, err := h.pod("oom")
		if err != nil {
			return false, err.Error()
		}
		cs, ok := containerState(p, "app")
		if !ok || cs.State.Terminated == nil {
			return false, fmt.Sprintf("%+v", p.Status)
		}
		term := cs.State.Terminated
		return term.Reason == "OOMKilled" && term.ExitCode == 137 && p.Status.Phase == corev1.PodFailed,
			fmt.Sprintf("phase %s, terminated %s exit %d", p.Status.Phase, term.Reason, term.ExitCode)
	})
	eventually(t, 60*time.Second, "crash waiting in CrashLoopBackOff after exiting with 3", func() (bool, string) {
		p, err := h.pod("crash")
		if err != nil {
			return false, err.Error()
		}
		cs, ok := containerState(p, "app")
		if !ok || cs.State.Waiting == nil || cs.LastTerminationState.Terminated == nil {
			return false, fmt.Sprintf("%+v", cs)
		}
		return cs.State.Waiting.Reason == "CrashLoopBackOff" && cs.LastTerminationState.Terminated.ExitCode == 3 && cs.RestartCount >= 1,
			fmt.Sprintf("waiting %s, last exit %d, restarts %d", cs.State.Waiting.Reason, cs.LastTerminationState.Terminated.ExitCode, cs.RestartCount)
	})
	// The pod whose liveness probe fails every few seconds waits out its
	// back-off as CrashLoopBackOff too.
	eventually(t, 90*time.Second, "live waiting in CrashLoopBackOff after its liveness probe failed", func() (bool, string) {
		p, err := h.pod("live")
		if err != nil {
			return false, err.Error()
		}
		cs, _ := containerState(p, "app")
		if cs.State.Waiting == nil {
			return false, fmt.Sprintf("%+v, restarts %d", cs.State, cs.RestartCount)
		}
		return cs.State.Waiting.Reason == "CrashLoopBackOff" && cs.RestartCount >= 1, fmt.Sprintf("waiting %s, restarts %d", cs.State.Waiting.Reason, cs.RestartCount)
	})
	eventually(t, 60*time.Second, "stop Running", func() (bool, string) {
		p, err := h.pod("stop")
		if err != nil {
			return false, err.Error()
		}
		out, _ := n.exec("cat", logDir+"/events")
		return p.Status.Phase == corev1.PodRunning && out == "start\n", string(p.Status.Phase) + " " + out
	})
	start := time.Now()
	h.must(t, "delete", "pod", "stop", "--wait=true", "--timeout=60s")
	took := time.Since(start)
	events, err := n.exec("cat", logDir+"/events")
	if err != nil {
		t.Fatalf("read the stop pod's events on the node: %v", err)
	}
	t.Logf("a container ignoring SIGTERM, grace period 4s: deleted in %v; it saw %q", took.Round(time.Millisecond), events)
	if events != "start\nprestop\nterm\n" {
		t.Errorf("the stop pod's events: %q, want start, then the preStop hook, then SIGTERM", events)
	}
	if took < 3500*time.Millisecond || took > 15*time.Second {
		t.Errorf("deleting a pod whose container ignores SIGTERM took %v, want its grace period of 4s", took)
	}
	h.must(t, "delete", "pod", "oom", "crash", "--wait=true", "--timeout=60s")
	_, _ = n.exec("rm", "-rf", logDir)
}

// natStreams drives logs, exec, port-forward, cp and the proxy
// subresources from the hub's side.
func natStreams(t *testing.T, l *Lab, h *labHub) {
	t.Run("pods/proxy and services/proxy", func(t *testing.T) { natProxy(t, h) })
	t.Run("logs -f", func(t *testing.T) {
		if out := h.must(t, "logs", "deploy/web"); !strings.Contains(out, "listening on :8080") {
			t.Errorf("logs of deploy/web: %q", out)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := h.streamCmd(ctx, "logs", "-f", "conf", "-c", "app")
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = cmd.Wait() }()
		eventually(t, 20*time.Second, "the log so far", func() (bool, string) {
			return strings.Contains(out.String(), "listening on :8080"), out.String()
		})
		// A line written after the stream opened must follow.
		h.must(t, "exec", "conf", "--", "sh", "-c", "echo followed-line > /proc/1/fd/1")
		eventually(t, 20*time.Second, "the followed line", func() (bool, string) {
			return strings.Contains(out.String(), "followed-line"), out.String()
		})
	})
	t.Run("exec with stdin and exit code", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := h.streamCmd(ctx, "exec", "-i", "conf", "--", "cat")
		cmd.Stdin = strings.NewReader("from stdin\n")
		if out, err := cmd.CombinedOutput(); err != nil || string(out) != "from stdin\n" {
			t.Errorf("exec -i: %q %v", out, err)
		}
		_, err := h.run("exec", "conf", "--", "sh", "-c", "exit 7")
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 {
			t.Errorf("kubectl exec of a command exiting 7: %v", err)
		}
	})
	t.Run("exec -it through a pty", func(t *testing.T) {
		// kubectl sees a real terminal: it asks for a TTY, sets raw mode
		// and sends the terminal's size, which the container's shell
		// gets on its own pty.
		master, slave, err := openTerminal()
		if err != nil {
			t.Fatal(err)
		}
		defer master.Close()
		if err := unix.IoctlSetWinsize(int(slave.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 41, Col: 107}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := h.streamCmd(ctx, "exec", "-it", "conf", "-c", "app", "--", "sh")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		slave.Close()
		out := &syncBuffer{}
		copied := make(chan struct{})
		go func() { _, _ = io.Copy(out, master); close(copied) }()
		eventually(t, 20*time.Second, "a shell prompt", func() (bool, string) {
			return strings.Contains(out.String(), "# "), out.String()
		})
		if _, err := io.WriteString(master, "stty size; tty; echo $((6*7))-answer; exit 3\r"); err != nil {
			t.Fatal(err)
		}
		err = cmd.Wait()
		master.Close()
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
	t.Run("port-forward with parallel transfers", func(t *testing.T) {
		want, err := os.ReadFile("/bin/busybox") // the image's busybox is the host's
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(want)
		ctx, cancel := context.WithCancel(context.Background())
		cmd := h.streamCmd(ctx, "port-forward", "deploy/web", "18080:8080")
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = cmd.Wait() }()
		eventually(t, 30*time.Second, "port-forward listening", func() (bool, string) {
			return strings.Contains(out.String(), "Forwarding from 127.0.0.1:18080"), out.String()
		})
		client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
			DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
				return dialInHost(l, "hub", network, addr)
			}}}
		const parallel = 8
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, parallel)
		for i := 0; i < parallel; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := client.Get("http://127.0.0.1:18080/file?path=/bin/busybox")
				if err != nil {
					errs <- err
					return
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil || resp.StatusCode != http.StatusOK || sha256.Sum256(b) != sum {
					errs <- fmt.Errorf("status %d, %d bytes (want %d, same digest), err %v", resp.StatusCode, len(b), len(want), err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		took := time.Since(start)
		t.Logf("%d parallel transfers of %d bytes through port-forward in %v (%.1f MB/s)", parallel, len(want), took.Round(time.Millisecond),
			float64(parallel*len(want))/took.Seconds()/1e6)
	})
	t.Run("cp", func(t *testing.T) {
		src := filepath.Join(t.TempDir(), "in.txt")
		if err := os.WriteFile(src, []byte("copied through the tunnel\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		h.must(t, "cp", src, "default/conf:/tmp/in.txt", "-c", "app")
		if out := h.must(t, "exec", "conf", "--", "cat", "/tmp/in.txt"); out != "copied through the tunnel\n" {
			t.Errorf("cp into the pod: %q", out)
		}
		dst := filepath.Join(t.TempDir(), "busybox")
		h.must(t, "cp", "default/conf:/bin/busybox", dst, "-c", "app")
		got, err1 := os.ReadFile(dst)
		want, err2 := os.ReadFile("/bin/busybox")
		if err1 != nil || err2 != nil || sha256.Sum256(got) != sha256.Sum256(want) {
			t.Errorf("cp out of the pod: %d bytes, want %d (%v %v)", len(got), len(want), err1, err2)
		}
	})
}

// busyboxImage is a one-layer image of the host's static busybox and a
// marker file, which its command prints before it sleeps.
func busyboxImage(name, marker string) (images.Image, error) {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return images.Image{}, err
	}
	files := []images.File{
		{Path: "bin/busybox", Mode: 0o755, Data: bb},
		{Path: "tmp", Dir: true, Mode: 0o1777},
		{Path: "marker", Mode: 0o644, Data: []byte(marker + "\n")},
	}
	for _, a := range []string{"sh", "cat", "sleep"} {
		files = append(files, images.File{Path: "bin/" + a, Link: "busybox"})
	}
	return images.Image{Name: name, Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"cat /marker; exec sleep 1000000"},
		Env: []string{"PATH=/bin"}, Layer: files}, nil
}

// startLabRegistry serves a private registry in the hub's namespace:
// tether/pulled:v1 and :v2 (one layer of their own, not in the node's
// archives), for labRegUser only.
func startLabRegistry(t *testing.T, l *Lab, dir string) *images.Registry {
	t.Helper()
	v1, err := busyboxImage("docker.io/tether/pulled:v1", "pulled from the registry across the NAT")
	if err != nil {
		t.Fatal(err)
	}
	v2 := v1
	v2.Name = "docker.io/tether/pulled:v2"
	arch := filepath.Join(dir, "registry.tar")
	if err := images.WriteArchive(arch, v1, v2); err != nil {
		t.Fatal(err)
	}
	reg, err := images.NewRegistry(arch)
	if err != nil {
		t.Fatal(err)
	}
	reg.User, reg.Password = labRegUser, labRegPassword
	var ln net.Listener
	if err := l.InHost("hub", func() error {
		var err error
		ln, err = net.Listen("tcp4", labRegistry)
		return err
	}); err != nil {
		t.Fatalf("registry listener in the hub's namespace: %v", err)
	}
	srv := &http.Server{Handler: reg}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return reg
}

const natImagePods = `
apiVersion: v1
kind: Pod
metadata: {name: imported}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: app, image: docker.io/tether/imported:v1, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Pod
metadata: {name: pulled}
spec:
  terminationGracePeriodSeconds: 1
  imagePullSecrets: [{name: regcred}]
  containers: [{name: app, image: %[1]s/tether/pulled:v1, imagePullPolicy: IfNotPresent}]
---
apiVersion: v1
kind: Pod
metadata: {name: denied}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: app, image: %[1]s/tether/pulled:v2, imagePullPolicy: IfNotPresent}]
`

// natImages imports an image archive on the node with `tether edge
// images import`, and pulls from the private registry on the hub's side
// with a pull secret (and is refused without one).
func natImages(t *testing.T, l *Lab, h *labHub, n *ctrNode, reg *images.Registry) {
	img, err := busyboxImage("docker.io/tether/imported:v1", "imported without a registry")
	if err != nil {
		t.Fatal(err)
	}
	arch := filepath.Join(t.TempDir(), "imported.tar")
	if err := images.WriteArchive(arch, img); err != nil {
		t.Fatal(err)
	}
	out, err := n.exec(h.tether, "edge", "images", "import", "--containerd-address", n.sock, "--data-dir", n.data, arch)
	if err != nil || !strings.Contains(out, "imported docker.io/tether/imported:v1") {
		t.Fatalf("tether edge images import on the node: %v\n%s", err, out)
	}
	h.must(t, "create", "secret", "docker-registry", "regcred", "--docker-server="+labRegistry,
		"--docker-username="+labRegUser, "--docker-password="+labRegPassword)
	down := l.Stats().Links["shop"].Down.Bytes
	start := time.Now()
	h.applyManifest(t, fmt.Sprintf(natImagePods, labRegistry))
	eventually(t, 90*time.Second, "imported and pulled Running, denied refused", func() (bool, string) {
		pods, err := h.podsByName()
		if err != nil {
			return false, err.Error()
		}
		var s []string
		ok := true
		for _, name := range []string{"imported", "pulled", "denied"} {
			p := pods[name]
			if p == nil {
				return false, name + " missing"
			}
			cs, _ := containerState(p, "app")
			reason := ""
			if cs.State.Waiting != nil {
				reason = cs.State.Waiting.Reason
			}
			s = append(s, fmt.Sprintf("%s=%s/%s", name, p.Status.Phase, reason))
			if name == "denied" {
				ok = ok && (reason == "ErrImagePull" || reason == "ImagePullBackOff")
			} else {
				ok = ok && p.Status.Phase == corev1.PodRunning
			}
		}
		return ok, strings.Join(s, " ")
	})
	t.Logf("imported and pulled pods Running %v after creation; %d bytes went down the site's link meanwhile",
		time.Since(start).Round(time.Millisecond), l.Stats().Links["shop"].Down.Bytes-down)
	pods, err := h.podsByName()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		n.track(p)
	}
	for pod, want := range map[string]string{"imported": "imported without a registry", "pulled": "pulled from the registry across the NAT"} {
		if out := h.must(t, "logs", pod); !strings.Contains(out, want) {
			t.Errorf("logs of %s: %q, want %q", pod, out, want)
		}
	}
	if reg.Resolves("tether/pulled:v1") == 0 {
		t.Error("the registry was never asked for tether/pulled:v1")
	}
	if reg.Refusals() == 0 {
		t.Error("the registry refused nothing: the pod without a pull secret was not refused by it")
	}
	cs, _ := containerState(pods["denied"], "app")
	if cs.State.Waiting != nil {
		t.Logf("without a pull secret: %s: %s", cs.State.Waiting.Reason, cs.State.Waiting.Message)
	}
	h.must(t, "delete", "pod", "denied", "--wait=true", "--timeout=60s")
}

// natSlot is one container the node should keep running.
type natSlot struct{ pod, container string }

func (s natSlot) String() string { return s.pod + "/" + s.container }

// natPartition cuts the site off for d; inside the cut the agent restarts
// at d/4 and the node reboots at d/2.
func natPartition(t *testing.T, l *Lab, h *labHub, n *ctrNode, d time.Duration) {
	pods, err := h.podsByName()
	if err != nil {
		t.Fatal(err)
	}
	live := pods["live"]
	if live == nil {
		t.Fatal("no pod live")
	}
	var slots []natSlot
	uids := map[string]types.UID{}
	for name, p := range pods {
		n.track(p)
		uids[name] = p.UID
		if name == "live" {
			continue
		}
		for _, c := range p.Spec.Containers {
			slots = append(slots, natSlot{name, c.Name})
		}
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].String() < slots[j].String() })
	if len(slots) != 5 {
		t.Fatalf("want the containers of web, init, conf, imported and pulled to watch, have %v", slots)
	}

	// Before: what the hub and the node say agree.
	local, err := n.containers()
	if err != nil {
		t.Fatal(err)
	}
	type record struct {
		id       string
		attempt  int
		pid      int
		restarts int32
	}
	before := map[natSlot]record{}
	for _, s := range slots {
		cs, _ := containerState(pods[s.pod], s.container)
		c, attempt, ok := latestInstance(local, uids[s.pod], s.container)
		if !ok || c.Status != "RUNNING" || "containerd://"+c.ID != cs.ContainerID || !cs.Ready {
			t.Fatalf("%s before the partition: node has %+v, hub has %s ready=%v", s, c, cs.ContainerID, cs.Ready)
		}
		before[s] = record{c.ID, attempt, c.PID, cs.RestartCount}
	}
	_, live0, _ := latestInstance(local, live.UID, "app")

	// running checks that every slot runs the given instance.
	running := func(phase string, want map[natSlot]ctrContainer) {
		t.Helper()
		cs, err := n.containers()
		if err != nil {
			t.Errorf("%s: %v", phase, err)
			return
		}
		for _, s := range slots {
			c, _, ok := latestInstance(cs, uids[s.pod], s.container)
			if w := want[s]; !ok || c != w {
				t.Errorf("%s: %s runs %+v, want %+v unchanged", phase, s, c, w)
			}
		}
	}
	wantBefore := map[natSlot]ctrContainer{}
	for s, r := range before {
		wantBefore[s] = ctrContainer{ID: r.id, PID: r.pid, Status: "RUNNING"}
	}

	// The liveness-failing container's instances, sampled through the
	// cut: when each was first seen running and first seen stopped.
	type instance struct{ running, stopped time.Time }
	var mu sync.Mutex
	var timeline []string
	seen := map[int]*instance{}
	liveMax := live0
	stop := make(chan struct{})
	sampled := make(chan struct{})
	cut := time.Now()
	note := func(format string, args ...any) {
		timeline = append(timeline, fmt.Sprintf("+%v ", time.Since(cut).Round(100*time.Millisecond))+fmt.Sprintf(format, args...))
	}
	sample := func() {
		cs, err := n.containers()
		if err != nil {
			return
		}
		c, a, ok := latestInstance(cs, live.UID, "app")
		if !ok {
			return
		}
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		liveMax = max(liveMax, a)
		in := seen[a]
		if in == nil {
			in = &instance{}
			seen[a] = in
		}
		switch {
		case c.Status == "RUNNING" && in.running.IsZero():
			in.running = now
			note("attempt %d running", a)
		case c.Status != "RUNNING" && !in.running.IsZero() && in.stopped.IsZero():
			in.stopped = now
			note("attempt %d stopped", a)
		}
	}
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
				sample()
			}
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-sampled
	}()

	if err := l.Partition("shop", Both); err != nil {
		t.Fatal(err)
	}
	healed := false
	defer func() {
		if !healed {
			_ = l.Heal("shop")
		}
	}()
	t.Logf("site shop cut off for %v", d)

	time.Sleep(time.Until(cut.Add(d / 4)))
	running("cut off, before the agent restart", wantBefore)
	n.restartAgent(t)
	mu.Lock()
	note("agent restarted")
	mu.Unlock()

	time.Sleep(time.Until(cut.Add(d / 2)))
	running("cut off, after the agent restarted", wantBefore)
	if n.agentPID() == 0 {
		t.Errorf("the agent restarted inside the partition is not running; log in %s", n.agent.LogPath())
	}

	n.reboot(t)
	booted := time.Now()
	mu.Lock()
	note("node rebooted")
	mu.Unlock()
	after := map[natSlot]ctrContainer{}
	eventually(t, 90*time.Second, "every pod running again from the node's local state, still cut off", func() (bool, string) {
		cs, err := n.containers()
		if err != nil {
			return false, err.Error()
		}
		var waiting []string
		for _, s := range slots {
			c, a, ok := latestInstance(cs, uids[s.pod], s.container)
			if !ok || c.Status != "RUNNING" || a <= before[s].attempt {
				waiting = append(waiting, fmt.Sprintf("%s=%+v", s, c))
				continue
			}
			after[s] = c
		}
		return len(waiting) == 0, strings.Join(waiting, " ")
	})
	t.Logf("node reboot inside the partition: all %d watched pods running again %v after power-on", len(slots), time.Since(booted).Round(time.Millisecond))
	for _, s := range slots {
		if want := before[s].id[:strings.LastIndexByte(before[s].id, '-')+1] + fmt.Sprint(before[s].attempt+1); after[s].ID != want {
			t.Errorf("%s after the reboot runs %s, want %s: one restart, by the reboot", s, after[s].ID, want)
		}
	}

	time.Sleep(time.Until(cut.Add(d)))
	running("cut off, until the heal", after)
	if out, err := h.run("get", "node", "shop-n1", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`); err == nil {
		t.Logf("the hub's Ready condition of shop-n1 at the end of the cut: %s", out)
	}
	close(stop)
	<-sampled
	sample()
	if err := l.Heal("shop"); err != nil {
		t.Fatal(err)
	}
	healed = true
	healAt := time.Now()
	mu.Lock()
	liveEnd := liveMax
	t.Logf("the liveness-failing container during the cut (attempt %d at the cut):\n%s", live0, strings.Join(timeline, "\n"))
	// One restart is the reboot's; the probe must have caused at least
	// one more, and the back-off (10s doubling) bounds how many.
	if grew := liveEnd - live0; grew < 2 || grew > int(d/(10*time.Second))+3 {
		t.Errorf("the liveness-failing container went from attempt %d to %d during a %v cut", live0, liveEnd, d)
	}
	// After the reboot the back-off starts over: the first instance's
	// start was a restart, so when the probe kills it the next one comes
	// 10s later (the kubelet's schedule), hub or no hub.
	first := -1
	for a, in := range seen {
		if in.running.After(booted) && (first < 0 || a < first) {
			first = a
		}
	}
	const backoff, slack = 10 * time.Second, 5 * time.Second
	switch in := seen[first]; {
	case first < 0:
		t.Error("the liveness-failing container did not run after the reboot")
	case in.stopped.IsZero():
		t.Errorf("attempt %d of the liveness-failing container was not stopped by its probe during the cut", first)
	case seen[first+1] == nil || seen[first+1].running.IsZero():
		if waited := healAt.Sub(in.stopped); waited > backoff+slack {
			t.Errorf("attempt %d of the liveness-failing container stopped %v before the heal and was not restarted; its back-off was %v", first, waited.Round(time.Second), backoff)
		}
	default:
		if gap := seen[first+1].running.Sub(in.stopped); gap > backoff+slack {
			t.Errorf("attempt %d of the liveness-failing container ran %v after attempt %d stopped; its back-off was %v", first+1, gap.Round(time.Second), first, backoff)
		}
	}
	mu.Unlock()

	// After the heal the hub shows what the node runs, on the same pods.
	eventually(t, 2*time.Minute, "the hub sees shop-n1 Ready again", func() (bool, string) {
		out, err := h.run("get", "node", "shop-n1", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && out == "True", out
	})
	eventually(t, 90*time.Second, "the hub shows every pod as the node runs it", func() (bool, string) {
		now, err := h.podsByName()
		if err != nil {
			return false, err.Error()
		}
		var off []string
		for _, s := range slots {
			p := now[s.pod]
			if p == nil || p.UID != uids[s.pod] {
				off = append(off, s.pod+" is not the same pod")
				continue
			}
			cs, _ := containerState(p, s.container)
			if p.Status.Phase != corev1.PodRunning || !cs.Ready || cs.ContainerID != "containerd://"+after[s].ID || cs.RestartCount != before[s].restarts+1 {
				off = append(off, fmt.Sprintf("%s: %s ready=%v id=%s restarts=%d", s, p.Status.Phase, cs.Ready, cs.ContainerID, cs.RestartCount))
			}
		}
		if p := now["live"]; p == nil || p.UID != live.UID {
			off = append(off, "live is not the same pod")
		} else if cs, _ := containerState(p, "app"); int(cs.RestartCount) < liveEnd {
			off = append(off, fmt.Sprintf("live restarts=%d, node at attempt %d", cs.RestartCount, liveEnd))
		}
		return len(off) == 0, strings.Join(off, "; ")
	})
	t.Logf("the hub shows every pod as the node runs it %v after the heal", time.Since(healAt).Round(time.Millisecond))

	now, err := h.podsByName()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		cs, _ := containerState(now[s.pod], s.container)
		if cs.LastTerminationState.Terminated == nil {
			t.Errorf("%s: no last state after the reboot: %+v", s, cs.LastTerminationState)
		}
	}
	if out := h.must(t, "get", "pods", "-l", "app=web", "-o", "name"); strings.TrimSpace(out) != "pod/"+slotPod(slots, "web") {
		t.Errorf("web's pods after the heal: %q", out)
	}
	// Volumes in memory went with the reboot and came back from the
	// local state, with the configMap as last seen.
	for file, want := range map[string]string{"/etc/secret/password": "s3cret", "/etc/config/greeting.txt": "bonjour"} {
		if out := h.must(t, "exec", "conf", "--", "cat", file); out != want {
			t.Errorf("%s after the reboot: %q, want %q", file, out, want)
		}
	}
	// The reboot took the pod's sandbox: its init containers ran again,
	// in order, before main, on the emptyDir the node's disk kept.
	if out := h.must(t, "exec", "init", "-c", "main", "--", "cat", "/work/order"); out != "one\ntwo\none\ntwo\n" {
		t.Errorf("init's order file after the reboot: %q, want the init containers to have run again in order", out)
	}
	t.Logf("kubectl get pods -o wide:\n%s", h.must(t, "get", "pods", "-o", "wide"))
}

// slotPod returns the pod of the first slot whose pod name begins with
// prefix.
func slotPod(slots []natSlot, prefix string) string {
	for _, s := range slots {
		if strings.HasPrefix(s.pod, prefix) {
			return s.pod
		}
	}
	return ""
}

// natProxy reaches the web pod's HTTP server through the API as
// pods/proxy and services/proxy: the hub forwards each request through the
// node's tunnel, and the agent connects the pod's address from the host.
func natProxy(t *testing.T, h *labHub) {
	start := time.Now()
	pod := strings.TrimSpace(h.must(t, "get", "pods", "-l", "app=web", "-o", "jsonpath={.items[0].metadata.name}"))
	want := "hello from " + pod + "\n"
	const ns = "/api/v1/namespaces/default"
	if out := h.must(t, "get", "--raw", ns+"/pods/"+pod+":8080/proxy/"); out != want {
		t.Errorf("pods/%s:8080/proxy/: %q, want %q", pod, out, want)
	}
	if out := h.must(t, "get", "--raw", ns+"/pods/http:"+pod+":8080/proxy/healthz"); out != "ok\n" {
		t.Errorf("pods/http:%s:8080/proxy/healthz: %q", pod, out)
	}
	h.applyManifest(t, `
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
`)
	defer func() { _, _ = h.run("delete", "service", "web", "--wait=false") }()
	eventually(t, 30*time.Second, "services/web:80/proxy/ answered by the pod", func() (bool, string) {
		out, err := h.run("get", "--raw", ns+"/services/web:80/proxy/")
		return err == nil && out == want, fmt.Sprintf("%q %v", out, err)
	})
	if out := h.must(t, "get", "--raw", ns+"/services/web:http/proxy/healthz"); out != "ok\n" {
		t.Errorf("services/web:http/proxy/healthz: %q", out)
	}
	out, err := h.run("get", "--raw", ns+"/services/web:81/proxy/")
	if err == nil || !strings.Contains(out, `no service port 81 found for service "web"`) {
		t.Errorf("services/web:81/proxy/: %q %v", out, err)
	}
	t.Logf("pods/proxy and services/proxy through the tunnel: %v", time.Since(start).Round(time.Millisecond))
}
