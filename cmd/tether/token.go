//go:build !edge

package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/join"
)

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Manage join tokens for edge nodes",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newTokenCreateCmd())
	return cmd
}

func newTokenCreateCmd() *cobra.Command {
	var (
		ttl         time.Duration
		kubeconfig  string
		dataDir     string
		description string
	)
	cmd := &cobra.Command{
		Use:   "create [--ttl 24h] [--kubeconfig F]",
		Short: "Create a join token and print it",
		Long: `Create a bootstrap token (a Secret in kube-system, as upstream stores
them) and print the join token for 'tether edge --token': the token and the
hash of the hub's CA, which the joining node pins.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ttl < 0 {
				return errors.New("--ttl must not be negative")
			}
			restCfg, caPEM, path, err := loadKubeconfig(kubeconfig, dataDir)
			if err != nil {
				return err
			}
			ca, err := join.ParseCertificate(caPEM)
			if err != nil {
				return fmt.Errorf("kubeconfig %s has no usable hub CA: %w", path, err)
			}
			client, err := corev1client.NewForConfig(restCfg)
			if err != nil {
				return err
			}
			tok := join.Token{ID: randomString(6), Secret: randomString(16), CAHash: join.CAHash(ca)}
			data := map[string][]byte{
				join.BootstrapTokenIDKey:        []byte(tok.ID),
				join.BootstrapTokenSecretKey:    []byte(tok.Secret),
				join.BootstrapTokenUsageAuthKey: []byte("true"),
			}
			if ttl > 0 {
				data[join.BootstrapTokenExpirationKey] = []byte(time.Now().Add(ttl).UTC().Format(time.RFC3339))
			}
			if description != "" {
				data[join.BootstrapTokenDescriptionKey] = []byte(description)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			_, err = client.Secrets(metav1.NamespaceSystem).Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: join.BootstrapTokenSecretPrefix + tok.ID, Namespace: metav1.NamespaceSystem},
				Type:       corev1.SecretType(join.BootstrapTokenSecretType),
				Data:       data,
			}, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("store the token: %w", err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok.String())
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token can be used to join (0: never expires)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of a hub administrator (default: --data-dir's admin.kubeconfig, $KUBECONFIG, ~/.kube/config)")
	f.StringVar(&dataDir, "data-dir", "", "the hub's data directory, to use its admin.kubeconfig")
	f.StringVar(&description, "description", "", "a note stored with the token")
	return cmd
}

// loadKubeconfig reads the kubeconfig kubeconfigPath finds and returns its
// client configuration, the hub CA it trusts and its path.
func loadKubeconfig(flag, dataDir string) (*rest.Config, []byte, string, error) {
	path, err := kubeconfigPath(flag, dataDir)
	if err != nil {
		return nil, nil, "", err
	}
	raw, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, nil, "", fmt.Errorf("read kubeconfig %s: %w", path, err)
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*raw, nil).ClientConfig()
	if err != nil {
		return nil, nil, "", fmt.Errorf("use kubeconfig %s: %w", path, err)
	}
	caPEM := cfg.CAData
	if len(caPEM) == 0 && cfg.CAFile != "" {
		if caPEM, err = os.ReadFile(cfg.CAFile); err != nil {
			return nil, nil, "", fmt.Errorf("read the hub CA: %w", err)
		}
	}
	return cfg, caPEM, path, nil
}

func kubeconfigPath(flag, dataDir string) (string, error) {
	switch {
	case flag != "":
		return flag, nil
	case dataDir != "":
		return filepath.Join(dataDir, "admin.kubeconfig"), nil
	case os.Getenv("KUBECONFIG") != "":
		return filepath.SplitList(os.Getenv("KUBECONFIG"))[0], nil
	}
	home, err := os.UserHomeDir()
	if err == nil {
		if p := filepath.Join(home, ".kube", "config"); fileExists(p) {
			return p, nil
		}
	}
	return "", errors.New("no kubeconfig: pass --kubeconfig or --data-dir, or set KUBECONFIG")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// randomString returns n characters of [a-z0-9], the alphabet of bootstrap
// tokens.
func randomString(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	for i := range b {
		var r [1]byte
		for {
			_, _ = rand.Read(r[:])
			// Reject the top of the byte range so every character is
			// equally likely.
			if int(r[0]) < 256-256%len(alphabet) {
				break
			}
		}
		b[i] = alphabet[int(r[0])%len(alphabet)]
	}
	return string(b)
}
