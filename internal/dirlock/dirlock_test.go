package dirlock

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAcquireIsExclusive locks a directory itself and a file in it: a
// second Acquire of the same is refused with this process's ID (flock(2)
// locks belong to the open file, so a second Acquire in one process is
// refused as another process's would be), the other lock is independent,
// and Release frees the lock.
func TestAcquireIsExclusive(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	for _, name := range []string{"", "x.lock"} {
		l, err := Acquire(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Acquire(dir, name)
		var held *HeldError
		if !errors.As(err, &held) || held.PID != os.Getpid() {
			t.Fatalf("second Acquire(%q): %v, want a HeldError naming process %d", name, err, os.Getpid())
		}
		if want := "process " + strconv.Itoa(os.Getpid()); !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
		if name == "" {
			// The directory lock writes nothing into the directory.
			if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
				t.Errorf("directory lock: the directory holds %v (%v)", entries, err)
			}
		} else if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
			t.Errorf("lock file holds %q, %v; want this process's ID", b, err)
		}
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
		l2, err := Acquire(dir, name)
		if err != nil {
			t.Fatalf("Acquire(%q) after Release: %v", name, err)
		}
		defer l2.Release()
	}
}

// TestLockGoesWithTheProcess kills the holder with SIGKILL: the lock is
// free at once.
func TestLockGoesWithTheProcess(t *testing.T) {
	if dir := os.Getenv("DIRLOCK_HOLD"); dir != "" {
		if _, err := Acquire(dir, os.Getenv("DIRLOCK_NAME")); err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("held\n")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	for _, name := range []string{"", "x.lock"} {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestLockGoesWithTheProcess$")
		cmd.Env = append(os.Environ(), "DIRLOCK_HOLD="+dir, "DIRLOCK_NAME="+name)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if _, err := out.Read(buf); err != nil || string(buf) != "held\n" {
			t.Fatalf("holder said %q, %v", buf, err)
		}
		_, err = Acquire(dir, name)
		var held *HeldError
		if !errors.As(err, &held) || held.PID != cmd.Process.Pid {
			t.Fatalf("Acquire(%q) while the child holds it: %v, want a HeldError naming %d", name, err, cmd.Process.Pid)
		}
		cmd.Process.Kill()
		cmd.Wait()
		l, err := Acquire(dir, name)
		if err != nil {
			t.Fatalf("Acquire(%q) after the holder was killed: %v", name, err)
		}
		l.Release()
	}
}
