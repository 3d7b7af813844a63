package repotest

import (
	"bytes"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// pkgInfo is what `go list` says about one package: its path relative to the
// module (or its full path outside the module) and its imports.
type pkgInfo struct {
	path string
	// root is set for the module's own packages (not dependencies).
	root bool
	// imports are the non-test imports (go list's Imports, which leaves out
	// TestImports and XTestImports: tests may import anything).
	imports []string
}

// importRule forbids the non-test code of the packages matching from to
// depend on packages matching to. With direct set only a direct import
// counts; otherwise a dependency through any chain of packages does.
type importRule struct {
	from, to []string
	direct   bool
	why      string
}

// importRules are the import rules of docs/architecture.md. A pattern is a
// package path relative to the module; "x/..." matches x and everything below
// it. Packages outside the module are written in full.
var importRules = []importRule{
	{from: []string{"store/..."}, to: []string{"k8s.io/api/..."},
		why: "store knows no Kubernetes kinds"},
	{from: []string{"hub/registry/..."}, to: []string{"store/...", "hub/storage/..."},
		why: "hub/registry knows no storage"},
	{from: []string{"hub/apiserver/..."}, to: []string{"store/..."}, direct: true,
		why: "hub/apiserver talks to objects only through storage.API"},
	{from: []string{"scheduler/...", "controllers/...", "edge/..."}, to: []string{"hub/...", "store/..."},
		why: "scheduler, controllers and edge talk to the hub only through the Kubernetes API"},
	{from: []string{"tunnel/...", "join/..."}, to: []string{"hub/...", "edge/..."},
		why: "tunnel and join import neither hub nor edge"},
}

// isTestSupport reports whether a module package exists only for tests: its
// last path element ends in "test" (hub/hubtest, store/storetest,
// controllers/internal/kit/kittest, internal/repotest), as net/http/httptest
// does in the standard library. Test-support code counts as test code.
func isTestSupport(path string) bool {
	return strings.HasSuffix(path[strings.LastIndex(path, "/")+1:], "test")
}

// matches reports whether path matches one of patterns.
func matches(path string, patterns []string) bool {
	for _, p := range patterns {
		if base, ok := strings.CutSuffix(p, "/..."); ok {
			if path == base || strings.HasPrefix(path, base+"/") {
				return true
			}
		} else if path == p {
			return true
		}
	}
	return false
}

// listPackages runs `go list -deps` over the module and returns every package
// the module's packages need, keyed by path; the module's own packages'
// paths are relative to the module ("hub/registry"), the module root's is ".".
func listPackages(t *testing.T) map[string]*pkgInfo {
	t.Helper()
	return listDeps(t, "", "...")
}

// listDeps is listPackages for the packages matching pattern (relative to
// the module: "...", "cmd/tether") built with the build tags tags.
func listDeps(t *testing.T, tags, pattern string) map[string]*pkgInfo {
	t.Helper()
	modOut, err := exec.Command("go", "list", "-m").Output()
	if err != nil {
		t.Fatalf("list module: %v", err)
	}
	module := strings.TrimSpace(string(modOut))
	rel := func(p string) string {
		if p == module {
			return "."
		}
		if r, ok := strings.CutPrefix(p, module+"/"); ok {
			return r
		}
		return p
	}
	cmd := exec.Command("go", "list", "-deps", "-tags", tags, "-f",
		`{{.ImportPath}}|{{not .DepOnly}}|{{join .Imports " "}}`,
		module+"/"+pattern)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("list packages: %v\n%s", err, stderr.Bytes())
	}
	pkgs := map[string]*pkgInfo{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 3 {
			t.Fatalf("unexpected go list line %q", line)
		}
		p := &pkgInfo{path: rel(f[0]), root: f[1] == "true"}
		for _, imp := range strings.Fields(f[2]) {
			p.imports = append(p.imports, rel(imp))
		}
		pkgs[p.path] = p
	}
	return pkgs
}

// chainTo returns the shortest chain of non-test imports from one package to a
// package matching to, or nil if there is none.
func chainTo(pkgs map[string]*pkgInfo, from string, to []string, direct bool) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		p := pkgs[cur]
		if p == nil {
			continue
		}
		for _, imp := range p.imports {
			if _, seen := prev[imp]; seen {
				continue
			}
			prev[imp] = cur
			if matches(imp, to) {
				var chain []string
				for n := imp; n != ""; n = prev[n] {
					chain = append(chain, n)
				}
				slices.Reverse(chain)
				return chain
			}
			if !direct {
				queue = append(queue, imp)
			}
		}
	}
	return nil
}

// checkImports returns one line per broken import rule, each naming the
// importing package and the offending import.
func checkImports(pkgs map[string]*pkgInfo) []string {
	var roots []string
	for path, p := range pkgs {
		if p.root {
			roots = append(roots, path)
		}
	}
	slices.Sort(roots)
	var problems []string
	for _, path := range roots {
		if isTestSupport(path) {
			continue
		}
		for _, r := range importRules {
			if !matches(path, r.from) {
				continue
			}
			if chain := chainTo(pkgs, path, r.to, r.direct); chain != nil {
				problems = append(problems, fmt.Sprintf("%s imports %s (%s): %s",
					path, chain[len(chain)-1], r.why, strings.Join(chain, " → ")))
			}
		}
	}
	// Only tests import testbench, except testbench's own packages (its
	// command and the packages it is made of); only tests import test-support
	// packages.
	for _, path := range roots {
		if isTestSupport(path) {
			continue
		}
		for _, imp := range pkgs[path].imports {
			switch {
			case matches(imp, []string{"testbench/..."}) && !matches(path, []string{"testbench/..."}):
				problems = append(problems, fmt.Sprintf("%s imports %s (nothing imports testbench but tests)", path, imp))
			case pkgs[imp] != nil && pkgs[imp].root && isTestSupport(imp):
				problems = append(problems, fmt.Sprintf("%s imports %s (a test-support package, for tests only)", path, imp))
			}
		}
	}
	return problems
}

// TestImportRules checks the import rules of docs/architecture.md against
// the module's packages. Tests (and test-support packages such as
// hub/hubtest) may import anything; the rules bind the product's code, and
// a dependency through other packages breaks them as a direct import would
// unless the rule says direct.
func TestImportRules(t *testing.T) {
	pkgs := listPackages(t)
	for _, r := range importRules {
		found := false
		for path, p := range pkgs {
			found = found || (p.root && matches(path, r.from))
		}
		if !found {
			t.Errorf("rule %q: no package matches %v; update importRules", r.why, r.from)
		}
	}
	for _, p := range checkImports(pkgs) {
		t.Error(p)
	}
}

// TestImportRulesReportOffender feeds checkImports a made-up module that
// breaks each rule and checks that every break is reported with the
// offending import named.
func TestImportRulesReportOffender(t *testing.T) {
	pkg := func(path string, imports ...string) *pkgInfo {
		return &pkgInfo{path: path, root: !strings.Contains(path, "."), imports: imports}
	}
	pkgs := map[string]*pkgInfo{}
	for _, p := range []*pkgInfo{
		pkg("store", "k8s.io/apimachinery/pkg/labels"),
		pkg("store/sqlite", "store", "store/internal/kinds"),
		pkg("store/internal/kinds", "k8s.io/api/core/v1"),
		pkg("k8s.io/api/core/v1", "k8s.io/apimachinery/pkg/apis/meta/v1"),
		pkg("k8s.io/apimachinery/pkg/labels"),
		pkg("hub/storage", "store"),
		pkg("hub/registry", "hub/storage"),
		pkg("hub/apiserver", "hub/storage", "store"),
		pkg("scheduler", "hub/hubtest"),
		pkg("hub/hubtest"),
		pkg("edge", "edge/state", "join"),
		pkg("edge/state"),
		pkg("join", "edge/state"),
		pkg("testbench"),
		pkg("testbench/hollow", "testbench", "edge"),
		pkg("controllers", "testbench/hollow"),
		pkg("controllers/internal/kit/kittest", "hub/hubtest", "testbench/hollow"),
	} {
		pkgs[p.path] = p
	}
	got := checkImports(pkgs)
	want := []string{
		"controllers imports testbench/hollow (nothing imports testbench but tests)",
		"hub/apiserver imports store (hub/apiserver talks to objects only through storage.API): hub/apiserver → store",
		"hub/registry imports hub/storage (hub/registry knows no storage): hub/registry → hub/storage",
		"join imports edge/state (tunnel and join import neither hub nor edge): join → edge/state",
		"scheduler imports hub/hubtest (a test-support package, for tests only)",
		"scheduler imports hub/hubtest (scheduler, controllers and edge talk to the hub only through the Kubernetes API): scheduler → hub/hubtest",
		"store/internal/kinds imports k8s.io/api/core/v1 (store knows no Kubernetes kinds): store/internal/kinds → k8s.io/api/core/v1",
		"store/sqlite imports k8s.io/api/core/v1 (store knows no Kubernetes kinds): store/sqlite → store/internal/kinds → k8s.io/api/core/v1",
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("checkImports reported\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}
