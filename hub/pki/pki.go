// Package pki is the hub's certificate authority: it creates and keeps the
// cluster CA, the API server's serving certificate, client certificates and
// kubeconfig files that embed them. Keys is the secret part hubs of one
// cluster share, which a shared store keeps sealed with a secret key.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Config says where the authority keeps its files and what the serving
// certificate must cover.
type Config struct {
	// Dir is the data directory; files go to Dir/pki. Required.
	Dir string
	// Hosts are extra DNS names or IP addresses for the serving certificate.
	Hosts []string
	// ServiceIP is the cluster IP of the "kubernetes" Service; nil means
	// 10.0.0.1.
	ServiceIP net.IP
	// ClusterDomain is the cluster DNS domain; "" means "cluster.local".
	ClusterDomain string
	// CAValidity is the CA's lifetime; zero means ten years.
	CAValidity time.Duration
	// ServingValidity is the serving certificate's lifetime; zero means one
	// year. It is re-issued when less than a third of it remains.
	ServingValidity time.Duration
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
	// Keys, when set, are the cluster's keys, shared by its hubs: they
	// are written to Dir/pki (replacing what differs) and used instead of
	// creating any there.
	Keys *Keys
}

// Authority holds the CA and the serving certificate.
type Authority struct {
	cfg     Config
	caCert  *x509.Certificate
	caKey   crypto.Signer
	caPEM   []byte
	mu      sync.RWMutex
	serving tls.Certificate
	saKey   *ecdsa.PrivateKey
	// signerMu serialises loading and renewing the release signer.
	signerMu sync.Mutex
}

const (
	defaultCAValidity      = 10 * 365 * 24 * time.Hour
	defaultServingValidity = 365 * 24 * time.Hour
	// AdminUser and AdminGroup name the identity of the admin kubeconfig.
	AdminUser  = "tether-admin"
	AdminGroup = "system:masters"
)

// LoadOrCreate loads the authority from cfg.Dir/pki, creating the CA and
// serving certificate on first use and re-issuing the serving certificate
// when its names changed or it is close to expiry.
func LoadOrCreate(cfg Config) (*Authority, error) {
	if cfg.Dir == "" {
		return nil, errors.New("create pki: no directory")
	}
	if cfg.ServiceIP == nil {
		cfg.ServiceIP = net.IPv4(10, 0, 0, 1)
	}
	if cfg.ClusterDomain == "" {
		cfg.ClusterDomain = "cluster.local"
	}
	if cfg.CAValidity == 0 {
		cfg.CAValidity = defaultCAValidity
	}
	if cfg.ServingValidity == 0 {
		cfg.ServingValidity = defaultServingValidity
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	dir := filepath.Join(cfg.Dir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki directory: %w", err)
	}
	if cfg.Keys != nil {
		if err := cfg.Keys.write(dir); err != nil {
			return nil, err
		}
	}
	a := &Authority{cfg: cfg}
	if err := a.loadOrCreateCA(dir); err != nil {
		return nil, err
	}
	if err := a.loadOrCreateServing(dir); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *Authority) path(name string) string { return filepath.Join(a.cfg.Dir, "pki", name) }

func (a *Authority) loadOrCreateCA(dir string) error {
	cert, key, certPEM, err := a.loadOrCreateCAPair("ca", "tether-ca")
	if err != nil {
		return err
	}
	a.caCert, a.caKey, a.caPEM = cert, key, certPEM
	return nil
}

// loadOrCreateCAPair reads the CA NAME.crt and NAME.key, or, when neither
// exists, creates a self-signed CA named commonName and writes both. It
// returns the certificate, its key and the certificate's PEM.
func (a *Authority) loadOrCreateCAPair(name, commonName string) (*x509.Certificate, crypto.Signer, []byte, error) {
	certPEM, errC := os.ReadFile(a.path(name + ".crt"))
	keyPEM, errK := os.ReadFile(a.path(name + ".key"))
	if errC == nil && errK == nil {
		cert, key, err := parsePair(certPEM, keyPEM)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("load %s: %w", name, err)
		}
		return cert, key, certPEM, nil
	}
	if !errors.Is(errC, os.ErrNotExist) && errC != nil {
		return nil, nil, nil, fmt.Errorf("read %s.crt: %w", name, errC)
	}
	if !errors.Is(errK, os.ErrNotExist) && errK != nil {
		return nil, nil, nil, fmt.Errorf("read %s.key: %w", name, errK)
	}
	if errC == nil || errK == nil {
		return nil, nil, nil, fmt.Errorf("load %s: only one of %s.crt and %s.key exists", name, name, name)
	}
	certPEM, keyPEM, err := newCA(commonName, a.cfg.Now(), a.cfg.CAValidity)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, key, err := parsePair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load %s: %w", name, err)
	}
	if err := writeAtomic(a.path(name+".key"), keyPEM, 0o600); err != nil {
		return nil, nil, nil, err
	}
	if err := writeAtomic(a.path(name+".crt"), certPEM, 0o644); err != nil {
		return nil, nil, nil, err
	}
	return cert, key, certPEM, nil
}

// wantedNames returns the DNS names and IPs the serving certificate must hold.
func (a *Authority) wantedNames() ([]string, []net.IP) {
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc." + a.cfg.ClusterDomain}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, a.cfg.ServiceIP}
	if h, err := os.Hostname(); err == nil && h != "" {
		dns = append(dns, strings.ToLower(h))
	}
	for _, h := range a.cfg.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else if h != "" {
			dns = append(dns, strings.ToLower(h))
		}
	}
	sort.Strings(dns)
	dns = slices.Compact(dns)
	var uniq []net.IP
	for _, ip := range ips {
		if !slices.ContainsFunc(uniq, ip.Equal) {
			uniq = append(uniq, ip)
		}
	}
	return dns, uniq
}

func sameNames(cert *x509.Certificate, dns []string, ips []net.IP) bool {
	have := slices.Clone(cert.DNSNames)
	sort.Strings(have)
	if !slices.Equal(have, dns) || len(cert.IPAddresses) != len(ips) {
		return false
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

func (a *Authority) loadOrCreateServing(dir string) error {
	dns, ips := a.wantedNames()
	certPEM, errC := os.ReadFile(a.path("serving.crt"))
	keyPEM, errK := os.ReadFile(a.path("serving.key"))
	if errC == nil && errK == nil {
		cert, _, err := parsePair(certPEM, keyPEM)
		if err == nil && a.fresh(cert) && sameNames(cert, dns, ips) && cert.CheckSignatureFrom(a.caCert) == nil {
			pair, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				return fmt.Errorf("load serving certificate: %w", err)
			}
			a.serving = pair
			return nil
		}
	}
	certPEM, keyPEM, err := a.issue(pkix.Name{CommonName: "tether-hub"}, dns, ips,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, a.cfg.ServingValidity, nil)
	if err != nil {
		return fmt.Errorf("issue serving certificate: %w", err)
	}
	if err := writeAtomic(a.path("serving.key"), keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeAtomic(a.path("serving.crt"), certPEM, 0o644); err != nil {
		return err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("load serving certificate: %w", err)
	}
	a.serving = pair
	return nil
}

// fresh reports whether more than a third of cert's lifetime remains.
func (a *Authority) fresh(cert *x509.Certificate) bool {
	life := cert.NotAfter.Sub(cert.NotBefore)
	return cert.NotAfter.Sub(a.cfg.Now()) > life/3
}

// issue signs a new certificate for a fresh key (or for pub when given).
func (a *Authority) issue(subj pkix.Name, dns []string, ips []net.IP, usage []x509.ExtKeyUsage, ttl time.Duration, pub crypto.PublicKey) (certPEM, keyPEM []byte, err error) {
	if pub == nil {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, fmt.Errorf("generate key: %w", err)
		}
		keyPEM, err = encodeKey(key)
		if err != nil {
			return nil, nil, err
		}
		pub = key.Public()
	}
	now := a.cfg.Now()
	notAfter := now.Add(ttl)
	if notAfter.After(a.caCert.NotAfter) {
		notAfter = a.caCert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               subj,
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           usage,
		BasicConstraintsValid: true,
		DNSNames:              dns,
		IPAddresses:           ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.caCert, pub, a.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// ServerTLSConfig returns the TLS configuration for the API server: TLS 1.2
// or later, HTTP/2 and HTTP/1.1, client certificates verified against the CA
// when presented.
func (a *Authority) ServerTLSConfig() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(a.caCert)
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		ClientAuth: tls.VerifyClientCertIfGiven,
		ClientCAs:  pool,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			a.mu.RLock()
			defer a.mu.RUnlock()
			c := a.serving
			// The CA travels with the serving certificate so that a
			// joining node, which has only the CA's hash from its join
			// token, can check the hub in the handshake.
			c.Certificate = append(c.Certificate[:1:1], a.caCert.Raw)
			return &c, nil
		},
	}
}

// CAPool returns a pool holding the CA certificate.
func (a *Authority) CAPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(a.caCert)
	return pool
}

// IssueClientCert returns a client certificate and its key for user with
// groups (CN and O of the subject), valid for ttl.
func (a *Authority) IssueClientCert(user string, groups []string, ttl time.Duration) (certPEM, keyPEM []byte, err error) {
	if user == "" {
		return nil, nil, errors.New("issue client certificate: empty user")
	}
	certPEM, keyPEM, err = a.issue(pkix.Name{CommonName: user, Organization: groups}, nil, nil,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, ttl, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("issue client certificate: %w", err)
	}
	return certPEM, keyPEM, nil
}

// Sign signs a PEM or DER certificate request for client authentication,
// keeping its subject, valid for ttl.
func (a *Authority) Sign(csr []byte, ttl time.Duration) ([]byte, error) {
	if b, _ := pem.Decode(csr); b != nil {
		csr = b.Bytes
	}
	req, err := x509.ParseCertificateRequest(csr)
	if err != nil {
		return nil, fmt.Errorf("parse certificate request: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("check certificate request: %w", err)
	}
	if req.Subject.CommonName == "" {
		return nil, errors.New("sign certificate request: empty common name")
	}
	subj := pkix.Name{CommonName: req.Subject.CommonName, Organization: req.Subject.Organization}
	certPEM, _, err := a.issue(subj, req.DNSNames, req.IPAddresses,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, ttl, req.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("sign certificate request: %w", err)
	}
	return certPEM, nil
}

// CA returns the CA certificate.
func (a *Authority) CA() *x509.Certificate { return a.caCert }

// CAPEM returns the CA certificate in PEM form.
func (a *Authority) CAPEM() []byte { return bytes.Clone(a.caPEM) }

// CAHash returns "sha256:<hex>" of the CA's SubjectPublicKeyInfo, the form
// kubeadm uses to pin a cluster CA during join.
func (a *Authority) CAHash() string {
	sum := sha256.Sum256(a.caCert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// WriteKubeconfig writes, with mode 0600 and atomically, a kubeconfig for
// user and groups pointing at serverURL, embedding the CA and a client
// certificate valid for one year.
func (a *Authority) WriteKubeconfig(path, serverURL, user string, groups []string) error {
	certPEM, keyPEM, err := a.IssueClientCert(user, groups, defaultServingValidity)
	if err != nil {
		return err
	}
	const name = "tether"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: serverURL, CertificateAuthorityData: a.CAPEM()}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: user, Namespace: "default"}
	cfg.CurrentContext = name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encode kubeconfig: %w", err)
	}
	return writeAtomic(path, data, 0o600)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	ok = true
	return nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func parsePair(certPEM, keyPEM []byte) (*x509.Certificate, crypto.Signer, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("parse key pair: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("parse certificate: %w", err)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, nil, errors.New("parse key pair: key cannot sign")
	}
	return cert, signer, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("read random serial: %v", err))
	}
	return n.Add(n, big.NewInt(1))
}

// ServiceAccountKey returns the key that signs service account tokens,
// creating pki/sa.key on first use. It is separate from the CA key so that
// it can be rotated without re-issuing every certificate.
func (a *Authority) ServiceAccountKey() (*ecdsa.PrivateKey, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.saKey != nil {
		return a.saKey, nil
	}
	path := a.path("sa.key")
	if data, err := os.ReadFile(path); err == nil {
		key, err := parseECKey(data)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", path, err)
		}
		a.saKey = key
		return key, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate service account key: %w", err)
	}
	data, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	if err := writeAtomic(path, data, 0o600); err != nil {
		return nil, err
	}
	a.saKey = key
	return key, nil
}
