package hubtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// UserKubeconfig writes a kubeconfig for user in groups, with a client
// certificate signed by the hub's CA (CN user, O groups) as an operator
// would issue one, and returns its path.
func (h *Hub) UserKubeconfig(user string, groups ...string) string {
	h.t.Helper()
	ca, err := tls.LoadX509KeyPair(filepath.Join(h.DataDir, "pki", "ca.crt"), filepath.Join(h.DataDir, "pki", "ca.key"))
	if err != nil {
		h.t.Fatalf("load the hub's CA: %v", err)
	}
	caCert, err := x509.ParseCertificate(ca.Certificate[0])
	if err != nil {
		h.t.Fatalf("parse the hub's CA: %v", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		h.t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		h.t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: user, Organization: groups},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, ca.PrivateKey)
	if err != nil {
		h.t.Fatalf("sign a client certificate: %v", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		h.t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(h.Kubeconfig)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		a.ClientCertificate, a.ClientKey = "", ""
		a.ClientCertificateData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		a.ClientKeyData = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	}
	path := filepath.Join(h.t.TempDir(), "user-"+strconv.Itoa(int(serial.Int64()&0xffffff))+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		h.t.Fatal(err)
	}
	return path
}
