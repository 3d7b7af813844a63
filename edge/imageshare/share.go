package imageshare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Peer is a member of the site.
type Peer struct {
	// Node is the member's node name.
	Node string
	// Addr is its share server's host:port; empty for this node.
	Addr string
}

// Backend is what the container runtime lends: its content store, leases
// that keep what is written, and the registry.
type Backend struct {
	// Store is the content store blobs are served from and written to.
	Store content.Store
	// Lease returns ctx under a new lease that keeps what is written
	// under it for a while, and the function that ends it early.
	Lease func(ctx context.Context) (context.Context, func(context.Context) error, error)
	// Registry returns a fetcher of the repository of ref, as pulls
	// reach it (without pods' pull secrets).
	Registry func(ctx context.Context, ref string) (remotes.Fetcher, error)
}

// Config configures a Sharer.
type Config struct {
	// Node is this node's name.
	Node string
	// Backend is the runtime's content.
	Backend Backend
	// Members returns the site's members gossip sees alive, this node
	// among them.
	Members func() []Peer
	// Identity is the node's certificate and the cluster's CA.
	Identity Identity
	// Log receives what goes wrong; nil: slog.Default().
	Log *slog.Logger
	// PeerTimeout bounds connecting to a member; default 3s.
	PeerTimeout time.Duration
}

// Stats count what a Sharer moved.
type Stats struct {
	// FromPeers and BytesFromPeers: blobs (and bytes) ingested from
	// members; FromRegistry and BytesFromRegistry: from the registry.
	FromPeers, BytesFromPeers       int64
	FromRegistry, BytesFromRegistry int64
	// Rejected counts ingests from members whose bytes did not match
	// the digest (or size), discarded.
	Rejected int64
	// Served and BytesServed: blobs (and bytes) served to members.
	Served, BytesServed int64
}

// Sharer fetches blobs from the site's members before the registry and
// serves its own to them.
type Sharer struct {
	cfg Config
	log *slog.Logger

	fromPeers, bytesFromPeers     atomic.Int64
	regBlobs, bytesFromRegistry   atomic.Int64
	rejected, served, bytesServed atomic.Int64
	seq                           atomic.Int64

	mu      sync.Mutex
	clients map[string]*http.Client // by node
	flights map[digest.Digest]*flight
}

// flight is one registry download of a blob that others wait for.
type flight struct {
	done chan struct{}
	err  error
}

// New returns a Sharer; it serves once its Handler is served.
func New(cfg Config) *Sharer {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.PeerTimeout <= 0 {
		cfg.PeerTimeout = 3 * time.Second
	}
	return &Sharer{cfg: cfg, log: cfg.Log.With("component", "imageshare"), clients: map[string]*http.Client{}, flights: map[digest.Digest]*flight{}}
}

// Stats returns the counts so far.
func (s *Sharer) Stats() Stats {
	return Stats{
		FromPeers: s.fromPeers.Load(), BytesFromPeers: s.bytesFromPeers.Load(),
		FromRegistry: s.regBlobs.Load(), BytesFromRegistry: s.bytesFromRegistry.Load(),
		Rejected: s.rejected.Load(), Served: s.served.Load(), BytesServed: s.bytesServed.Load(),
	}
}

// Shareable reports whether members share desc: every blob but manifests
// and indexes.
func Shareable(desc ocispec.Descriptor) bool {
	return desc.Digest.Algorithm() == digest.SHA256 && !images.IsManifestType(desc.MediaType) && !images.IsIndexType(desc.MediaType)
}

// Fetcher returns a fetcher of ref's blobs that takes them from the
// site's members first, then from registry; limit caps this node's
// download in bytes per second (0: no cap).
func (s *Sharer) Fetcher(registry remotes.Fetcher, ref string, limit int64) remotes.Fetcher {
	return &fetcher{s: s, registry: registry, ref: ref, limit: limit}
}

type fetcher struct {
	s        *Sharer
	registry remotes.Fetcher
	ref      string
	limit    int64
}

func (f *fetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if !Shareable(desc) {
		rc, err := f.registry.Fetch(ctx, desc)
		if err != nil {
			return nil, err
		}
		return limitReader(ctx, rc, f.limit), nil
	}
	if err := f.s.ensure(ctx, desc, f.ref, f.registry, f.limit); err != nil {
		return nil, err
	}
	return f.s.open(ctx, desc)
}

// open reads a blob of the local store.
func (s *Sharer) open(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	ra, err := s.cfg.Backend.Store.ReaderAt(ctx, desc)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(ra, 0, ra.Size()), ra}, nil
}

// has reports whether the local store holds the blob.
func (s *Sharer) has(ctx context.Context, d digest.Digest) bool {
	_, err := s.cfg.Backend.Store.Info(ctx, d)
	return err == nil
}

// ensure puts the blob desc into the local store: from its owner, from the
// other members, from the registry, in that order.
func (s *Sharer) ensure(ctx context.Context, desc ocispec.Descriptor, ref string, registry remotes.Fetcher, limit int64) error {
	if s.has(ctx, desc.Digest) {
		return nil
	}
	members := s.cfg.Members()
	addrs := map[string]string{}
	var names []string
	for _, m := range members {
		names = append(names, m.Node)
		addrs[m.Node] = m.Addr
	}
	order := Rank(desc.Digest.String(), names)
	for i, node := range order {
		if node == s.cfg.Node {
			if i == 0 {
				break // the owner fetches from the registry itself
			}
			continue
		}
		addr := addrs[node]
		if addr == "" {
			continue
		}
		err := s.fromPeer(ctx, node, addr, desc, ref, i == 0, limit)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Info("blob not from member", "node", node, "digest", desc.Digest, "err", err)
	}
	return s.fromRegistry(ctx, desc, registry, limit)
}

// errRejected wraps what a member sent that did not check.
var errRejected = errors.New("content does not match the digest")

// fromPeer ingests the blob from node; with through, node pulls it through
// from the registry if it does not hold it.
func (s *Sharer) fromPeer(ctx context.Context, node, addr string, desc ocispec.Descriptor, ref string, through bool, limit int64) error {
	url := "https://" + addr + BlobPath(desc.Digest)
	if through {
		url += "?through=1&ref=" + queryEscape(ref) + "&size=" + strconv.FormatInt(desc.Size, 10) +
			"&mediaType=" + queryEscape(desc.MediaType) + "&limit=" + strconv.FormatInt(limit, 10)
	}
	src := func(ctx context.Context) (io.ReadCloser, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		resp, err := s.client(node).Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("%s: %s", node, resp.Status)
		}
		return resp.Body, nil
	}
	n, err := s.ingest(ctx, desc, src, limit)
	if err != nil {
		if errors.Is(err, errRejected) {
			s.rejected.Add(1)
			s.log.Warn("discarded a member's blob that does not match its digest", "node", node, "digest", desc.Digest)
		}
		return err
	}
	s.fromPeers.Add(1)
	s.bytesFromPeers.Add(n)
	return nil
}

// fromRegistry ingests the blob from the registry, once however many ask
// at a time (this node's pulls and members' pull-throughs alike). The
// download outlives the asker that started it, so that another asker's
// cancellation does not end it for all.
func (s *Sharer) fromRegistry(ctx context.Context, desc ocispec.Descriptor, registry remotes.Fetcher, limit int64) error {
	s.mu.Lock()
	if f, ok := s.flights[desc.Digest]; ok {
		s.mu.Unlock()
		select {
		case <-f.done:
			if f.err == nil || s.has(ctx, desc.Digest) {
				return nil
			}
			return f.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	s.flights[desc.Digest] = f
	s.mu.Unlock()
	go func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Hour)
		defer cancel()
		n, err := s.ingest(dctx, desc, func(ctx context.Context) (io.ReadCloser, error) { return registry.Fetch(ctx, desc) }, limit)
		if err == nil {
			s.regBlobs.Add(1)
			s.bytesFromRegistry.Add(n)
		}
		s.mu.Lock()
		f.err = err
		delete(s.flights, desc.Digest)
		s.mu.Unlock()
		close(f.done)
	}()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ingest writes the blob desc from src into the local store, checked
// against desc's digest and size at commit; what does not check is
// discarded. It returns the bytes read.
func (s *Sharer) ingest(ctx context.Context, desc ocispec.Descriptor, src func(context.Context) (io.ReadCloser, error), limit int64) (int64, error) {
	store := s.cfg.Backend.Store
	ref := fmt.Sprintf("imageshare-%s-%d-%d", desc.Digest.Encoded(), time.Now().UnixNano(), s.seq.Add(1))
	w, err := content.OpenWriter(ctx, store, content.WithRef(ref), content.WithDescriptor(desc))
	if errdefs.IsAlreadyExists(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("open content writer: %w", err)
	}
	fail := func(err error) (int64, error) {
		w.Close()
		_ = store.Abort(context.WithoutCancel(ctx), ref)
		return 0, err
	}
	rc, err := src(ctx)
	if err != nil {
		return fail(err)
	}
	defer rc.Close()
	cr := &countingReader{r: limitReader(ctx, rc, limit)}
	if err := content.Copy(ctx, w, cr, desc.Size, desc.Digest); err != nil {
		if ctx.Err() == nil && cr.n > 0 && (errdefs.IsFailedPrecondition(err) || errdefs.IsInvalidArgument(err) || isDigestMismatch(err)) {
			err = fmt.Errorf("%w: %v", errRejected, err)
		}
		return fail(err)
	}
	w.Close()
	return cr.n, nil
}

// isDigestMismatch reports whether a commit failed on the content's size
// or digest. containerd says so in words only.
func isDigestMismatch(err error) bool {
	msg := err.Error()
	return containsAny(msg, "unexpected commit digest", "unexpected commit size", "unexpected size", "digest mismatch")
}

func containsAny(s string, subs ...string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// client returns the HTTP client that reaches node's share server.
func (s *Sharer) client(node string) *http.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[node]; ok {
		return c
	}
	tr := &http.Transport{
		TLSClientConfig:     ClientTLS(s.cfg.Identity, node),
		TLSHandshakeTimeout: s.cfg.PeerTimeout,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     time.Minute,
		ForceAttemptHTTP2:   true,
	}
	tr.DialContext = (&netDialer{timeout: s.cfg.PeerTimeout}).DialContext
	c := &http.Client{Transport: tr}
	s.clients[node] = c
	return c
}
