//go:build !edge

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tether-edge/tether/hub"
	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/postgres"
	"github.com/tether-edge/tether/store/sqlite"
)

func newStoreCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Manage the hub's store",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newStoreMigrateCmd())
	return cmd
}

func newStoreMigrateCmd() *cobra.Command {
	var from, to string
	cmd := &cobra.Command{
		Use:   "migrate --from sqlite:DIR --to postgres://...",
		Short: "Copy a stopped hub's SQLite store into an empty PostgreSQL database",
		Long: `Copy every object of the SQLite store in the hub data directory DIR,
with its resourceVersion, into an empty PostgreSQL database, recorded as
the cluster of DIR's CA. Stop the hub first; afterwards run it with
--data-dir DIR --datastore URL. History is not copied: watches from older
resourceVersions get 410 Gone and clients list again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, ok := strings.CutPrefix(from, "sqlite:")
			if !ok || dir == "" {
				return fmt.Errorf("--from %q: want sqlite:DIR, the hub's data directory", from)
			}
			if !strings.HasPrefix(to, "postgres://") && !strings.HasPrefix(to, "postgresql://") {
				return errors.New("--to: want a postgres:// URL")
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			n, rev, err := migrateStore(ctx, dir, to)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "copied %d objects at revision %d\n", n, rev)
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the source: sqlite:DIR, DIR being the hub's --data-dir (required)")
	cmd.Flags().StringVar(&to, "to", "", "the destination: a postgres:// URL of an empty database (required)")
	_ = cmd.MarkFlagRequired("from")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

// migrateStore copies the SQLite store of dataDir into the database at dsn.
func migrateStore(ctx context.Context, dataDir, dsn string) (int, int64, error) {
	id, err := hub.ClusterID(dataDir)
	if err != nil {
		return 0, 0, err
	}
	path := filepath.Join(dataDir, "state.db")
	if _, err := os.Stat(path); err != nil {
		return 0, 0, fmt.Errorf("migrate store: %w", err)
	}
	var objs []store.Object
	rev, err := sqlite.Dump(ctx, path, func(o store.Object) error {
		objs = append(objs, o)
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	dst, err := postgres.Open(ctx, postgres.Config{DSN: dsn, ClusterID: id})
	if err != nil {
		return 0, 0, err
	}
	defer dst.Close()
	if err := dst.Import(ctx, rev, objs); err != nil {
		return 0, 0, err
	}
	return len(objs), rev, nil
}
