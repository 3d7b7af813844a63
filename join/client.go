package join

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Request asks the hub for a node certificate.
type Request struct {
	// Node is the node's name.
	Node string `json:"node"`
	// CSR is a PEM certificate request whose subject is
	// CN=system:node:<Node>, O=system:nodes.
	CSR []byte `json:"csr"`
	// Certificate is, for re-attestation only, the node's previous
	// certificate in PEM form; it may have expired.
	Certificate []byte `json:"certificate,omitempty"`
}

// Response carries a signed node certificate.
type Response struct {
	// Certificate is the node certificate in PEM form.
	Certificate []byte `json:"certificate"`
	// CA is the hub's CA certificate in PEM form.
	CA []byte `json:"ca"`
}

// NewKey generates a node key (ECDSA P-256).
func NewKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate node key: %w", err)
	}
	return key, nil
}

// MarshalKey returns key in PEM form.
func MarshalKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal node key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// ParseKey parses a PEM EC private key.
func ParseKey(data []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("parse node key: no PEM block")
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse node key: %w", err)
	}
	return key, nil
}

// NewCSR returns a PEM certificate request for node signed by key.
func NewCSR(key crypto.Signer, node string) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: NodeUserPrefix + node, Organization: []string{NodesGroup}},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("create certificate request: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// ParseCertificate parses the first certificate of a PEM bundle.
func ParseCertificate(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("parse certificate: no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	return cert, nil
}

// PinnedTLSConfig returns a client TLS configuration that accepts a server
// only when its chain contains a CA whose public key hashes to caHash and
// the leaf verifies against that CA for the server's name. The hub sends
// its CA along with its serving certificate for this.
func PinnedTLSConfig(serverName, caHash string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		// Verification happens in VerifyConnection against the pinned CA;
		// the system roots know nothing of the hub's CA.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPinned(cs, serverName, caHash)
		},
	}
}

func verifyPinned(cs tls.ConnectionState, serverName, caHash string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("hub presented no certificate")
	}
	var ca *x509.Certificate
	for _, c := range cs.PeerCertificates[1:] {
		if c.IsCA && CAHash(c) == caHash {
			ca = c
			break
		}
	}
	if ca == nil {
		return fmt.Errorf("hub's CA does not match the pin %s in the join token: refusing this hub", caHash)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots:     roots,
		DNSName:   serverName,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("verify hub certificate against the pinned CA: %w", err)
	}
	return nil
}

// Join presents the bootstrap token to the hub at hubURL (https://host:port)
// and returns the signed certificate. The hub is accepted only if its CA
// matches tok.CAHash.
func Join(ctx context.Context, hubURL string, tok Token, req Request) (*Response, error) {
	u, err := url.Parse(hubURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("join: hub address %q must be https://HOST:PORT", hubURL)
	}
	client := &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: PinnedTLSConfig(u.Hostname(), tok.CAHash), ForceAttemptHTTP2: false},
	}
	defer client.CloseIdleConnections()
	resp, err := post(ctx, client, hubURL+JoinPath, tok.Bearer(), req)
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	return resp, nil
}

// Reattest asks the hub at hubURL for a new certificate for a node whose
// certificate expired, proving possession of the node key through the CSR.
// caPEM is the hub CA the node saved when it joined.
func Reattest(ctx context.Context, hubURL string, caPEM []byte, req Request) (*Response, error) {
	u, err := url.Parse(hubURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("re-attest: hub address %q must be https://HOST:PORT", hubURL)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("re-attest: no CA certificate in the saved CA file")
	}
	client := &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: u.Hostname()}},
	}
	defer client.CloseIdleConnections()
	resp, err := post(ctx, client, hubURL+ReattestPath, "", req)
	if err != nil {
		return nil, fmt.Errorf("re-attest: %w", err)
	}
	return resp, nil
}

// Renew asks for a fresh certificate with client, which must authenticate
// as the node (over the tunnel, baseURL is then e.g. "http://hub").
func Renew(ctx context.Context, client *http.Client, baseURL string, req Request) (*Response, error) {
	resp, err := post(ctx, client, baseURL+RenewPath, "", req)
	if err != nil {
		return nil, fmt.Errorf("renew certificate: %w", err)
	}
	return resp, nil
}

// HTTPError is a refusal by the hub.
type HTTPError struct {
	Code    int
	Message string
}

func (e *HTTPError) Error() string { return fmt.Sprintf("hub answered %d: %s", e.Code, e.Message) }

func post(ctx context.Context, client *http.Client, target, bearer string, req Request) (*Response, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if bearer != "" {
		hreq.Header.Set("Authorization", "Bearer "+bearer)
	}
	hresp, err := client.Do(hreq)
	if err != nil {
		return nil, err
	}
	defer hresp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(hresp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if hresp.StatusCode != http.StatusOK && hresp.StatusCode != http.StatusCreated {
		var status struct {
			Message string `json:"message"`
		}
		msg := string(data)
		if json.Unmarshal(data, &status) == nil && status.Message != "" {
			msg = status.Message
		}
		return nil, &HTTPError{Code: hresp.StatusCode, Message: msg}
	}
	var resp Response
	if err := json.Unmarshal(data, &resp); err != nil {
		return nil, fmt.Errorf("decode answer: %w", err)
	}
	if len(resp.Certificate) == 0 {
		return nil, errors.New("hub answered without a certificate")
	}
	return &resp, nil
}
