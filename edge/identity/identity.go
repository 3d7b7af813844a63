// Package identity is an edge node's identity: its private key, the
// certificate the hub signed for it and the hub's CA, kept as files in the
// agent's data directory.
//
// Vocabulary:
//   - identity: the key, the current certificate and the CA of one node;
//     an [Identity] value holds them and presents the current certificate
//     at every TLS handshake.
//   - join: the first exchange with the hub, authorised by a join token,
//     that makes the key and obtains the first certificate ([Establish]).
//   - renewal: a fresh certificate asked for over the tunnel before the
//     current one expires ([Identity.Renew]).
//   - re-attestation: a fresh certificate asked for directly of the hub,
//     proving the node with its expired certificate ([Identity.Reattest]).
//
// The wire format of these exchanges is package join's; this package keeps
// the files and decides what to retry.
package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tether-edge/tether/join"
)

// Files of the node's identity in the data directory.
const (
	keyFile  = "node.key"
	certFile = "node.crt"
	caFile   = "ca.crt"
)

// Identity is the node's key, its current certificate and the hub's CA.
// Current may be called from any goroutine; Renew and Reattest, which
// replace the certificate, from one at a time.
type Identity struct {
	dir   string
	node  string
	key   *ecdsa.PrivateKey
	ca    []byte         // PEM
	roots *x509.CertPool // from ca
	cert  atomic.Pointer[tls.Certificate]
}

// Node returns the name of the node the certificate is for.
func (id *Identity) Node() string { return id.node }

// Roots returns the hub's CA the node pinned when it joined.
func (id *Identity) Roots() *x509.CertPool { return id.roots }

// Current returns the certificate in use; its Leaf is set.
func (id *Identity) Current() *tls.Certificate { return id.cert.Load() }

// loadIdentity reads the identity saved in dir; it returns nil without an
// error when the node has not joined yet.
func loadIdentity(dir string) (*Identity, error) {
	keyPEM, err := os.ReadFile(filepath.Join(dir, keyFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read node key: %w", err)
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, certFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // joined halfway: the key was made, the hub never answered
	}
	if err != nil {
		return nil, fmt.Errorf("read node certificate: %w", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, caFile))
	if err != nil {
		return nil, fmt.Errorf("read hub CA: %w", err)
	}
	key, err := join.ParseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	id := &Identity{dir: dir, key: key}
	if err := id.setCA(caPEM); err != nil {
		return nil, err
	}
	if err := id.setCert(certPEM); err != nil {
		return nil, err
	}
	return id, nil
}

func (id *Identity) setCA(caPEM []byte) error {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return errors.New("parse hub CA: no certificate")
	}
	id.ca, id.roots = caPEM, roots
	return nil
}

func (id *Identity) setCert(certPEM []byte) error {
	leaf, err := join.ParseCertificate(certPEM)
	if err != nil {
		return fmt.Errorf("node certificate: %w", err)
	}
	node, ok := join.NodeName(leaf.Subject.CommonName)
	if !ok {
		return fmt.Errorf("node certificate names %q, not a node", leaf.Subject.CommonName)
	}
	if id.node != "" && node != id.node {
		return fmt.Errorf("the hub signed a certificate for node %q, not %q", node, id.node)
	}
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(id.key.Public()) {
		return errors.New("node certificate does not match the node key")
	}
	id.node = node
	var chain [][]byte
	for rest := certPEM; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			chain = append(chain, b.Bytes)
		}
	}
	id.cert.Store(&tls.Certificate{Certificate: chain, PrivateKey: id.key, Leaf: leaf})
	return nil
}

// save writes a new certificate (and CA) and starts using them.
func (id *Identity) save(certPEM, caPEM []byte) error {
	if len(caPEM) > 0 {
		if err := id.setCA(caPEM); err != nil {
			return err
		}
		if err := writeFileAtomic(filepath.Join(id.dir, caFile), caPEM, 0o644); err != nil {
			return err
		}
	}
	if err := id.setCert(certPEM); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(id.dir, certFile), certPEM, 0o644)
}

func (id *Identity) certPEM() []byte {
	c := id.Current()
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
}

func (id *Identity) request() (join.Request, error) {
	csr, err := join.NewCSR(id.key, id.node)
	if err != nil {
		return join.Request{}, err
	}
	return join.Request{Node: id.node, CSR: csr}, nil
}

// TLSConfig is the tunnel's: it trusts only the hub's CA and presents the
// current certificate at every handshake.
func (id *Identity) TLSConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: serverName,
		RootCAs:    id.roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return id.Current(), nil
		},
	}
}

// Params say where the identity is kept and how to obtain one.
type Params struct {
	// DataDir keeps the node's key (node.key, mode 0600), certificate
	// (node.crt) and the hub's CA (ca.crt). Created if missing.
	DataDir string
	// NodeName is the node's name. Empty means the name in the saved
	// certificate, or else the host name (lower-cased); a saved
	// certificate of another node is an error.
	NodeName string
	// HubURL is the hub's API address, https://HOST:PORT, where the node
	// joins and re-attests.
	HubURL string
	// Token is the join token (tether:<id>.<secret>:sha256:<hash>), used
	// only when DataDir holds no certificate yet.
	Token string
}

// Establish loads the node's identity or joins the hub for one.
// An expired certificate is re-attested. Errors the hub or the network may
// clear are retried until ctx ends; refusals are returned at once.
func Establish(ctx context.Context, cfg Params, log *slog.Logger) (*Identity, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	id, err := loadIdentity(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if id != nil {
		if cfg.NodeName != "" && cfg.NodeName != id.node {
			return nil, fmt.Errorf("data directory %s holds the identity of node %q, not %q", cfg.DataDir, id.node, cfg.NodeName)
		}
		if time.Now().After(id.Current().Leaf.NotAfter) {
			log.Info("node certificate expired while the agent was stopped: re-attesting", "expired", id.Current().Leaf.NotAfter)
			if err := retryHub(ctx, log, "re-attest", func() error { return id.Reattest(ctx, cfg.HubURL) }); err != nil {
				return nil, err
			}
		}
		return id, nil
	}
	return joinHub(ctx, cfg, log)
}

func joinHub(ctx context.Context, cfg Params, log *slog.Logger) (*Identity, error) {
	if cfg.Token == "" {
		return nil, fmt.Errorf("node has not joined yet (no certificate in %s): a join token is needed (create one with `tether token create` on the hub)", cfg.DataDir)
	}
	tok, err := join.ParseToken(cfg.Token)
	if err != nil {
		return nil, err
	}
	name := cfg.NodeName
	if name == "" {
		if name, err = hostName(); err != nil {
			return nil, err
		}
	}
	id := &Identity{dir: cfg.DataDir, node: name}
	keyPath := filepath.Join(cfg.DataDir, keyFile)
	if keyPEM, err := os.ReadFile(keyPath); err == nil {
		// A previous attempt made the key; keep it.
		if id.key, err = join.ParseKey(keyPEM); err != nil {
			return nil, err
		}
	} else {
		if id.key, err = join.NewKey(); err != nil {
			return nil, err
		}
		keyPEM, err := join.MarshalKey(id.key)
		if err != nil {
			return nil, err
		}
		if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
			return nil, err
		}
	}
	req, err := id.request()
	if err != nil {
		return nil, err
	}
	err = retryHub(ctx, log, "join", func() error {
		resp, err := join.Join(ctx, cfg.HubURL, tok, req)
		if err != nil {
			return err
		}
		return id.save(resp.Certificate, resp.CA)
	})
	if err != nil {
		return nil, explainJoin(err, cfg.HubURL)
	}
	log.Info("joined the hub", "node", id.node, "expires", id.Current().Leaf.NotAfter)
	return id, nil
}

// explainJoin turns the hub's refusals into what the operator must do.
func explainJoin(err error, hubURL string) error {
	var he *join.HTTPError
	if errors.As(err, &he) && (he.Code == http.StatusUnauthorized || he.Code == http.StatusForbidden) {
		return fmt.Errorf("join hub %s: the hub refused the join token (%d: %s); it may have expired: create a new one with `tether token create`", hubURL, he.Code, he.Message)
	}
	return fmt.Errorf("join hub %s: %w", hubURL, err)
}

// Reattest asks the hub, directly at hubURL, for a fresh certificate,
// proving the node with its current (possibly expired) one, and starts
// using it.
func (id *Identity) Reattest(ctx context.Context, hubURL string) error {
	req, err := id.request()
	if err != nil {
		return err
	}
	req.Certificate = id.certPEM()
	resp, err := join.Reattest(ctx, hubURL, id.ca, req)
	if err != nil {
		return err
	}
	return id.save(resp.Certificate, resp.CA)
}

// Renew asks the hub for a fresh certificate through client (the tunnel)
// and starts using it.
func (id *Identity) Renew(ctx context.Context, client *http.Client) error {
	req, err := id.request()
	if err != nil {
		return err
	}
	resp, err := join.Renew(ctx, client, "http://hub", req)
	if err != nil {
		return err
	}
	return id.save(resp.Certificate, resp.CA)
}

// retryHub runs f until it succeeds, ctx ends, or it fails in a way that
// retrying cannot fix (a refusal by the hub, a CA that does not match).
func retryHub(ctx context.Context, log *slog.Logger, what string, f func() error) error {
	wait := time.Second
	for {
		err := f()
		if err == nil {
			return nil
		}
		if !transient(err) {
			return err
		}
		log.Warn("hub not reachable, retrying", "step", what, "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// transient reports errors worth retrying: the hub could not be reached,
// or answered that it is overloaded or unwell.
func transient(err error) bool {
	var he *join.HTTPError
	if errors.As(err, &he) {
		return he.Code == http.StatusTooManyRequests || he.Code >= 500
	}
	var ne net.Error
	if errors.As(err, &ne) {
		var opErr *net.OpError
		return ne.Timeout() || errors.As(err, &opErr)
	}
	return false
}

// hostName returns the host's name as a node name.
func hostName() (string, error) {
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("read host name: %w", err)
	}
	return strings.ToLower(h), nil
}

// writeFileAtomic replaces path with data, so that a crash leaves either
// the old or the new file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
