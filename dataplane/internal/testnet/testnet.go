// Package testnet builds throw-away network namespaces, veth pairs and
// cgroups for the dataplane's privileged tests, and removes them again even
// when a test fails.
package testnet

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RequireRoot skips the test unless it runs as root with the tools it needs.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, cgroups and BPF programs")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2)")
	}
}

// Suffix returns a short random suffix for names that must not collide
// with parallel test runs.
func Suffix() string {
	var b [3]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Netns is a named network namespace owned by a test.
type Netns struct {
	Name string
}

// Path is the namespace's bind-mount path.
func (n *Netns) Path() string { return "/var/run/netns/" + n.Name }

// NewNetns creates a network namespace with loopback up and deletes it when
// the test ends.
func NewNetns(t testing.TB, name string) *Netns {
	t.Helper()
	n := &Netns{Name: "tdp-" + name + "-" + Suffix()}
	MustIP(t, "netns", "add", n.Name)
	t.Cleanup(func() { IP("netns", "del", n.Name) })
	MustIP(t, "-n", n.Name, "link", "set", "lo", "up")
	return n
}

// IP runs the ip command.
func IP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// MustIP runs the ip command and fails the test on error.
func MustIP(t testing.TB, args ...string) {
	t.Helper()
	if err := IP(args...); err != nil {
		t.Fatal(err)
	}
}

// Veth connects two namespaces with a veth pair and gives each end the
// addresses listed (CIDR notation).
func Veth(t testing.TB, a *Netns, aName string, aAddrs []string, b *Netns, bName string, bAddrs []string) {
	t.Helper()
	tmp := "tdpv" + Suffix()
	MustIP(t, "link", "add", tmp, "type", "veth", "peer", "name", tmp+"p")
	MustIP(t, "link", "set", tmp, "netns", a.Name, "name", aName)
	MustIP(t, "link", "set", tmp+"p", "netns", b.Name, "name", bName)
	for _, side := range []struct {
		ns    *Netns
		name  string
		addrs []string
	}{{a, aName, aAddrs}, {b, bName, bAddrs}} {
		for _, addr := range side.addrs {
			MustIP(t, "-n", side.ns.Name, "addr", "add", addr, "dev", side.name)
		}
		MustIP(t, "-n", side.ns.Name, "link", "set", side.name, "up")
	}
}

// Do runs fn on an OS thread inside the namespace. The thread is discarded
// afterwards so no goroutine ever runs in the wrong namespace by accident.
func (n *Netns) Do(fn func() error) error {
	h, err := netns.GetFromPath(n.Path())
	if err != nil {
		return fmt.Errorf("open netns %s: %w", n.Name, err)
	}
	errc := make(chan error, 1)
	go func() {
		defer h.Close()
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := netns.Set(h); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", n.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Go starts fn on a thread inside the namespace and returns at once.
func (n *Netns) Go(fn func()) error {
	h, err := netns.GetFromPath(n.Path())
	if err != nil {
		return fmt.Errorf("open netns %s: %w", n.Name, err)
	}
	ready := make(chan error, 1)
	go func() {
		defer h.Close()
		runtime.LockOSThread()
		if err := netns.Set(h); err != nil {
			ready <- err
			return
		}
		ready <- nil
		fn()
	}()
	return <-ready
}

// Sysctl writes a sysctl inside the namespace (which changes nothing outside
// it for per-namespace settings like net.ipv4.ip_forward).
func (n *Netns) Sysctl(t testing.TB, key, value string) {
	t.Helper()
	err := n.Do(func() error {
		return os.WriteFile("/proc/sys/"+strings.ReplaceAll(key, ".", "/"), []byte(value), 0o644)
	})
	if err != nil {
		t.Fatalf("sysctl %s=%s in %s: %v", key, value, n.Name, err)
	}
}

// Cgroup2Root finds the cgroup v2 mount.
func Cgroup2Root() (string, error) {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 mount")
}

// NewCgroup creates an empty cgroup v2 directory that is removed when the
// test ends.
func NewCgroup(t testing.TB) string {
	t.Helper()
	root, err := Cgroup2Root()
	if err != nil {
		t.Skipf("needs cgroup v2: %v", err)
	}
	dir := filepath.Join(root, "tether-dp-test-"+Suffix())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	return dir
}

// JoinCgroup moves the whole test process into the cgroup and moves it back
// when the test ends. Sockets take their cgroup at creation, so only sockets
// created in between are load-balanced by programs attached there.
func JoinCgroup(t testing.TB, dir string) {
	t.Helper()
	root, _ := Cgroup2Root()
	orig, err := currentCgroup()
	if err != nil {
		t.Fatalf("read own cgroup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		t.Fatalf("join cgroup %s: %v", dir, err)
	}
	t.Cleanup(func() {
		back := filepath.Join(root, orig, "cgroup.procs")
		if err := os.WriteFile(back, []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
			t.Errorf("leave cgroup %s: %v", dir, err)
		}
	})
}

// currentCgroup returns the process's cgroup v2 path relative to the root.
func currentCgroup() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			return rest, nil
		}
	}
	return "", errors.New("no cgroup v2 entry in /proc/self/cgroup")
}

// BPFFSDir returns a fresh directory in bpffs for a test's pins, removed
// (with whatever is left in it) when the test ends. When /sys/fs/bpf is not
// a bpffs mount the test gets a private bpffs instance of its own instead of
// changing the host's mounts.
func BPFFSDir(t testing.TB) string {
	t.Helper()
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/bpf", &st) == nil && st.Type == unix.BPF_FS_MAGIC {
		dir := filepath.Join("/sys/fs/bpf", "tether-test-"+Suffix())
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	mnt, err := os.MkdirTemp("", "tether-bpffs-")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(mnt)
		t.Skipf("needs bpffs: %v", err)
	}
	t.Cleanup(func() {
		unix.Unmount(mnt, unix.MNT_DETACH)
		os.Remove(mnt)
	})
	return filepath.Join(mnt, "tether")
}
