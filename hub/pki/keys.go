package pki

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Keys is the secret material every hub of a cluster shares, PEM-encoded:
// the cluster CA, the front-proxy CA and the ServiceAccount token signing
// key. Each hub issues its own serving and client certificates from them.
type Keys struct {
	CACert            []byte `json:"caCert"`
	CAKey             []byte `json:"caKey"`
	FrontProxyCACert  []byte `json:"frontProxyCACert"`
	FrontProxyCAKey   []byte `json:"frontProxyCAKey"`
	ServiceAccountKey []byte `json:"serviceAccountKey"`
}

// keyFiles names the file under Dir/pki of each of Keys' fields.
func (k *Keys) files() []struct {
	name string
	data *[]byte
	mode os.FileMode
} {
	return []struct {
		name string
		data *[]byte
		mode os.FileMode
	}{
		{"ca.crt", &k.CACert, 0o644},
		{"ca.key", &k.CAKey, 0o600},
		{"front-proxy-ca.crt", &k.FrontProxyCACert, 0o644},
		{"front-proxy-ca.key", &k.FrontProxyCAKey, 0o600},
		{"sa.key", &k.ServiceAccountKey, 0o600},
	}
}

// MinSecretKeyLength is the shortest key-encryption secret Seal and
// OpenKeys accept, in bytes.
const MinSecretKeyLength = 32

// ErrWrongSecretKey is returned by OpenKeys when the keys do not decrypt
// with the secret given.
var ErrWrongSecretKey = errors.New("the cluster's keys do not decrypt with this secret key")

// ReadKeys reads the cluster's keys from dataDir/pki, as a hub on SQLite
// keeps them. It returns nil when there is no CA there. A front-proxy CA
// or ServiceAccount key that is missing is generated (in memory only), as
// a hub would on its next start.
func ReadKeys(dataDir string) (*Keys, error) {
	k := &Keys{}
	dir := filepath.Join(dataDir, "pki")
	missing := 0
	for _, f := range k.files() {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if errors.Is(err, os.ErrNotExist) {
			missing++
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read the cluster's keys: %w", err)
		}
		*f.data = b
	}
	if k.CACert == nil && k.CAKey == nil {
		if missing != len(k.files()) {
			return nil, fmt.Errorf("read the cluster's keys: %s holds some of the cluster's keys but no CA", dir)
		}
		return nil, nil
	}
	if k.CACert == nil || k.CAKey == nil {
		return nil, fmt.Errorf("read the cluster's keys: only one of ca.crt and ca.key exists in %s", dir)
	}
	if err := k.complete(time.Now()); err != nil {
		return nil, err
	}
	return k, k.check()
}

// GenerateKeys makes a new cluster's keys.
func GenerateKeys(now time.Time) (*Keys, error) {
	k := &Keys{}
	var err error
	if k.CACert, k.CAKey, err = newCA("tether-ca", now, defaultCAValidity); err != nil {
		return nil, err
	}
	return k, k.complete(now)
}

// complete generates the front-proxy CA and the ServiceAccount key when
// they are missing.
func (k *Keys) complete(now time.Time) error {
	var err error
	if k.FrontProxyCACert == nil && k.FrontProxyCAKey == nil {
		if k.FrontProxyCACert, k.FrontProxyCAKey, err = newCA("front-proxy-ca", now, defaultCAValidity); err != nil {
			return err
		}
	}
	if k.ServiceAccountKey == nil {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("generate service account key: %w", err)
		}
		if k.ServiceAccountKey, err = encodeKey(key); err != nil {
			return err
		}
	}
	return nil
}

// check parses every key and certificate.
func (k *Keys) check() error {
	if _, _, err := parsePair(k.CACert, k.CAKey); err != nil {
		return fmt.Errorf("check the cluster CA: %w", err)
	}
	if _, _, err := parsePair(k.FrontProxyCACert, k.FrontProxyCAKey); err != nil {
		return fmt.Errorf("check the front-proxy CA: %w", err)
	}
	if _, err := parseECKey(k.ServiceAccountKey); err != nil {
		return fmt.Errorf("check the service account key: %w", err)
	}
	return nil
}

// CAHash returns "sha256:<hex>" of the cluster CA's public key, as
// Authority.CAHash does: the id of the cluster.
func (k *Keys) CAHash() (string, error) {
	blk, _ := pem.Decode(k.CACert)
	if blk == nil {
		return "", errors.New("read the cluster CA: no PEM block")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", fmt.Errorf("parse the cluster CA: %w", err)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// Equal reports whether k and o hold the same keys and certificates.
func (k *Keys) Equal(o *Keys) bool {
	a, b := k.files(), o.files()
	for i := range a {
		if !bytes.Equal(*a[i].data, *b[i].data) {
			return false
		}
	}
	return true
}

// write writes the keys to dir, each file only when its content differs.
func (k *Keys) write(dir string) error {
	for _, f := range k.files() {
		path := filepath.Join(dir, f.name)
		if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, *f.data) {
			continue
		}
		if err := writeAtomic(path, *f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// sealed is the stored form of Keys: AES-256-GCM under a key derived
// with HKDF-SHA256 from the secret and a random salt.
type sealed struct {
	Version    int    `json:"version"`
	Salt       []byte `json:"salt"`
	Nonce      []byte `json:"nonce"`
	Ciphertext []byte `json:"ciphertext"`
}

const (
	sealVersion = 1
	sealInfo    = "tether cluster keys v1"
)

func aead(secret, salt []byte) (cipher.AEAD, error) {
	if len(secret) < MinSecretKeyLength {
		return nil, fmt.Errorf("secret key too short: %d bytes, at least %d needed", len(secret), MinSecretKeyLength)
	}
	key, err := hkdf.Key(sha256.New, secret, salt, sealInfo, 32)
	if err != nil {
		return nil, fmt.Errorf("derive key: %w", err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Seal encrypts the keys with secret, binding them to context (the
// cluster's id), which OpenKeys must be given again.
func (k *Keys) Seal(secret []byte, context string) ([]byte, error) {
	plain, err := json.Marshal(k)
	if err != nil {
		return nil, fmt.Errorf("encode the cluster's keys: %w", err)
	}
	s := sealed{Version: sealVersion, Salt: make([]byte, 32)}
	if _, err := rand.Read(s.Salt); err != nil {
		return nil, err
	}
	gcm, err := aead(secret, s.Salt)
	if err != nil {
		return nil, fmt.Errorf("seal the cluster's keys: %w", err)
	}
	s.Nonce = make([]byte, gcm.NonceSize())
	if _, err := rand.Read(s.Nonce); err != nil {
		return nil, err
	}
	s.Ciphertext = gcm.Seal(nil, s.Nonce, plain, []byte(context))
	return json.Marshal(s)
}

// OpenKeys decrypts keys Seal made with secret and context. A wrong
// secret, or keys sealed for another context, give ErrWrongSecretKey.
func OpenKeys(data, secret []byte, context string) (*Keys, error) {
	var s sealed
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("decode the sealed cluster keys: %w", err)
	}
	if s.Version != sealVersion {
		return nil, fmt.Errorf("open the cluster's keys: sealed with version %d, this tether knows %d; run a newer tether", s.Version, sealVersion)
	}
	gcm, err := aead(secret, s.Salt)
	if err != nil {
		return nil, fmt.Errorf("open the cluster's keys: %w", err)
	}
	if len(s.Nonce) != gcm.NonceSize() {
		return nil, errors.New("open the cluster's keys: bad nonce")
	}
	plain, err := gcm.Open(nil, s.Nonce, s.Ciphertext, []byte(context))
	if err != nil {
		return nil, ErrWrongSecretKey
	}
	k := &Keys{}
	if err := json.Unmarshal(plain, k); err != nil {
		return nil, fmt.Errorf("decode the cluster's keys: %w", err)
	}
	if err := k.check(); err != nil {
		return nil, fmt.Errorf("open the cluster's keys: %w", err)
	}
	return k, nil
}

// newCA makes a self-signed CA named commonName and returns its
// certificate and key, PEM-encoded.
func newCA(commonName string, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate %s key: %w", commonName, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("create %s certificate: %w", commonName, err)
	}
	if keyPEM, err = encodeKey(key); err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

func parseECKey(data []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	return x509.ParseECPrivateKey(block.Bytes)
}
