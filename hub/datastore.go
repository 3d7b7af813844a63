package hub

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
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
// other cluster's data than clusterID's (a cluster is named by its CA's
// key hash) unless clusterID is empty; an empty database records
// clusterID, or newClusterID when clusterID is empty.
func openStore(ctx context.Context, cfg Config, clusterID, newClusterID string) (store.Store, error) {
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
			NewClusterID:    newClusterID,
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

// ClusterID returns the identity a hub with dataDir records in a
// PostgreSQL datastore: the hash of its CA's public key, as
// pki.Authority.CAHash gives it. It reads the CA certificate and creates
// nothing.
func ClusterID(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "pki", "ca.crt"))
	if err != nil {
		return "", fmt.Errorf("read the cluster's CA: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "", errors.New("read the cluster's CA: no PEM block")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", fmt.Errorf("parse the cluster's CA: %w", err)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
