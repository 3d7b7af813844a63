package imageshare

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// BlobPath is where a share server serves the blob of d.
func BlobPath(d digest.Digest) string { return "/blobs/" + d.String() }

func queryEscape(s string) string { return url.QueryEscape(s) }

type netDialer struct{ timeout time.Duration }

func (d *netDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return (&net.Dialer{Timeout: d.timeout, KeepAlive: 30 * time.Second}).DialContext(ctx, network, addr)
}

// Handler serves the local store's blobs to members: GET and HEAD of
// BlobPath, with Range. Asked with through=1 (and ref, size, mediaType)
// for a blob it lacks, by a member of its site, it pulls the blob
// through from the registry first. Nothing else is served.
func (s *Sharer) Handler() http.Handler {
	return http.HandlerFunc(s.serveBlob)
}

func (s *Sharer) serveBlob(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "read-only", http.StatusMethodNotAllowed)
		return
	}
	raw, ok := strings.CutPrefix(r.URL.Path, "/blobs/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	d, err := digest.Parse(raw)
	if err != nil || d.Algorithm() != digest.SHA256 {
		http.Error(w, "bad digest", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	store := s.cfg.Backend.Store
	info, err := store.Info(ctx, d)
	if err != nil {
		q := r.URL.Query()
		if q.Get("through") != "1" || !s.member(peerNode(r.TLS)) {
			http.NotFound(w, r)
			return
		}
		size, err1 := strconv.ParseInt(q.Get("size"), 10, 64)
		limit, _ := strconv.ParseInt(q.Get("limit"), 10, 64)
		ref := q.Get("ref")
		if _, err2 := reference.ParseDockerRef(ref); err1 != nil || err2 != nil || size <= 0 {
			http.Error(w, "through needs ref and size", http.StatusBadRequest)
			return
		}
		desc := ocispec.Descriptor{Digest: d, Size: size, MediaType: q.Get("mediaType")}
		if err := s.pullThrough(ctx, desc, ref, limit); err != nil {
			s.log.Warn("pull through for a member", "node", peerNode(r.TLS), "digest", d, "err", err)
			http.Error(w, "pull through: "+err.Error(), http.StatusBadGateway)
			return
		}
		if info, err = store.Info(ctx, d); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
	}
	ra, err := store.ReaderAt(ctx, ocispec.Descriptor{Digest: d, Size: info.Size})
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer ra.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", d.String())
	w.Header().Set("ETag", `"`+d.String()+`"`)
	cw := &countingWriter{ResponseWriter: w}
	http.ServeContent(cw, r, "", time.Time{}, io.NewSectionReader(ra, 0, ra.Size()))
	if r.Method == http.MethodGet {
		s.served.Add(1)
		s.bytesServed.Add(cw.n)
	}
}

// member reports whether node is a member of this node's site.
func (s *Sharer) member(node string) bool {
	if node == "" {
		return false
	}
	for _, m := range s.cfg.Members() {
		if m.Node == node {
			return true
		}
	}
	return false
}

// pullThrough fetches the blob from the registry of ref into the local
// store, under a lease that keeps it while the members fetch it.
func (s *Sharer) pullThrough(ctx context.Context, desc ocispec.Descriptor, ref string, limit int64) error {
	b := s.cfg.Backend
	if b.Registry == nil {
		return errNoRegistry
	}
	if b.Lease != nil {
		lctx, _, err := b.Lease(ctx)
		if err != nil {
			return err
		}
		ctx = lctx
	}
	reg, err := b.Registry(ctx, ref)
	if err != nil {
		return err
	}
	return s.fromRegistry(ctx, desc, reg, limit)
}

type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}
