package upgrade

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// releaseServer serves executables and deltas as the hub does, and cuts
// the first answer of each file after cutAt bytes when cutAt > 0.
type releaseServer struct {
	files  map[string][]byte // digest → bytes
	deltas map[string][]byte // "new from old" → delta
	cutAt  int

	mu     sync.Mutex
	cut    map[string]bool
	ranges []string
}

func (s *releaseServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	digest := strings.TrimPrefix(r.URL.Path, "/fleet/releases/")
	body, ok := s.files[digest]
	key := digest
	if from := r.URL.Query().Get("from"); from != "" {
		key = digest + " from " + from
		body, ok = s.deltas[key]
	}
	if !ok {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	s.ranges = append(s.ranges, r.Header.Get("Range"))
	cut := s.cutAt > 0 && !s.cut[key]
	if cut {
		s.cut[key] = true
	}
	s.mu.Unlock()
	sum := sha256.Sum256(body)
	w.Header().Set("ETag", `"sha256:`+hex.EncodeToString(sum[:])+`"`)
	if cut {
		// Promise everything, send a part, drop the connection.
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		w.Write(body[:s.cutAt])
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
		return
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func newDownload(t *testing.T, srv *httptest.Server, exe []byte) *Download {
	return &Download{Client: srv.Client(), Base: srv.URL, Dir: filepath.Join(t.TempDir(), "download"),
		Release: fleetapi.ReleaseSpec{Digest: digest(exe), Size: int64(len(exe))}, Retry: 10 * time.Millisecond}
}

func TestDownloadResumesAfterACut(t *testing.T) {
	exe := randomBytes(1 << 20)
	rs := &releaseServer{files: map[string][]byte{digest(exe): exe}, cutAt: 300 << 10, cut: map[string]bool{}}
	srv := httptest.NewServer(rs)
	defer srv.Close()
	d := newDownload(t, srv, exe)
	f, err := d.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(f.Path)
	if !bytes.Equal(got, exe) {
		t.Fatal("downloaded executable differs")
	}
	if f.ResumedAt != 300<<10 || f.Transferred != int64(len(exe)) {
		t.Errorf("resumed at %d, transferred %d of %d: want a resume at %d and every byte once", f.ResumedAt, f.Transferred, len(exe), 300<<10)
	}
	if rs.ranges[1] != "bytes=307200-" {
		t.Errorf("second request's range %q", rs.ranges[1])
	}
	// A finished download is not fetched again.
	rs.ranges = nil
	if _, err := d.Run(context.Background()); err != nil || len(rs.ranges) != 0 {
		t.Errorf("second run: %v, %d requests", err, len(rs.ranges))
	}
}

func TestDownloadDelta(t *testing.T) {
	old := randomBytes(2 << 20)
	cur := bytes.Clone(old)
	copy(cur[4096:], "a change")
	var delta bytes.Buffer
	if err := fleetapi.EncodeDelta(&delta, old, bytes.NewReader(cur)); err != nil {
		t.Fatal(err)
	}
	rs := &releaseServer{files: map[string][]byte{digest(cur): cur},
		deltas: map[string][]byte{digest(cur) + " from " + digest(old): delta.Bytes()}, cut: map[string]bool{}}
	srv := httptest.NewServer(rs)
	defer srv.Close()
	from := filepath.Join(t.TempDir(), "tether")
	if err := os.WriteFile(from, old, 0o755); err != nil {
		t.Fatal(err)
	}
	d := newDownload(t, srv, cur)
	d.From, d.FromDigest = from, digest(old)
	f, err := d.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.Path); !bytes.Equal(got, cur) {
		t.Fatal("executable from the delta differs")
	}
	if !f.Delta || f.Transferred != int64(delta.Len()) {
		t.Errorf("delta %v, transferred %d, delta size %d", f.Delta, f.Transferred, delta.Len())
	}
	t.Logf("delta of %d bytes for an executable of %d", delta.Len(), len(cur))

	// No delta from another base: the whole executable comes.
	other := randomBytes(1 << 10)
	os.WriteFile(from, other, 0o755)
	d = newDownload(t, srv, cur)
	d.From, d.FromDigest = from, digest(other)
	if f, err = d.Run(context.Background()); err != nil || f.Delta || f.Transferred != int64(len(cur)) {
		t.Errorf("without a delta: %+v %v", f, err)
	}
}

func TestDownloadRefetchesABadFile(t *testing.T) {
	exe := randomBytes(64 << 10)
	bad := bytes.Clone(exe)
	bad[10]++
	var mu sync.Mutex
	served := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		served++
		body := exe
		if served == 1 {
			body = bad // corrupted on the way the first time
		}
		mu.Unlock()
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
	}))
	defer srv.Close()
	d := newDownload(t, srv, exe)
	f, err := d.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.Path); !bytes.Equal(got, exe) || served != 2 {
		t.Errorf("served %d times; file right: %v", served, bytes.Equal(got, exe))
	}
}

func TestDownloadLimit(t *testing.T) {
	exe := randomBytes(256 << 10)
	rs := &releaseServer{files: map[string][]byte{digest(exe): exe}, cut: map[string]bool{}}
	srv := httptest.NewServer(rs)
	defer srv.Close()
	d := newDownload(t, srv, exe)
	d.Limit = 512 << 10 // half a second for the file, after a 64 KiB burst
	start := time.Now()
	if _, err := d.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 350*time.Millisecond {
		t.Errorf("256 KiB at 512 KiB/s took %v", took)
	}
}

func TestDownloadMissingIsPermanent(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	d := newDownload(t, srv, []byte("x"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := d.Run(ctx); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("a release the hub lacks: %v", err)
	}
}

func TestDownloadFallsBackWhenTheDeltaFails(t *testing.T) {
	exe := randomBytes(128 << 10)
	var mu sync.Mutex
	deltaAsks := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("from") != "" {
			mu.Lock()
			deltaAsks++
			mu.Unlock()
			http.Error(w, "could not compute the delta", http.StatusInternalServerError)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(exe))
	}))
	defer srv.Close()
	from := filepath.Join(t.TempDir(), "tether")
	old := randomBytes(1 << 10)
	os.WriteFile(from, old, 0o755)
	d := newDownload(t, srv, exe)
	d.From, d.FromDigest = from, digest(old)
	f, err := d.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.Path); !bytes.Equal(got, exe) || f.Delta || deltaAsks != 3 {
		t.Errorf("delta asked %d times; fetched %+v", deltaAsks, f)
	}
}
