package hubtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// toolBuild is one pinned tool of tools/, built at most once per process.
type toolBuild struct {
	once sync.Once
	bin  string
	err  error
}

// The pinned tools besides kubectl and Helm 4, by directory under tools/.
var (
	helm3Build          toolBuild
	certManagerBuild    toolBuild
	sampleOperatorBuild toolBuild
)

// get returns the tool's binary: $env when set, otherwise built (once per
// process) by tools/dir/build.sh, which takes minutes on a cold build cache.
func (b *toolBuild) get(t testing.TB, env, dir, file string) string {
	t.Helper()
	b.once.Do(func() {
		if p := os.Getenv(env); p != "" {
			b.bin = p
			return
		}
		removeStaleBuilds()
		tmp := filepath.Join(os.TempDir(), fmt.Sprintf("tether-e2e-%s-%d", dir, os.Getpid()))
		os.RemoveAll(tmp)
		if b.err = os.Mkdir(tmp, 0o755); b.err != nil {
			return
		}
		b.bin = filepath.Join(tmp, file)
		cmd := exec.Command("bash", "build.sh", b.bin)
		cmd.Dir = filepath.Join(RepoRoot(), "tools", dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build %s: %v\n%s", dir, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin
}

// Helm3 returns the pinned upstream Helm 3 CLI: $TETHER_HELM3 when set,
// otherwise built from tools/helm3.
func Helm3(t testing.TB) string {
	t.Helper()
	return helm3Build.get(t, "TETHER_HELM3", "helm3", "helm")
}

// CertManager returns cert-manager's controller built from the module
// pinned in tools/certmanager ($TETHER_CERTMANAGER when set) and the file
// of that module version's CustomResourceDefinitions, which build.sh
// writes next to the binary.
func CertManager(t testing.TB) (controller, crds string) {
	t.Helper()
	bin := certManagerBuild.get(t, "TETHER_CERTMANAGER", "certmanager", "cert-manager-controller")
	return bin, bin + "-crds.yaml"
}

// SampleOperator returns the controller-runtime operator of
// tools/sampleoperator ($TETHER_SAMPLEOPERATOR when set) and its
// CustomResourceDefinition.
func SampleOperator(t testing.TB) (operator, crd string) {
	t.Helper()
	bin := sampleOperatorBuild.get(t, "TETHER_SAMPLEOPERATOR", "sampleoperator", "sampleoperator")
	return bin, filepath.Join(RepoRoot(), "tools", "sampleoperator", "crd.yaml")
}
