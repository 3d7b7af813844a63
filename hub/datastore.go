package hub

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/postgres"
	"github.com/tether-edge/tether/store/sqlite"
)

// isPostgresDatastore reports whether a --datastore value names PostgreSQL.
func isPostgresDatastore(ds string) bool {
	return strings.HasPrefix(ds, "postgres://") || strings.HasPrefix(ds, "postgresql://")
}

// openStore opens the store cfg.Datastore names: SQLite in the data
// directory when empty, else a PostgreSQL database, which must hold no
// other cluster's data (the cluster is named by its CA's key hash).
func openStore(ctx context.Context, cfg Config, clusterID string) (store.Store, error) {
	log := cfg.Logger.With("component", "store")
	switch {
	case cfg.Datastore == "":
		return sqlite.Open(sqlite.Config{
			Path:            filepath.Join(cfg.DataDir, "state.db"),
			Retain:          cfg.ChangeLogRetain,
			CompactInterval: cfg.CompactInterval,
			Logger:          log,
		})
	case isPostgresDatastore(cfg.Datastore):
		return postgres.Open(ctx, postgres.Config{
			DSN:             cfg.Datastore,
			ClusterID:       clusterID,
			Retain:          cfg.ChangeLogRetain,
			CompactInterval: cfg.CompactInterval,
			Logger:          log,
		})
	}
	return nil, fmt.Errorf("open store: datastore %q is neither empty (SQLite) nor a postgres:// URL", redactDSN(cfg.Datastore))
}

// redactDSN hides a password in a datastore URL.
func redactDSN(ds string) string {
	scheme, rest, ok := strings.Cut(ds, "://")
	if !ok {
		return ds
	}
	userinfo, host, ok := strings.Cut(rest, "@")
	if !ok {
		return ds
	}
	if user, _, hasPass := strings.Cut(userinfo, ":"); hasPass {
		return scheme + "://" + user + ":xxxxx@" + host
	}
	return ds
}
