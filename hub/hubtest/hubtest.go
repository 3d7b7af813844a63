// Package hubtest runs a real tether hub process and a real kubectl against
// it, for end-to-end tests. The binaries are built once per test process:
// tether from ./cmd/tether (or copied from $TETHER_BIN when set: the test
// script links it once for all packages instead of once per package),
// kubectl from the pinned k8s.io/kubectl module in
// tools/kubectl (or taken from $TETHER_KUBECTL when set), and Helm likewise
// from tools/helm (or $TETHER_HELM); Helm 3, cert-manager's controller and
// the sample operator from tools/helm3, tools/certmanager and
// tools/sampleoperator (or $TETHER_HELM3, $TETHER_CERTMANAGER and
// $TETHER_SAMPLEOPERATOR).
package hubtest

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce             sync.Once
	tetherBin, kubectlBin string
	buildErr              error
	buildDir              string
)

// RepoRoot returns the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// removeStaleBuilds removes the build directories of test processes that
// have exited. A test binary has no hook that runs after its last test in
// every package, so each process leaves its binaries behind and the next
// one to build cleans up after the dead.
func removeStaleBuilds() {
	// tether-e2e-bin-PID (tether, kubectl) and tether-e2e-TOOL-PID.
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "tether-e2e-*-*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(d[strings.LastIndexByte(d, '-')+1:])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(d)
		}
	}
}

// Binaries builds (once per process) and returns the tether and kubectl
// binaries.
func Binaries(t testing.TB) (tether, kubectl string) {
	t.Helper()
	buildOnce.Do(func() {
		root := RepoRoot()
		removeStaleBuilds()
		buildDir = filepath.Join(os.TempDir(), fmt.Sprintf("tether-e2e-bin-%d", os.Getpid()))
		os.RemoveAll(buildDir)
		if buildErr = os.Mkdir(buildDir, 0o755); buildErr != nil {
			return
		}
		tetherBin = filepath.Join(buildDir, "tether")
		if prebuilt := os.Getenv("TETHER_BIN"); prebuilt != "" {
			// A copy, not the file itself: tests that measure memory
			// want the hub's pages to be its own.
			if buildErr = copyExecutable(prebuilt, tetherBin); buildErr != nil {
				return
			}
		} else {
			cmd := exec.Command("go", "build", "-o", tetherBin, "./cmd/tether")
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("build tether: %v\n%s", err, out)
				return
			}
		}
		// Write the fresh binary out, so the hub runs from clean pages
		// like an installed binary: the kernel cannot release dirty
		// pages of the executable, which measurements of the hub's
		// memory would otherwise show.
		if buildErr = syncFile(tetherBin); buildErr != nil {
			return
		}
		if k := os.Getenv("TETHER_KUBECTL"); k != "" {
			kubectlBin = k
			return
		}
		kubectlBin = filepath.Join(buildDir, "kubectl")
		cmd := exec.Command("bash", "build.sh", kubectlBin)
		cmd.Dir = filepath.Join(root, "tools", "kubectl")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build kubectl: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return tetherBin, kubectlBin
}

// Hub is a hub process.
type Hub struct {
	t          testing.TB
	Bin        string
	Kubectl    string
	DataDir    string
	Addr       string // host:port of the API
	Kubeconfig string
	CacheDir   string // kubectl's discovery and HTTP cache

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  *logBuffer
	args []string // the extra flags of the last start
}

// logBuffer collects a hub's output: the process writes it while the test
// reads it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Start runs `tether hub` with a fresh data directory on a free loopback
// port and waits until it serves. The hub is stopped at the end of the test.
func Start(t testing.TB, extraArgs ...string) *Hub {
	t.Helper()
	tether, kubectl := Binaries(t)
	h := &Hub{t: t, Bin: tether, Kubectl: kubectl, DataDir: t.TempDir(), CacheDir: t.TempDir()}
	h.Addr = freeAddr(t)
	h.Kubeconfig = filepath.Join(h.DataDir, "admin.kubeconfig")
	h.startArgs(extraArgs)
	t.Cleanup(h.stopAndReport)
	return h
}

// logTail is how much of a hub's output a failed test prints.
const logTail = 64 << 10

// stopAndReport stops the hub and, when the test failed, prints the end
// of the hub's output: what the hub did is often the cause.
func (h *Hub) stopAndReport() {
	h.Stop()
	if !h.t.Failed() || h.log == nil {
		return
	}
	out := h.log.String()
	if len(out) > logTail {
		out = "...\n" + out[len(out)-logTail:]
	}
	h.t.Logf("hub %s output:\n%s", h.Addr, out)
}

// copyExecutable copies the executable src to dst.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("TETHER_BIN: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return out.Close()
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

// freeAddr returns a loopback address whose port is free for TCP and UDP.
// The port is below the kernel's ephemeral range: a hub restarted on it
// must find it free, and the sockets its edges open to reconnect (each
// retry from a new one) take their local ports from that range.
func freeAddr(t testing.TB) string {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const min = 10000
	for range 200 {
		if low <= min+100 {
			break
		}
		addr := fmt.Sprintf("127.0.0.1:%d", min+rand.IntN(low-min))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		pc, err := net.ListenPacket("udp", addr)
		l.Close()
		if err != nil {
			continue
		}
		pc.Close()
		return addr
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (h *Hub) startArgs(extra []string) {
	h.t.Helper()
	h.launch(extra)
	h.WaitReady()
}

// launch starts the hub's process with extra flags.
func (h *Hub) launch(extra []string) {
	h.t.Helper()
	h.args = extra
	args := append([]string{"hub", "--data-dir", h.DataDir, "--listen", h.Addr}, extra...)
	cmd := exec.Command(h.Bin, args...)
	h.log = &logBuffer{}
	cmd.Stdout = h.log
	cmd.Stderr = h.log
	if err := cmd.Start(); err != nil {
		h.t.Fatalf("start hub: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	h.mu.Lock()
	h.cmd, h.done = cmd, done
	h.mu.Unlock()
}

// WaitReady waits until the hub answers /readyz through the admin
// kubeconfig.
func (h *Hub) WaitReady() {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-h.done:
			h.t.Fatalf("hub exited while starting:\n%s", h.log.String())
		default:
		}
		if _, err := os.Stat(h.Kubeconfig); err == nil {
			if out, err := h.Run("get", "--raw", "/readyz"); err == nil && strings.Contains(out, "ok") {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	h.t.Fatalf("hub not ready after 60s:\n%s", h.log.String())
}

// Logs returns what the hub printed so far.
func (h *Hub) Logs() string { return h.log.String() }

// Stop sends SIGTERM and waits for a clean exit.
func (h *Hub) Stop() { h.signal(syscall.SIGTERM) }

// Kill sends SIGKILL: no chance to flush anything.
func (h *Hub) Kill() { h.signal(syscall.SIGKILL) }

func (h *Hub) signal(sig syscall.Signal) {
	h.mu.Lock()
	cmd, done := h.cmd, h.done
	h.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	// A hub closing thousands of edge sessions on a loaded machine takes
	// tens of seconds: its drain and HTTP shutdown alone may take 12s.
	const exitLimit = 60 * time.Second
	start := time.Now()
	select {
	case <-done:
	case <-time.After(exitLimit):
		_ = cmd.Process.Kill()
		<-done
		h.t.Errorf("hub did not stop within %v after %v (load average %s)", exitLimit, sig, loadAverage())
	}
	if d := time.Since(start); d > 10*time.Second {
		h.t.Logf("hub took %v to exit after %v (load average %s)", d.Round(time.Millisecond), sig, loadAverage())
	}
	h.mu.Lock()
	h.cmd = nil
	h.mu.Unlock()
}

// Restart starts the hub again on the same data directory and address,
// with extraArgs, or with the flags of the last start when none are given.
// A hub still running is stopped first (SIGTERM), so that the answers after
// a restart come from the new process and no process outlives the test.
func (h *Hub) Restart(extraArgs ...string) {
	h.t.Helper()
	h.Stop()
	if len(extraArgs) == 0 {
		extraArgs = h.args
	}
	h.startArgs(extraArgs)
}

// Run runs kubectl against the hub and returns its standard output; on
// failure the error carries standard error.
func (h *Hub) Run(args ...string) (string, error) {
	return h.RunInput(context.Background(), "", nil, args...)
}

// RunInput runs kubectl with stdin and extra environment variables.
func (h *Hub) RunInput(ctx context.Context, stdin string, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.Kubectl, append([]string{"--cache-dir", h.CacheDir}, args...)...)
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+h.Kubeconfig), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String(), nil
}

// MustRun is Run that fails the test on error.
func (h *Hub) MustRun(args ...string) string {
	h.t.Helper()
	out, err := h.Run(args...)
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// MustRunEnv is MustRun with extra environment variables.
func (h *Hub) MustRunEnv(env []string, args ...string) string {
	h.t.Helper()
	out, err := h.RunInput(context.Background(), "", env, args...)
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// RSS returns the hub process's resident set size in bytes.
func (h *Hub) RSS() (int64, error) {
	h.mu.Lock()
	cmd := h.cmd
	h.mu.Unlock()
	if cmd == nil {
		return 0, fmt.Errorf("hub is not running")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("read hub status: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			var kb int64
			if _, err := fmt.Sscan(f[1], &kb); err != nil {
				return 0, fmt.Errorf("parse VmRSS: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", cmd.Process.Pid)
}

// CPU returns the user plus system CPU time the hub process has used.
func (h *Hub) CPU() (time.Duration, error) {
	h.mu.Lock()
	cmd := h.cmd
	h.mu.Unlock()
	if cmd == nil {
		return 0, fmt.Errorf("hub is not running")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("read hub stat: %w", err)
	}
	// The command name may hold spaces; the fields after it are fixed.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", cmd.Process.Pid)
	}
	var utime, stime int64
	if _, err := fmt.Sscan(f[11], &utime); err != nil {
		return 0, fmt.Errorf("parse utime: %w", err)
	}
	if _, err := fmt.Sscan(f[12], &stime); err != nil {
		return 0, fmt.Errorf("parse stime: %w", err)
	}
	// Linux reports clock ticks of 1/100 s (USER_HZ) on every platform Go
	// supports here.
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// loadAverage is the machine's 1, 5 and 15 minute load averages, for
// messages about deadlines a loaded machine may break.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// StartTogether runs n hubs with fresh data directories, each on a free
// loopback port with extraArgs, starting their processes at once before
// it waits until each serves. The hubs are stopped at the end of the test.
func StartTogether(t testing.TB, n int, extraArgs ...string) []*Hub {
	t.Helper()
	tether, kubectl := Binaries(t)
	hubs := make([]*Hub, n)
	for i := range hubs {
		h := &Hub{t: t, Bin: tether, Kubectl: kubectl, DataDir: t.TempDir(), CacheDir: t.TempDir()}
		h.Addr = freeAddr(t)
		h.Kubeconfig = filepath.Join(h.DataDir, "admin.kubeconfig")
		t.Cleanup(h.stopAndReport)
		hubs[i] = h
	}
	for _, h := range hubs {
		h.launch(extraArgs)
	}
	for _, h := range hubs {
		h.WaitReady()
	}
	return hubs
}

// SecretKeyFile writes a new random secret key for the cluster's keys in
// a PostgreSQL datastore (--secret-key-file) and returns its path.
func SecretKeyFile(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := crand.Read(b); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "secret.key")
	if err := os.WriteFile(path, []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
