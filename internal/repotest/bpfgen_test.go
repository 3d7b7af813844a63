package repotest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
)

// TestBPFObjectsUpToDate regenerates the dataplane's eBPF object and its Go
// bindings (dataplane/lb_bpfel.o, dataplane/lb_bpfel.go) from dataplane/bpf
// into a temporary directory, with the command dataplane/gen.go gives to go
// generate, and fails when the committed files differ: an edit of
// bpf/lb.c or lb.h committed without `go generate ./dataplane` would
// otherwise ship the old programs.
//
// The Go bindings must match byte for byte. The object is compared byte for
// byte first: bpf2go compiles with relative source paths and strips DWARF,
// so Debian's clang 14 reproduces it exactly. Should another clang build
// produce different bytes, what the kernel gets is compared instead, through
// cilium/ebpf's ELF loader: each program's type, attach type, section,
// license and instructions (with the map and function references they carry)
// and each map's type, sizes, flags, pinning and initial contents. Only that
// comparison failing fails the test; a byte difference alone is logged.
//
// The test skips only when clang is not installed; CI installs clang, llvm
// (for llvm-strip) and libbpf-dev (scripts/test.sh).
func TestBPFObjectsUpToDate(t *testing.T) {
	if _, err := exec.LookPath("clang"); err != nil {
		t.Skip("clang is not installed: the eBPF object cannot be regenerated (apt-get install clang llvm libbpf-dev)")
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "dataplane"))
	if err != nil {
		t.Fatalf("find dataplane: %v", err)
	}
	args := generateArgs(t, filepath.Join(dir, "gen.go"))
	out := t.TempDir()
	// bpf2go's own flags come before its positional arguments.
	args = slices.Insert(args, 3, "-output-dir", out, "-go-package", "dataplane")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("regenerate eBPF objects: %s: %v\n%s", strings.Join(args, " "), err, output)
	}

	for _, name := range []string{"lb_bpfel.go", "lb_bpfel.o"} {
		committed, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("read committed %s: %v", name, err)
		}
		fresh, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatalf("read regenerated %s: %v", name, err)
		}
		if bytes.Equal(committed, fresh) {
			continue
		}
		if strings.HasSuffix(name, ".go") {
			t.Errorf("dataplane/%s differs from what go generate ./dataplane produces; run it and commit the result (-committed +generated):\n%s",
				name, cmp.Diff(strings.Split(string(committed), "\n"), strings.Split(string(fresh), "\n")))
			continue
		}
		if diff := cmp.Diff(describeObject(t, committed), describeObject(t, fresh)); diff != "" {
			t.Errorf("dataplane/%s's programs or maps differ from what go generate ./dataplane produces; run it and commit the result (-committed +generated):\n%s", name, diff)
		} else {
			t.Logf("dataplane/%s differs in bytes from a fresh build but not in programs or maps (another clang build?)", name)
		}
	}
}

// generateArgs returns the command of the go:generate line in file, which
// must be "go tool bpf2go ...".
func generateArgs(t *testing.T, file string) []string {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read %s: %v", file, err)
	}
	for line := range strings.SplitSeq(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "//go:generate "); ok {
			args := strings.Fields(rest)
			if len(args) < 3 || args[0] != "go" || args[1] != "tool" || args[2] != "bpf2go" {
				t.Fatalf("%s: go:generate runs %q, not go tool bpf2go", file, rest)
			}
			return args
		}
	}
	t.Fatalf("%s has no go:generate line", file)
	return nil
}

// describeObject lists what the kernel gets from an eBPF object: its
// programs and maps, as comparable text, keyed by name.
func describeObject(t *testing.T, obj []byte) map[string]string {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(obj))
	if err != nil {
		t.Fatalf("load eBPF object: %v", err)
	}
	d := map[string]string{}
	for name, p := range spec.Programs {
		d["program "+name] = fmt.Sprintf("type %v attach %v section %s license %s flags %d\n%v",
			p.Type, p.AttachType, p.SectionName, p.License, p.Flags, p.Instructions)
	}
	for name, m := range spec.Maps {
		s := fmt.Sprintf("type %v key %d value %d entries %d flags %d pinning %v extra %d key type %v value type %v\n",
			m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags, m.Pinning, m.MapExtra, m.Key, m.Value)
		for _, kv := range m.Contents {
			s += fmt.Sprintf("%v: %v\n", kv.Key, kv.Value)
		}
		if m.InnerMap != nil {
			s += fmt.Sprintf("inner type %v key %d value %d entries %d\n",
				m.InnerMap.Type, m.InnerMap.KeySize, m.InnerMap.ValueSize, m.InnerMap.MaxEntries)
		}
		d["map "+name] = s
	}
	return d
}
