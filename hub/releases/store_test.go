package releases

import (
	"bytes"
	"crypto"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/dynamic"

	"github.com/tether-edge/tether/internal/fleetapi"
)

func newTestStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := New(Config{Dir: dir, MaxImportBytes: 1 << 20,
		Signer: func() (crypto.Signer, []byte, error) { return nil, nil, errors.New("no signer in this test") },
		Client: func() (dynamic.Interface, error) { return nil, errors.New("no client in this test") }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// put keeps b as a blob and returns its digest.
func put(t *testing.T, s *Store, b []byte) string {
	t.Helper()
	st, err := s.blobs.stage(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.blobs.keep(st); err != nil {
		t.Fatal(err)
	}
	return "sha256:" + st.hex
}

// executableLike returns n bytes that compress like an executable: runs
// of repeated words with random bytes between.
func executableLike(r *rand.Rand, n int) []byte {
	words := []string{"runtime.", "github.com/tether-edge/tether/", "k8s.io/apimachinery/", "\x00\x00\x00\x00", "\x48\x89\xe5"}
	var b bytes.Buffer
	for b.Len() < n {
		b.WriteString(words[r.IntN(len(words))])
		b.WriteByte(byte(r.IntN(256)))
	}
	return b.Bytes()[:n]
}

func get(t *testing.T, s *Store, path string, header http.Header) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, req)
	return w
}

// TestDeltaComputedOnce: concurrent requests for one delta share one
// computation; the delta and its digest are kept and found by a store
// opened again, which also removes what an interrupted write left.
func TestDeltaComputedOnce(t *testing.T) {
	dir := t.TempDir()
	s := newTestStore(t, dir)
	r := rand.New(rand.NewPCG(1, 2))
	old := executableLike(r, 256<<10)
	cur := bytes.Clone(old)
	copy(cur[1000:], "a change in the middle")
	cur = append(cur, "and some more at the end"...)
	dOld, dCur := put(t, s, old), put(t, s, cur)
	path := fleetapi.DownloadPath(dCur) + "?from=" + dOld

	var wg sync.WaitGroup
	answers := make([]*httptest.ResponseRecorder, 4)
	for i := range answers {
		wg.Go(func() { answers[i] = get(t, s, path, nil) })
	}
	wg.Wait()
	for i, w := range answers {
		if w.Code != http.StatusOK || !bytes.Equal(w.Body.Bytes(), answers[0].Body.Bytes()) ||
			w.Header().Get(fleetapi.DeltaHeader) != answers[0].Header().Get(fleetapi.DeltaHeader) {
			t.Fatalf("answer %d: %d, %d bytes, digest %q", i, w.Code, w.Body.Len(), w.Header().Get(fleetapi.DeltaHeader))
		}
	}
	delta := answers[0].Body.Bytes()
	var rebuilt bytes.Buffer
	if err := fleetapi.DecodeDelta(&rebuilt, old, bytes.NewReader(delta), int64(len(cur))); err != nil || !bytes.Equal(rebuilt.Bytes(), cur) {
		t.Fatalf("the delta does not decode to the new blob: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "deltas"))
	if len(entries) != 2 {
		t.Errorf("deltas directory holds %d files, want the delta and its digest", len(entries))
	}

	// Leftovers of a crash go at the next open; the delta stays.
	leftover := filepath.Join(dir, "sha256", tmpPrefix+"import-1")
	if err := os.WriteFile(leftover, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := newTestStore(t, dir)
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Errorf("leftover of an interrupted import still there: %v", err)
	}
	// The digest lost (a crash between the renames) is found again.
	hexOld, _ := fleetapi.ParseDigest(dOld)
	hexCur, _ := fleetapi.ParseDigest(dCur)
	if err := os.Remove(s2.blobs.deltaPath(hexCur, hexOld) + ".sha256"); err != nil {
		t.Fatal(err)
	}
	w := get(t, s2, path, http.Header{"Range": {"bytes=5-"}})
	if w.Code != http.StatusPartialContent || !bytes.Equal(w.Body.Bytes(), delta[5:]) ||
		w.Header().Get(fleetapi.DeltaHeader) != answers[0].Header().Get(fleetapi.DeltaHeader) {
		t.Errorf("delta from a reopened store: %d, %d bytes, digest %q", w.Code, w.Body.Len(), w.Header().Get(fleetapi.DeltaHeader))
	}
}

// TestDownloadAnswers: what a download gets besides the happy paths.
func TestDownloadAnswers(t *testing.T) {
	s := newTestStore(t, t.TempDir())
	r := rand.New(rand.NewPCG(3, 4))
	noise1, noise2 := make([]byte, 64<<10), make([]byte, 64<<10)
	for i := range noise1 {
		noise1[i], noise2[i] = byte(r.Uint32()), byte(r.Uint32())
	}
	d1, d2 := put(t, s, noise1), put(t, s, noise2)
	for _, c := range []struct {
		path string
		code int
		says string
	}{
		{fleetapi.DownloadPath(d1), http.StatusOK, ""},
		{fleetapi.DownloadPath("sha256:" + strings.Repeat("a", 64)), http.StatusNotFound, "holds no release executable"},
		{fleetapi.DownloadPath("latest"), http.StatusNotFound, "holds no release executable"},
		{fleetapi.DownloadPath(d1) + "?from=" + d1, http.StatusNotFound, "no delta"},
		{fleetapi.DownloadPath(d1) + "?from=sha256:" + strings.Repeat("b", 64), http.StatusNotFound, "no delta"},
		// Noise does not compress: the delta is no smaller.
		{fleetapi.DownloadPath(d2) + "?from=" + d1, http.StatusNotFound, "no smaller than the executable"},
		{"/fleet/releases/a/b", http.StatusNotFound, "holds no release executable"},
	} {
		w := get(t, s, c.path, nil)
		if w.Code != c.code || !strings.Contains(w.Body.String(), c.says) {
			t.Errorf("GET %s: %d %s, want %d saying %q", c.path, w.Code, w.Body.String(), c.code, c.says)
		}
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodDelete, fleetapi.DownloadPath(d1), nil))
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE: %d", w.Code)
	}
	// Too large, announced or not: 413, and nothing is left behind.
	big := bytes.Repeat([]byte("x"), 1<<20+1)
	for _, announced := range []bool{true, false} {
		req := httptest.NewRequest(http.MethodPost, fleetapi.ImportPath, bytes.NewReader(big))
		if !announced {
			req.ContentLength = -1
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != http.StatusRequestEntityTooLarge {
			t.Errorf("import of %d bytes (length announced: %v): %d %s", len(big), announced, w.Code, w.Body.String())
		}
	}
	entries, _ := os.ReadDir(s.blobs.blobDir())
	if len(entries) != 2 {
		t.Errorf("blob directory holds %d files after refused imports, want 2", len(entries))
	}
}
