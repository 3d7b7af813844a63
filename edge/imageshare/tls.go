package imageshare

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Identity is the node's certificate and the cluster's CA
// (edge/identity.Identity).
type Identity interface {
	Current() *tls.Certificate
	Roots() *x509.CertPool
}

// Names a node certificate carries.
const (
	nodeUserPrefix = "system:node:"
	nodesGroup     = "system:nodes"
)

// verifyNode checks that certs, a peer's chain, is a node certificate the
// cluster's CA issued, and returns the node's name.
func verifyNode(certs []*x509.Certificate, roots *x509.CertPool) (string, error) {
	if len(certs) == 0 {
		return "", errors.New("no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	leaf := certs[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return "", fmt.Errorf("verify certificate: %w", err)
	}
	node, ok := strings.CutPrefix(leaf.Subject.CommonName, nodeUserPrefix)
	if !ok || node == "" || !slices.Contains(leaf.Subject.Organization, nodesGroup) {
		return "", fmt.Errorf("certificate of %q is not a node's", leaf.Subject.CommonName)
	}
	return node, nil
}

// ServerTLS is the share server's configuration: it presents the node's
// certificate and accepts only clients presenting a node certificate of
// the cluster.
func ServerTLS(id Identity) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAnyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return id.Current(), nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := verifyNode(cs.PeerCertificates, id.Roots())
			return err
		},
	}
}

// ClientTLS is the configuration for reaching the share server of node:
// it presents the node's certificate and accepts only node's. Node
// certificates are client certificates without addresses, so the chain
// and the name are checked here rather than by the host name.
func ClientTLS(id Identity, node string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // VerifyConnection checks chain and name
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return id.Current(), nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			got, err := verifyNode(cs.PeerCertificates, id.Roots())
			if err != nil {
				return err
			}
			if got != node {
				return fmt.Errorf("reached node %q, want %q", got, node)
			}
			return nil
		},
	}
}

// peerNode is the node name of a verified client, "" if none.
func peerNode(cs *tls.ConnectionState) string {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return ""
	}
	node, _ := strings.CutPrefix(cs.PeerCertificates[0].Subject.CommonName, nodeUserPrefix)
	return node
}
