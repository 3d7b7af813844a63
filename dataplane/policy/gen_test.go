package policy

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// TestBPFObjectUpToDate regenerates policy_bpfel.go and policy_bpfel.o
// with gen.go's command and fails when the committed files differ (the Go
// bindings byte for byte, the object in its programs and maps, so that
// another clang build's bytes alone do not fail it).
func TestBPFObjectUpToDate(t *testing.T) {
	if _, err := exec.LookPath("clang"); err != nil {
		t.Skip("clang is not installed: the eBPF object cannot be regenerated (apt-get install clang llvm libbpf-dev)")
	}
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for line := range strings.SplitSeq(string(src), "\n") {
		if rest, ok := strings.CutPrefix(line, "//go:generate "); ok {
			args = strings.Fields(rest)
		}
	}
	if len(args) < 3 {
		t.Fatal("gen.go has no go:generate line")
	}
	out := t.TempDir()
	args = slices.Insert(args, 3, "-output-dir", out, "-go-package", "policy")
	cmd := exec.Command(args[0], args[1:]...)
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("regenerate: %v\n%s", err, output)
	}
	for _, name := range []string{"policy_bpfel.go", "policy_bpfel.o"} {
		committed, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		fresh, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(committed, fresh) {
			continue
		}
		if strings.HasSuffix(name, ".go") || describe(t, committed) != describe(t, fresh) {
			t.Errorf("dataplane/policy/%s differs from what go generate ./dataplane/policy produces; run it and commit the result", name)
		}
	}
}

func describe(t *testing.T, obj []byte) string {
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(obj))
	if err != nil {
		t.Fatalf("load eBPF object: %v", err)
	}
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(spec.Programs)) {
		p := spec.Programs[name]
		fmt.Fprintf(&b, "program %s %v %v %s\n%v\n", name, p.Type, p.AttachType, p.SectionName, p.Instructions)
	}
	for _, name := range slices.Sorted(maps.Keys(spec.Maps)) {
		m := spec.Maps[name]
		b.WriteString(fmt.Sprintf("map %s %v %d %d %d %d\n", name, m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags))
	}
	return b.String()
}
