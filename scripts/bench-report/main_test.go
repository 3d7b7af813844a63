package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReportRewritesTable runs the report on a `go test -v` output with
// figures of several packages, parallel tests, a benchmark, a failed
// package and a metric printed twice, and checks the whole document.
func TestReportRewritesTable(t *testing.T) {
	doc := copyDoc(t)
	if err := run([]string{"-doc", doc, "-commit", "1234abc", "-module", "github.com/tether-edge/tether", "testdata/run.txt"}, nil, io.Discard); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("testdata/want.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("document after the report:\n%s\nwant:\n%s", got, want)
	}
}

// TestReportReplace drops the rows the run did not measure.
func TestReportReplace(t *testing.T) {
	doc := copyDoc(t)
	in := strings.NewReader("=== RUN   TestAPIBenchmark\nBENCH name=api_hub_rss_idle value=25 unit=MB target=<=40\nok  \tgithub.com/tether-edge/tether/hub\t9s\n")
	if err := run([]string{"-doc", doc, "-commit", "5678def", "-module", "github.com/tether-edge/tether", "-replace"}, in, io.Discard); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	if strings.Contains(got, "store_list_p50") {
		t.Errorf("-replace kept a row the run did not measure:\n%s", got)
	}
	row := "| `api_hub_rss_idle` | ≤ 40 MB: met | 25 MB | — | — | `go test -v -run '^TestAPIBenchmark$' ./hub` | 5678def |"
	if !strings.Contains(got, row) {
		t.Errorf("no row %q in:\n%s", row, got)
	}
	if !strings.HasSuffix(got, "## Method\nProse that stays.\n") {
		t.Errorf("the prose after the table changed:\n%s", got)
	}
}

// TestReportNeedsMarkersAndFigures refuses a document without the
// markers and an output without figures, leaving the document as it was.
func TestReportNeedsMarkersAndFigures(t *testing.T) {
	dir := t.TempDir()
	doc := filepath.Join(dir, "doc.md")
	if err := os.WriteFile(doc, []byte("# no table\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-doc", doc, "-commit", "x", "-module", "m"}
	if err := run(append(args, "testdata/run.txt"), nil, io.Discard); err == nil || !strings.Contains(err.Error(), "markers") {
		t.Errorf("without markers: %v, want an error naming the markers", err)
	}
	if err := run(args, strings.NewReader("ok  \tm/x\t1s\n"), io.Discard); err == nil || !strings.Contains(err.Error(), "no BENCH lines") {
		t.Errorf("without figures: %v, want an error", err)
	}
	if b, _ := os.ReadFile(doc); string(b) != "# no table\n" {
		t.Errorf("document changed to %q", b)
	}
}

// TestReportFindsCommitAndModule fills the commit from git and the module
// from the go.mod above the document, as on a real run.
func TestReportFindsCommitAndModule(t *testing.T) {
	if _, err := gitCommit("."); err != nil {
		t.Skipf("not in a git work tree: %v", err)
	}
	m, err := findModule(".")
	if err != nil || m != "github.com/tether-edge/tether" {
		t.Errorf("module %q, %v; want github.com/tether-edge/tether", m, err)
	}
}

func copyDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/doc.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := os.WriteFile(doc, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return doc
}
