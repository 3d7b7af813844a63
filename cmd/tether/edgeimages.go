package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-edge/tether/edge/containerd"
	"github.com/tether-edge/tether/internal/bundle"
)

// defaultContainerdAddress is where the agent looks for containerd, and
// where it starts its own when nothing answers.
const defaultContainerdAddress = "/run/containerd/containerd.sock"

func newEdgeImagesCmd() *cobra.Command {
	images := &cobra.Command{
		Use:   "images",
		Short: "Manage the images of an edge node",
	}
	var dataDir, address string
	imp := &cobra.Command{
		Use:   "import FILE...",
		Short: "Import OCI or Docker image archives for pods with imagePullPolicy IfNotPresent or Never",
		Long: `Import image archives (OCI image layout or docker save tarballs), or the
images of bundles from ` + "`tether bundle create`" + `, into the node's
containerd, namespace tether. When containerd is not running, the
archives are copied to <data-dir>/images, which the agent imports when it
starts.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			files, cleanup, err := unbundleImages(args)
			if err != nil {
				return err
			}
			defer cleanup()
			for _, file := range files {
				names, err := containerd.ImportArchive(ctx, address, file)
				if err == nil {
					for _, n := range names {
						fmt.Fprintf(cmd.OutOrStdout(), "imported %s\n", n)
					}
					continue
				}
				if dataDir == "" {
					return err
				}
				dst := filepath.Join(dataDir, "images", filepath.Base(file))
				if cerr := copyFile(file, dst); cerr != nil {
					return fmt.Errorf("%w (and copy to %s: %v)", err, dst, cerr)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "containerd is not reachable (%v): copied %s to %s for the agent to import at start\n", err, file, dst)
			}
			return nil
		},
	}
	imp.Flags().StringVar(&dataDir, "data-dir", "", "the agent's data directory: fallback when containerd is not running")
	imp.Flags().StringVar(&address, "containerd-address", defaultContainerdAddress, "containerd socket")
	images.AddCommand(imp)
	return images
}

// unbundleImages replaces each bundle among files by the image archives
// it carries, extracted (and checked) into a temporary directory that
// cleanup removes.
func unbundleImages(files []string) (out []string, cleanup func(), err error) {
	var dirs []string
	cleanup = func() {
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
	for _, f := range files {
		if !bundle.Is(f) {
			out = append(out, f)
			continue
		}
		dir, err := os.MkdirTemp("", "tether-bundle-")
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		dirs = append(dirs, dir)
		m, paths, err := bundle.Extract(f, dir, func(e bundle.Entry) bool { return strings.HasPrefix(e.File, "images/") })
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		for _, e := range m.Images {
			out = append(out, paths[e.File])
		}
	}
	return out, cleanup, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.Create(dst + ".tmp")
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(dst+".tmp", dst)
}
