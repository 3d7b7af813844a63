//go:build !edge

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/internal/fleetapi"
)

func newReleaseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release",
		Short: "Manage the releases of tether the hub holds for its agents",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newReleaseImportCmd())
	return cmd
}

func newReleaseImportCmd() *cobra.Command {
	var (
		kubeconfig string
		dataDir    string
		timeout    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "import FILE [--kubeconfig PATH]",
		Short: "Give the hub an executable of tether for its agents to upgrade to",
		Long: `Post an executable of tether (the edge build or the full one, of any
architecture) to the hub. The hub reads its version, architecture and build
from the executable without running it, signs them with its release signer
(a certificate of the cluster CA, which agents trust since they joined),
keeps the executable and creates the Release named after them, which
'kubectl get releases' lists. Importing the same executable again changes
nothing; another executable under an existing Release's name is refused.

Each hub keeps its own copy of the executables: with several hubs, import
on each of them. Importing needs the right to "post" on /fleet/releases
(cluster-admin has it).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			restCfg, _, _, err := loadKubeconfig(kubeconfig, dataDir)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rel, created, err := importRelease(ctx, restCfg, args[0])
			if err != nil {
				return err
			}
			what := "imported"
			if !created {
				what = "already held"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "release %s %s: %s, %d bytes\n", rel.Name, what, rel.Spec.Digest, rel.Spec.Size)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of a hub administrator (default: --data-dir's admin.kubeconfig, $KUBECONFIG, ~/.kube/config)")
	f.StringVar(&dataDir, "data-dir", "", "the hub's data directory, to use its admin.kubeconfig")
	f.DurationVar(&timeout, "timeout", 10*time.Minute, "how long the upload may take")
	return cmd
}

// importRelease posts the executable at path to the hub of cfg and
// returns the Release the hub answers with, and whether it is new.
func importRelease(ctx context.Context, cfg *rest.Config, path string) (*fleetapi.Release, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	if !fi.Mode().IsRegular() {
		return nil, false, fmt.Errorf("%s is not a regular file", path)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, false, fmt.Errorf("create client: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(cfg.Host, "/")+fleetapi.ImportPath, f)
	if err != nil {
		return nil, false, err
	}
	req.ContentLength = fi.Size()
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, false, fmt.Errorf("post %s to the hub: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, false, fmt.Errorf("read the hub's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		var st metav1.Status
		if json.Unmarshal(body, &st) == nil && st.Message != "" {
			return nil, false, fmt.Errorf("import %s: %s", path, st.Message)
		}
		return nil, false, fmt.Errorf("import %s: the hub answered %s", path, resp.Status)
	}
	rel := &fleetapi.Release{}
	if err := json.Unmarshal(body, rel); err != nil {
		return nil, false, fmt.Errorf("read the hub's answer: %w", err)
	}
	return rel, resp.StatusCode == http.StatusCreated, nil
}
