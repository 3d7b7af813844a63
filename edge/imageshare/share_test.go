package imageshare

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestRank(t *testing.T) {
	members := []string{"n1", "n2", "n3", "n4", "n5"}
	owners := map[string]int{}
	for i := range 1000 {
		d := digest.FromString(fmt.Sprint(i)).String()
		r := Rank(d, members)
		if len(r) != len(members) {
			t.Fatalf("Rank returned %v", r)
		}
		// The order does not depend on the order members come in, and
		// a member leaving moves only the blobs it owned.
		if r2 := Rank(d, []string{"n5", "n3", "n1", "n4", "n2"}); strings.Join(r, ",") != strings.Join(r2, ",") {
			t.Fatalf("order depends on input order: %v, %v", r, r2)
		}
		if r[0] != "n3" {
			if r3 := Rank(d, []string{"n1", "n2", "n4", "n5"}); r3[0] != r[0] {
				t.Fatalf("removing n3 moved a blob n3 did not own from %s to %s", r[0], r3[0])
			}
		}
		owners[r[0]]++
	}
	for _, m := range members {
		if owners[m] < 120 || owners[m] > 280 {
			t.Errorf("%s owns %d of 1000 blobs; want about 200", m, owners[m])
		}
	}
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T) *testCA {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	p := x509.NewCertPool()
	p.AddCert(cert)
	return &testCA{cert, key, p}
}

// identity issues a client certificate of subject cn in orgs, as the hub
// issues node certificates.
type identity struct {
	cert  *tls.Certificate
	roots *x509.CertPool
}

func (i identity) Current() *tls.Certificate { return i.cert }
func (i identity) Roots() *x509.CertPool     { return i.roots }

func (ca *testCA) identity(t *testing.T, cn string, orgs ...string) identity {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return identity{&tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, ca.pool}
}

// countingRegistry serves blobs from memory and counts the bytes it gave.
type countingRegistry struct {
	blobs map[digest.Digest][]byte
	bytes atomic.Int64
	delay time.Duration
}

func (r *countingRegistry) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	b, ok := r.blobs[desc.Digest]
	if !ok {
		return nil, fmt.Errorf("%s: not found", desc.Digest)
	}
	time.Sleep(r.delay)
	r.bytes.Add(int64(len(b)))
	return io.NopCloser(bytes.NewReader(b)), nil
}

type member struct {
	name  string
	dir   string
	store content.Store
	share *Sharer
	srv   *httptest.Server
}

// site starts members sharing through TLS servers on loopback.
func site(t *testing.T, ca *testCA, reg *countingRegistry, names ...string) []*member {
	var ms []*member
	var peers []Peer
	var mu sync.Mutex
	for _, n := range names {
		dir := t.TempDir()
		store, err := local.NewStore(dir)
		if err != nil {
			t.Fatal(err)
		}
		m := &member{name: n, dir: dir, store: store}
		id := ca.identity(t, nodeUserPrefix+n, nodesGroup)
		m.share = New(Config{Node: n, Identity: id,
			Backend: Backend{Store: store, Registry: func(context.Context, string) (remotes.Fetcher, error) { return reg, nil }},
			Members: func() []Peer { mu.Lock(); defer mu.Unlock(); return append([]Peer(nil), peers...) }})
		m.srv = httptest.NewUnstartedServer(m.share.Handler())
		m.srv.TLS = ServerTLS(id)
		// httptest puts a certificate of its own first unless given one.
		m.srv.TLS.Certificates = []tls.Certificate{*id.cert}
		m.srv.StartTLS()
		t.Cleanup(m.srv.Close)
		ms = append(ms, m)
	}
	mu.Lock()
	for _, m := range ms {
		peers = append(peers, Peer{Node: m.name, Addr: strings.TrimPrefix(m.srv.URL, "https://")})
	}
	mu.Unlock()
	return ms
}

func (m *member) pull(ctx context.Context, reg remotes.Fetcher, desc ocispec.Descriptor) error {
	rc, err := m.share.Fetcher(reg, "registry.test/app:v1", 0).Fetch(ctx, desc)
	if err != nil {
		return err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	if digest.FromBytes(b) != desc.Digest {
		return fmt.Errorf("%s read wrong bytes", m.name)
	}
	return nil
}

func TestShareOneDownloadAndCorruption(t *testing.T) {
	ctx := context.Background()
	ca := newCA(t)
	blob := make([]byte, 1<<20)
	_, _ = rand.Read(blob)
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromBytes(blob), Size: int64(len(blob))}
	reg := &countingRegistry{blobs: map[digest.Digest][]byte{desc.Digest: blob}, delay: 200 * time.Millisecond}
	ms := site(t, ca, reg, "n1", "n2", "n3")

	// All three at once: the owner downloads, the others wait for it.
	var wg sync.WaitGroup
	errs := make([]error, len(ms))
	for i, m := range ms {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = m.pull(ctx, reg, desc) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", ms[i].name, err)
		}
	}
	if got := reg.bytes.Load(); got != desc.Size {
		t.Fatalf("the registry served %d bytes, want %d (one download)", got, desc.Size)
	}
	byName := map[string]*member{}
	for _, m := range ms {
		byName[m.name] = m
	}
	order := Rank(desc.Digest.String(), []string{"n1", "n2", "n3"})
	owner, other, victim := byName[order[0]], byName[order[1]], byName[order[2]]
	if s := owner.share.Stats(); s.FromRegistry != 1 || s.Served < 2 {
		t.Errorf("owner %s: %+v; want 1 blob from the registry, 2 served", owner.name, s)
	}

	// The owner's copy rots on disk; one member loses its copy and
	// fetches again: the owner's bytes are refused, the other member's
	// taken, and the registry is not asked.
	path := filepath.Join(owner.dir, "blobs", "sha256", desc.Digest.Encoded())
	rotten := bytes.Clone(blob)
	for i := 0; i < len(rotten); i += 4096 {
		rotten[i] ^= 0xff
	}
	if err := os.WriteFile(path, rotten, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := victim.store.Delete(ctx, desc.Digest); err != nil {
		t.Fatal(err)
	}
	if err := victim.pull(ctx, reg, desc); err != nil {
		t.Fatalf("fetch after the owner's copy rotted: %v", err)
	}
	s := victim.share.Stats()
	if s.Rejected != 1 {
		t.Errorf("%s rejected %d blobs, want 1", victim.name, s.Rejected)
	}
	if got := reg.bytes.Load(); got != desc.Size {
		t.Errorf("the registry served %d bytes, want still %d", got, desc.Size)
	}
	if st := other.share.Stats(); st.Served < 1 {
		t.Errorf("%s served nothing: %+v", other.name, st)
	}

	// Only the cluster's nodes are served.
	for _, c := range []struct {
		name string
		id   identity
	}{
		{"another CA's node", newCA(t).identity(t, nodeUserPrefix+"x", nodesGroup)},
		{"a user of this CA", ca.identity(t, "alice", "system:masters")},
	} {
		cfg := ClientTLS(c.id, other.name)
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := client.Get(other.srv.URL + BlobPath(desc.Digest))
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s was served: %s", c.name, resp.Status)
		}
	}
	// A client reaching a server that is not the node it meant is refused.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: ClientTLS(ca.identity(t, nodeUserPrefix+"n9", nodesGroup), "someone-else")}}
	if resp, err := client.Get(other.srv.URL + BlobPath(desc.Digest)); err == nil {
		resp.Body.Close()
		t.Error("the client accepted a server of another name")
	}
	// Ranges are served.
	client = &http.Client{Transport: &http.Transport{TLSClientConfig: ClientTLS(ca.identity(t, nodeUserPrefix+"n9", nodesGroup), other.name)}}
	req, _ := http.NewRequest(http.MethodGet, other.srv.URL+BlobPath(desc.Digest), nil)
	req.Header.Set("Range", "bytes=10-19")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(b, blob[10:20]) {
		t.Errorf("range: %s, %d bytes", resp.Status, len(b))
	}
}

// TestOwnerDownFallsBackToRegistry: a member whose owner does not answer
// takes the blob from the registry.
func TestOwnerDownFallsBackToRegistry(t *testing.T) {
	ctx := context.Background()
	ca := newCA(t)
	blob := make([]byte, 64<<10)
	_, _ = rand.Read(blob)
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromBytes(blob), Size: int64(len(blob))}
	reg := &countingRegistry{blobs: map[digest.Digest][]byte{desc.Digest: blob}}
	ms := site(t, ca, reg, "n1", "n2")
	order := Rank(desc.Digest.String(), []string{"n1", "n2"})
	var owner, other *member
	for _, m := range ms {
		if m.name == order[0] {
			owner = m
		} else {
			other = m
		}
	}
	owner.srv.Close()
	if err := other.pull(ctx, reg, desc); err != nil {
		t.Fatal(err)
	}
	if s := other.share.Stats(); s.FromRegistry != 1 || s.FromPeers != 0 {
		t.Errorf("stats %+v: want the blob from the registry", s)
	}
	// Manifests always come from the registry.
	if Shareable(ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: desc.Digest}) {
		t.Error("a manifest is shareable")
	}
}
