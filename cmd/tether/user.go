//go:build !edge

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func newUserCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "user",
		Short: "Manage users' client certificates",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newUserCreateCmd())
	return cmd
}

func newUserCreateCmd() *cobra.Command {
	var (
		groups     []string
		expiration time.Duration
		out        string
		kubeconfig string
		dataDir    string
		timeout    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "create NAME --group G [--group G2] [--expiration 8760h] [--kubeconfig-out FILE]",
		Short: "Issue a client certificate for a user and write a kubeconfig for it",
		Long: `Create a user the documented Kubernetes way, in one step: generate a key,
submit a CertificateSigningRequest (signer kubernetes.io/kube-apiserver-client,
subject CN=NAME, O=each group) as the administrator of the given kubeconfig,
approve it, wait for the hub to issue the certificate, and write a kubeconfig
for the user with the hub's address and CA taken from the administrator's.

The certificate grants nothing by itself: what the user may do is what RBAC
bindings give NAME and its groups. The hub never signs for system:masters.
Without --kubeconfig-out the kubeconfig is written to standard output.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if expiration != 0 && expiration < 10*time.Minute {
				return errors.New("--expiration must be at least 10m")
			}
			restCfg, caPEM, _, err := loadKubeconfig(kubeconfig, dataDir)
			if err != nil {
				return err
			}
			client, err := kubernetes.NewForConfig(restCfg)
			if err != nil {
				return fmt.Errorf("create client: %w", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			keyPEM, certPEM, err := issueUserCertificate(ctx, client, name, groups, expiration)
			if err != nil {
				return err
			}
			cfg := clientcmdapi.NewConfig()
			const cluster = "tether"
			cfg.Clusters[cluster] = &clientcmdapi.Cluster{Server: restCfg.Host, CertificateAuthorityData: caPEM}
			cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
			cfg.Contexts[name+"@"+cluster] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: name, Namespace: metav1.NamespaceDefault}
			cfg.CurrentContext = name + "@" + cluster
			data, err := clientcmd.Write(*cfg)
			if err != nil {
				return fmt.Errorf("encode kubeconfig: %w", err)
			}
			if out == "" || out == "-" {
				_, err = cmd.OutOrStdout().Write(data)
				return err
			}
			if err := os.WriteFile(out, data, 0o600); err != nil {
				return fmt.Errorf("write kubeconfig: %w", err)
			}
			block, _ := pem.Decode(certPEM)
			if cert, err := x509.ParseCertificate(block.Bytes); err == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "user %q (groups %s) written to %s, valid until %s\n",
					name, strings.Join(groups, ","), out, cert.NotAfter.UTC().Format(time.RFC3339))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&groups, "group", nil, "a group of the user (repeat for several)")
	f.DurationVar(&expiration, "expiration", 365*24*time.Hour, "requested lifetime of the certificate (the hub's --cluster-signing-duration caps it)")
	f.StringVar(&out, "kubeconfig-out", "", "file to write the user's kubeconfig to, mode 0600 (default: standard output)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of a hub administrator (default: --data-dir's admin.kubeconfig, $KUBECONFIG, ~/.kube/config)")
	f.StringVar(&dataDir, "data-dir", "", "the hub's data directory, to use its admin.kubeconfig")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the certificate")
	return cmd
}

// issueUserCertificate generates a key, submits a request for a client
// certificate for name and groups, approves it and waits for the
// certificate. It returns the key and the certificate in PEM form.
func issueUserCertificate(ctx context.Context, client kubernetes.Interface, name string, groups []string, expiration time.Duration) (keyPEM, certPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: name, Organization: groups},
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create certificate request: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode key: %w", err)
	}
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "user-" + nameSegment(name) + "-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: certificatesv1.KubeAPIServerClientSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}
	if expiration > 0 {
		secs := int32(min(expiration/time.Second, 1<<31-1))
		csr.Spec.ExpirationSeconds = &secs
	}
	csrs := client.CertificatesV1().CertificateSigningRequests()
	csr, err = csrs.Create(ctx, csr, metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("submit certificate signing request: %w", err)
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type:           certificatesv1.CertificateApproved,
		Status:         corev1.ConditionTrue,
		Reason:         "TetherUserCreate",
		Message:        "This CSR was approved by tether user create.",
		LastUpdateTime: metav1.Now(),
	})
	if _, err := csrs.UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		return nil, nil, fmt.Errorf("approve certificate signing request %s: %w", csr.Name, err)
	}
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		cur, err := csrs.Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range cur.Status.Conditions {
			if c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
				return false, fmt.Errorf("certificate signing request %s %s: %s", csr.Name, strings.ToLower(string(c.Type)), c.Message)
			}
		}
		certPEM = cur.Status.Certificate
		return len(certPEM) > 0, nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("wait for the certificate: %w", err)
	}
	return keyPEM, certPEM, nil
}

// nameSegment makes a user name fit in an object name: lower case letters,
// digits, dots and dashes.
func nameSegment(name string) string {
	b := []byte(strings.ToLower(name))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			b[i] = '-'
		}
	}
	s := strings.Trim(string(b), "-.")
	if len(s) > 40 {
		s = s[:40]
	}
	if s == "" {
		s = "x"
	}
	return s
}
