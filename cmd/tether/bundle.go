//go:build !edge

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-edge/tether/internal/bundle"
)

func newBundleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bundle",
		Short: "Make air-gap bundles of images and tether releases",
	}
	var out string
	var releases []string
	create := &cobra.Command{
		Use:   "create -o FILE [--release EXECUTABLE]... [IMAGE-ARCHIVE]...",
		Short: "Pack image archives and tether executables into one bundle",
		Long: `Pack image archives (OCI image layouts or docker save tarballs) and
executables of tether (built by scripts/release.sh) into one file, for
sites that cannot reach a registry or the hub's release store. On a node,
` + "`tether edge images import FILE`" + ` imports its images and
` + "`tether edge upgrade --binary FILE`" + ` takes the release for the node's
architecture from it; every entry is checked against the bundle's list of
digests first.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return errors.New("give the bundle's file with -o")
			}
			tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+"-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			m, err := bundle.Create(tmp, args, releases, time.Now())
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), out); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, e := range m.Images {
				fmt.Fprintf(w, "image archive %s (%d bytes, %s)\n", e.File, e.Size, e.Digest)
			}
			for _, r := range m.Releases {
				fmt.Fprintf(w, "release %s %s/%s (%d bytes, %s)\n", r.Version, r.Build, r.Arch, r.Size, r.Digest)
			}
			fmt.Fprintf(w, "wrote %s\n", out)
			return nil
		},
	}
	create.Flags().StringVarP(&out, "output", "o", "", "the bundle to write")
	create.Flags().StringArrayVar(&releases, "release", nil, "an executable of tether to carry (repeatable)")
	cmd.AddCommand(create)
	return cmd
}
