package bundle

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// imageArchive writes a small OCI-layout-shaped tar.
func imageArchive(t *testing.T, dir, name, content string) string {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for n, c := range map[string]string{"index.json": `{"schemaVersion":2,"manifests":[]}`, "blobs/sha256/x": content} {
		tw.WriteHeader(&tar.Header{Name: n, Size: int64(len(c)), Mode: 0o644})
		tw.Write([]byte(c))
	}
	tw.Close()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func create(t *testing.T, dir string, images ...string) string {
	t.Helper()
	p := filepath.Join(dir, "site.bundle")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := Create(f, images, nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBundleRoundTrip(t *testing.T) {
	dir := t.TempDir()
	a := imageArchive(t, dir, "app.tar", strings.Repeat("a", 5000))
	b := imageArchive(t, dir, "db.tar", "database layer")
	p := create(t, dir, a, b)
	if !Is(p) || Is(a) {
		t.Fatalf("Is: bundle %v, image archive %v", Is(p), Is(a))
	}
	m, err := Read(p)
	if err != nil || len(m.Images) != 2 || m.Images[0].File != "images/app.tar" {
		t.Fatalf("Read: %+v %v", m, err)
	}
	out := t.TempDir()
	_, files, err := Extract(p, out, func(e Entry) bool { return e.File == "images/db.tar" })
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 {
		t.Fatalf("extracted %v", files)
	}
	got, _ := os.ReadFile(files["images/db.tar"])
	want, _ := os.ReadFile(b)
	if !bytes.Equal(got, want) {
		t.Error("extracted archive differs")
	}
}

func TestBundleDamageRefused(t *testing.T) {
	dir := t.TempDir()
	a := imageArchive(t, dir, "app.tar", strings.Repeat("a", 5000))
	p := create(t, dir, a)
	raw, _ := os.ReadFile(p)
	i := bytes.Index(raw, []byte(strings.Repeat("a", 100)))
	for name, damaged := range map[string][]byte{
		"altered":   append(append(bytes.Clone(raw[:i]), 'b'), raw[i+1:]...),
		"truncated": raw[:i+1000],
	} {
		bad := filepath.Join(dir, name)
		os.WriteFile(bad, damaged, 0o644)
		out := t.TempDir()
		if _, _, err := Extract(bad, out, func(Entry) bool { return true }); err == nil {
			t.Errorf("%s bundle extracted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
		if left, _ := filepath.Glob(filepath.Join(out, "*", "*")); len(left) != 0 {
			t.Errorf("%s bundle left %v", name, left)
		}
	}
}

func TestBundleInputsChecked(t *testing.T) {
	dir := t.TempDir()
	notImage := filepath.Join(dir, "notes.txt")
	os.WriteFile(notImage, []byte("hello"), 0o644)
	var b bytes.Buffer
	if _, err := Create(&b, []string{notImage}, nil, time.Now()); err == nil || !strings.Contains(err.Error(), "not an image archive") {
		t.Errorf("a text file as an image: %v", err)
	}
	if _, err := Create(&b, nil, []string{os.Args[0]}, time.Now()); err == nil || !strings.Contains(err.Error(), "not tether") {
		t.Errorf("the test binary as a release: %v", err)
	}
	if _, err := Create(&b, nil, nil, time.Now()); err == nil {
		t.Error("an empty bundle was written")
	}
	a := imageArchive(t, dir, "app.tar", "x")
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	a2 := imageArchive(t, sub, "app.tar", "y")
	if _, err := Create(&b, []string{a, a2}, nil, time.Now()); err == nil {
		t.Error("two images of one name bundled")
	}
}
