package hubtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	helmOnce sync.Once
	helmBin  string
	helmErr  error
)

// Helm returns the pinned upstream Helm CLI: $TETHER_HELM when set,
// otherwise built (once per process) from tools/helm, which takes minutes
// on a cold build cache.
func Helm(t testing.TB) string {
	t.Helper()
	helmOnce.Do(func() {
		if h := os.Getenv("TETHER_HELM"); h != "" {
			helmBin = h
			return
		}
		removeStaleBuilds()
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("tether-e2e-helm-%d", os.Getpid()))
		os.RemoveAll(dir)
		if helmErr = os.Mkdir(dir, 0o755); helmErr != nil {
			return
		}
		helmBin = filepath.Join(dir, "helm")
		cmd := exec.Command("bash", "build.sh", helmBin)
		cmd.Dir = filepath.Join(RepoRoot(), "tools", "helm")
		if out, err := cmd.CombinedOutput(); err != nil {
			helmErr = fmt.Errorf("build helm: %v\n%s", err, out)
		}
	})
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	return helmBin
}

// HelmEnv is the environment for running Helm with its configuration,
// cache and data under dir, so that a test neither reads nor writes the
// user's.
func HelmEnv(dir string) []string {
	return []string{
		"HELM_CONFIG_HOME=" + filepath.Join(dir, "config"),
		"HELM_CACHE_HOME=" + filepath.Join(dir, "cache"),
		"HELM_DATA_HOME=" + filepath.Join(dir, "data"),
	}
}
