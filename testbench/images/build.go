package images

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// Names of the images Build writes. They share one layer: the testapp
// binary (see testapp/main.go) plus busybox, and differ in their default
// command.
const (
	Echo    = "docker.io/tether/echo:v1"    // testapp serve :8080
	Crasher = "docker.io/tether/crasher:v1" // testapp crash 1
	MemHog  = "docker.io/tether/memhog:v1"  // testapp memhog 256
	Sleeper = "docker.io/tether/sleeper:v1" // testapp sleep
	Burner  = "docker.io/tether/burner:v1"  // testapp burn 500 ($BURN_MILLICORES)
	// Demo is the demo HTTP server scripts/up.sh deploys.
	Demo = "docker.io/tether/demo:v1"
)

// busyboxApplets are linked into /bin when /bin/busybox is a static
// busybox: tests exec shells, and kubectl cp needs tar.
var busyboxApplets = []string{"sh", "cat", "ls", "tar", "echo", "sleep", "env", "id", "mkdir", "rm", "stat", "touch", "head", "wc", "grep", "test", "true", "false", "hostname", "kill", "ps", "date", "printf", "sync", "readlink", "mount"}

var (
	buildOnce sync.Once
	binary    []byte
	buildErr  error
)

// moduleRoot is the tether repository's top directory.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// testapp compiles testapp once per process.
func testapp() ([]byte, error) {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tether-testapp")
		if err != nil {
			buildErr = fmt.Errorf("build testapp: %w", err)
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "testapp")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./testbench/images/testapp")
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		if msg, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build testapp: %w: %s", err, msg)
			return
		}
		binary, buildErr = os.ReadFile(out)
	})
	return binary, buildErr
}

// layer is the files of the shared layer.
func layer() ([]File, error) {
	bin, err := testapp()
	if err != nil {
		return nil, err
	}
	files := []File{
		{Path: "testapp", Mode: 0o755, Data: bin},
		{Path: "tmp", Dir: true, Mode: 0o1777},
		{Path: "etc", Dir: true, Mode: 0o755},
		{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		{Path: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	// Only a static busybox works in an image without libc.
	if bb, err := os.ReadFile("/bin/busybox"); err == nil && isStatic("/bin/busybox") {
		files = append(files, File{Path: "bin/busybox", Mode: 0o755, Data: bb})
		for _, a := range busyboxApplets {
			files = append(files, File{Path: "bin/" + a, Link: "busybox"})
		}
	}
	return files, nil
}

// isStatic tells whether the ELF file at path has no interpreter.
func isStatic(path string) bool {
	out, err := exec.Command("sh", "-c", "LC_ALL=C file -L "+path).Output()
	if err != nil {
		// Without file(1), trust the Debian package name's promise.
		_, err := os.Stat("/usr/share/doc/busybox-static")
		return err == nil
	}
	return !containsAny(string(out), "dynamically linked", "interpreter")
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// HasShell tells whether the images Build writes have /bin/sh (busybox).
func HasShell() bool {
	_, err := os.Stat("/bin/busybox")
	return err == nil && isStatic("/bin/busybox")
}

// Build writes the test images (Echo, Crasher, MemHog, Sleeper, Burner) as one
// OCI archive at dst.
func Build(dst string) error {
	files, err := layer()
	if err != nil {
		return err
	}
	env := []string{"PATH=/bin:/"}
	return WriteArchive(dst,
		Image{Name: Echo, Entrypoint: []string{"/testapp"}, Cmd: []string{"serve", ":8080"}, Env: env, Layer: files},
		Image{Name: Crasher, Entrypoint: []string{"/testapp"}, Cmd: []string{"crash", "1"}, Env: env, Layer: files},
		Image{Name: MemHog, Entrypoint: []string{"/testapp"}, Cmd: []string{"memhog", "256"}, Env: env, Layer: files},
		Image{Name: Sleeper, Entrypoint: []string{"/testapp"}, Cmd: []string{"sleep"}, Env: env, Layer: files},
		Image{Name: Burner, Entrypoint: []string{"/testapp"}, Cmd: []string{"burn"}, Env: env, Layer: files},
	)
}

// BuildDemo writes the demo image (Demo: an HTTP server on :8080 saying
// hello with its host name) as an OCI archive at dst.
func BuildDemo(dst string) error {
	bin, err := testapp()
	if err != nil {
		return err
	}
	return WriteArchive(dst, Image{
		Name: Demo, Entrypoint: []string{"/testapp"}, Cmd: []string{"serve", ":8080"},
		Env: []string{"PATH=/"}, Layer: []File{{Path: "testapp", Mode: 0o755, Data: bin}, {Path: "tmp", Dir: true, Mode: 0o1777}},
	})
}
