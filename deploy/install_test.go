package deploy_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-edge/tether/deploy"
	"github.com/tether-edge/tether/deploy/systemdtest"
	"github.com/tether-edge/tether/hub/hubtest"
)

// TestInstallFromReleaseTarball installs a hub and an edge on a fresh
// host from a release tarball and removes them again.
//
// The host is a network namespace with only its loopback, and a scratch
// root directory (--root) that every installed path is under. The
// tarball is the one scripts/release.sh builds for this machine's
// architecture (TETHER_RELEASE_DIR names a directory where it built one
// already; otherwise the test runs it, for this architecture only, which
// takes minutes: CI builds it beforehand). systemd is not PID 1 here: the
// units run under deploy/systemdtest's supervisor in the namespace,
// which honours ExecStart, Restart=, KillMode= (control-group, process)
// and cgroup v2 placement of each unit as its package doc says, and is
// systemctl for `tether install --systemctl`. The edge runs the sim
// runtime (as the hub-process tests do): containers and their pod
// network are `tether edge reset`'s to remove and are tested with it
// (internal/repotest).
//
// It checks that the hub comes up and the edge registers Ready, that
// each install run again with the same flags changes nothing (files'
// bytes, modes and modification times; no restart: same main PIDs and
// start times), that another flag rewrites the config and restarts the
// agent, that `tether edge upgrade` replaces the agent's executable with
// no restart of its unit, and that `tether uninstall` leaves nothing: no file under the
// root, no unit active or enabled, no process in the units' cgroups or
// naming the root, no mount naming it, no interface the host did not have
// before.
func TestInstallFromReleaseTarball(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("installs need root: network namespaces, cgroups, the units' processes")
	}
	cgroup2 := cgroup2Mount(t)
	kubectl := os.Getenv("TETHER_KUBECTL")
	if kubectl == "" {
		_, kubectl = hubtest.Binaries(t)
	}
	tmp := t.TempDir()
	start := time.Now()
	version, pkg := releaseTarball(t, tmp)
	t.Logf("release tarball ready in %v", time.Since(start).Round(100*time.Millisecond))
	unpacked := filepath.Join(tmp, "unpacked")
	if err := os.Mkdir(unpacked, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-xzf", pkg, "-C", unpacked, "--strip-components=1").CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v\n%s", pkg, err, out)
	}

	// The fresh host.
	ns := fmt.Sprintf("tether-install-%d", os.Getpid())
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	// Its uplink: an interface (a bridge: kernels without the dummy
	// driver have it) with a documentation address, which
	// the hub, listening on every address, advertises.
	const hostIP = "192.0.2.10"
	for _, c := range [][]string{
		{"link", "set", "lo", "up"}, {"link", "add", "eth0", "type", "bridge"},
		{"addr", "add", hostIP + "/24", "dev", "eth0"}, {"link", "set", "eth0", "up"},
	} {
		run(t, "ip", append([]string{"-n", ns}, c...)...)
	}
	nsenter := []string{"nsenter", "--net=/run/netns/" + ns}
	root := filepath.Join(tmp, "root")
	l := deploy.Layout{Root: root}
	sock := filepath.Join(tmp, "systemd.sock")
	logs := filepath.Join(tmp, "logs")
	cg := filepath.Join(cgroup2, fmt.Sprintf("tether-systemdtest-%d", os.Getpid()))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sup := exec.Command(nsenter[0], append(nsenter[1:], self)...)
	sup.Env = append(os.Environ(), systemdtest.EnvSupervise+"="+sock, systemdtest.EnvUnitDir+"="+filepath.Join(root, "etc/systemd/system"),
		systemdtest.EnvCgroup+"="+cg, systemdtest.EnvLogDir+"="+logs)
	var supOut bytes.Buffer
	sup.Stdout, sup.Stderr = &supOut, &supOut
	if err := sup.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sup.Process.Signal(syscall.SIGTERM)
		_ = sup.Wait()
		if t.Failed() {
			t.Logf("supervisor: %s", supOut.String())
			for _, u := range []string{"tether-hub.service", "tether-edge.service"} {
				if b, err := os.ReadFile(filepath.Join(logs, u+".log")); err == nil {
					t.Logf("%s (last 4 KiB):\n%s", u, tail(b, 4<<10))
				}
			}
		}
	})
	waitFor(t, "the supervisor's socket", 10*time.Second, func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	// inHost runs a command on the fresh host; the installer's systemctl
	// is this binary, talking to the supervisor.
	inHost := func(name string, args ...string) (string, error) {
		cmd := exec.Command(nsenter[0], append(append(nsenter[1:], name), args...)...)
		cmd.Env = append(os.Environ(), systemdtest.EnvSystemctl+"="+sock)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	mustInHost := func(name string, args ...string) string {
		t.Helper()
		out, err := inHost(name, args...)
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return out
	}
	systemctl := func(args ...string) string {
		var b bytes.Buffer
		systemdtest.Systemctl(sock, args, &b)
		return strings.TrimSpace(b.String())
	}
	installArgs := []string{"--root", root, "--systemctl", self}

	// The hub.
	linksBefore := mustInHost("ip", "-o", "link", "show")
	hubArgs := append([]string{"install", "hub"}, installArgs...)
	out := mustInHost(filepath.Join(unpacked, "tether"), hubArgs...)
	if !strings.Contains(out, "tether-hub.service is installed and started") || !strings.Contains(out, "admin.kubeconfig") {
		t.Errorf("install hub says:\n%s", out)
	}
	hubData := l.DataDir(deploy.Hub)
	kubeconfig := filepath.Join(hubData, "admin.kubeconfig")
	waitFor(t, "the installed hub to serve", 90*time.Second, func() bool {
		_, err := inHost(kubectl, "--kubeconfig", kubeconfig, "get", "--raw", "/readyz")
		return err == nil
	})
	if v := mustInHost(l.Binary(deploy.Hub), "version"); !strings.Contains(v, "tether "+version+" ") {
		t.Errorf("installed tether version: %q, want %s", v, version)
	}
	token := strings.TrimSpace(mustInHost(l.Binary(deploy.Hub), "token", "create", "--data-dir", hubData, "--ttl", "1h"))

	// The edge, from the edge-only binary.
	const node = "installed-edge"
	edgeArgs := append([]string{"install", "edge", "--hub", "https://" + hostIP + ":6443", "--token", token,
		"--name", node, "--runtime", "sim", "--bpf-pin-dir", filepath.Join(root, "sys/fs/bpf/tether"),
		"--local-path-root", filepath.Join(root, "var/lib/tether/storage")}, installArgs...)
	out = mustInHost(filepath.Join(unpacked, "tether-edge"), edgeArgs...)
	if !strings.Contains(out, "tether-edge.service is installed and started") || !strings.Contains(out, "kubectl get node "+node) {
		t.Errorf("install edge says:\n%s", out)
	}
	unit, err := os.ReadFile(l.Unit(deploy.Edge))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"KillMode=process", "Delegate=yes", "ExecStart=" + l.Binary(deploy.Edge) + " edge --config " + l.ConfigFile(deploy.Edge)} {
		if !bytes.Contains(unit, []byte(want)) {
			t.Errorf("edge unit lacks %q:\n%s", want, unit)
		}
	}
	waitFor(t, "node "+node+" to be Ready", 60*time.Second, func() bool {
		out, err := inHost(kubectl, "--kubeconfig", kubeconfig, "get", "node", node, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && out == "True"
	})
	t.Logf("hub and edge installed, node Ready %v after the tarball", time.Since(start).Round(100*time.Millisecond))

	// Again, the same: nothing changes.
	units := []string{deploy.UnitName(deploy.Hub), deploy.UnitName(deploy.Edge)}
	state := func() string {
		return systemctl(append([]string{"show", "-p", "MainPID,ExecMainStartTimestampMonotonic,ActiveState,UnitFileState,NRestarts"}, units...)...)
	}
	filesBefore, stateBefore := installedFiles(t, root, hubData, l.DataDir(deploy.Edge)), state()
	if !strings.Contains(stateBefore, "ActiveState=active") || strings.Contains(stateBefore, "MainPID=0") {
		t.Fatalf("units after install:\n%s", stateBefore)
	}
	for _, c := range [][]string{append([]string{filepath.Join(unpacked, "tether")}, hubArgs...), append([]string{filepath.Join(unpacked, "tether-edge")}, edgeArgs...)} {
		out := mustInHost(c[0], c[1:]...)
		if !strings.Contains(out, "nothing changed") || strings.Contains(out, "wrote ") || strings.Contains(out, "restart") {
			t.Errorf("%s again says:\n%s", strings.Join(c[1:3], " "), out)
		}
	}
	if after := installedFiles(t, root, hubData, l.DataDir(deploy.Edge)); after != filesBefore {
		t.Errorf("installing again changed files:\nbefore:\n%s\nafter:\n%s", filesBefore, after)
	}
	if after := state(); after != stateBefore {
		t.Errorf("installing again restarted a unit:\nbefore:\n%s\nafter:\n%s", stateBefore, after)
	}

	// Another flag: the config is rewritten and the agent restarted.
	changed := append(append([]string{}, edgeArgs...), "--node-status-report-frequency", "4m")
	out = mustInHost(filepath.Join(unpacked, "tether-edge"), changed...)
	if !strings.Contains(out, "wrote "+l.ConfigFile(deploy.Edge)) || !strings.Contains(out, "restarted") || strings.Contains(out, "wrote "+l.Unit(deploy.Edge)) {
		t.Errorf("install edge with another flag says:\n%s", out)
	}
	if b, _ := os.ReadFile(l.ConfigFile(deploy.Edge)); !bytes.Contains(b, []byte("node-status-report-frequency: 4m0s")) {
		t.Errorf("edge config after the change:\n%s", b)
	}
	if pid := systemctl("show", "-p", "MainPID", "--value", deploy.UnitName(deploy.Edge)); strings.Contains(stateBefore, "MainPID="+pid+"\n") || pid == "0" {
		t.Errorf("edge not restarted with a new config: pid %s\n%s", pid, stateBefore)
	}
	waitFor(t, "node "+node+" to be Ready after the restart", 60*time.Second, func() bool {
		out, err := inHost(kubectl, "--kubeconfig", kubeconfig, "get", "node", node, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && out == "True"
	})

	// An upgrade in place: the agent runs the new executable in its own
	// process, so the unit sees no restart; the old executable stays
	// beside the new one until the uninstall.
	edgeState := func() string {
		return systemctl("show", "-p", "MainPID,ExecMainStartTimestampMonotonic,NRestarts", deploy.UnitName(deploy.Edge))
	}
	stateBefore = edgeState()
	newer := filepath.Join(unpacked, "tether")
	out = mustInHost(filepath.Join(unpacked, "tether-edge"), "edge", "upgrade", "--binary", newer,
		"--data-dir", l.DataDir(deploy.Edge), "--timeout", "2m")
	if !strings.Contains(out, "installed "+version) {
		t.Errorf("edge upgrade says:\n%s", out)
	}
	if after := edgeState(); after != stateBefore {
		t.Errorf("the upgrade restarted the unit:\nbefore:\n%s\nafter:\n%s", stateBefore, after)
	}
	if a, b := fileSHA256(t, l.Binary(deploy.Edge)), fileSHA256(t, newer); a != b {
		t.Errorf("installed edge executable %s after the upgrade, want %s", a, b)
	}

	// Uninstall: nothing is left.
	out = mustInHost(l.Binary(deploy.Hub), "uninstall", "--root", root, "--systemctl", self)
	if !strings.Contains(out, "uninstalled tether-edge.service") || !strings.Contains(out, "uninstalled tether-hub.service") {
		t.Errorf("uninstall says:\n%s", out)
	}
	var left []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, "file "+p)
		}
		return nil
	})
	for _, d := range []string{"etc/tether", "var/lib/tether"} {
		if _, err := os.Stat(filepath.Join(root, d)); err == nil {
			left = append(left, "directory "+filepath.Join(root, d))
		}
	}
	for _, u := range units {
		if s := systemctl("is-active", u); s != "inactive" {
			left = append(left, u+" "+s)
		}
		if s := systemctl("is-enabled", u); s != "not-found" {
			left = append(left, u+" "+s)
		}
	}
	if pids := cgroupProcs(cg); len(pids) > 0 {
		left = append(left, fmt.Sprintf("processes in the units' cgroups: %v", pids))
	}
	left = append(left, processesNaming(root)...)
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, m := range strings.Split(string(mi), "\n") {
			if strings.Contains(m, root) {
				left = append(left, "mount "+m)
			}
		}
	}
	if links := mustInHost("ip", "-o", "link", "show"); links != linksBefore {
		left = append(left, "interfaces: "+links)
	}
	if len(left) > 0 {
		t.Errorf("left after uninstall:\n\t%s", strings.Join(left, "\n\t"))
	}
	t.Logf("whole run %v (machine load: %s)", time.Since(start).Round(100*time.Millisecond), loadavg())
}

// releaseTarball returns the version and the path of a release tarball for
// this machine's architecture: from TETHER_RELEASE_DIR, or built with
// scripts/release.sh into dir.
func releaseTarball(t *testing.T, dir string) (version, path string) {
	t.Helper()
	rel := os.Getenv("TETHER_RELEASE_DIR")
	if rel == "" {
		rel = filepath.Join(dir, "release")
		version = "0.0.0-installtest"
		cmd := exec.Command("bash", filepath.Join(hubtest.RepoRoot(), "scripts", "release.sh"), version, rel)
		cmd.Env = append(os.Environ(), "TETHER_RELEASE_ARCHES="+runtime.GOARCH, "TETHER_RELEASE_TRIMPATH=0")
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("scripts/release.sh: %v\n%s", err, out)
		}
		t.Logf("scripts/release.sh (%s only) took %v (machine load: %s)", runtime.GOARCH, time.Since(start).Round(time.Second), loadavg())
	}
	sums, err := os.ReadFile(filepath.Join(rel, "SHA256SUMS"))
	if err != nil {
		t.Fatalf("release without SHA256SUMS: %v", err)
	}
	suffix := "-linux-" + runtime.GOARCH + ".tar.gz"
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || !strings.HasSuffix(f[1], suffix) {
			continue
		}
		path = filepath.Join(rel, f[1])
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != f[0] {
			t.Fatalf("%s does not match SHA256SUMS", path)
		}
		return strings.TrimSuffix(strings.TrimPrefix(f[1], "tether-"), suffix), path
	}
	t.Fatalf("no *%s in %s/SHA256SUMS:\n%s", suffix, rel, sums)
	return "", ""
}

// installedFiles lists every file under root but the data directories,
// with its mode, size, modification time and SHA-256.
func installedFiles(t *testing.T, root string, skip ...string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		for _, s := range skip {
			if p == s {
				return filepath.SkipDir
			}
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v %d %d", p, info.Mode(), info.Size(), info.ModTime().UnixNano())
		if info.Mode().IsRegular() {
			c, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %x", sha256.Sum256(c))
		}
		b.WriteString(line + "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func cgroup2Mount(t *testing.T) string {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range strings.Split(string(mi), "\n") {
		_, rest, ok := strings.Cut(m, " - ")
		f, mf := strings.Fields(rest), strings.Fields(m)
		if ok && len(f) > 0 && f[0] == "cgroup2" && len(mf) > 4 {
			return mf[4]
		}
	}
	t.Skip("no cgroup v2 mounted: the supervisor places each unit in a cgroup v2")
	return ""
}

func cgroupProcs(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids = append(pids, n)
			}
		}
		return nil
	})
	return pids
}

// processesNaming lists the processes whose command line names s.
func processesNaming(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			out = append(out, "process "+e.Name()+": "+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return out
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}
