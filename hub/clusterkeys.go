package hub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/postgres"
)

// keysWait is how long a hub that found a database another hub has just
// created waits for that hub to store the cluster's keys.
const keysWait = 30 * time.Second

// openStoreAndKeys opens the store and settles the cluster's keys. On
// SQLite the keys stay in the data directory, as they always have: the
// returned keys are nil and the PKI loads or creates them there. On
// PostgreSQL every hub takes them from the store, where they are sealed
// with the secret key (see pki.Keys.Seal): the first hub stores the keys
// of its data directory, or new ones, and a hub with an empty data
// directory reads them. Nothing is written, to the store or the data
// directory, by a hub whose secret key does not open them.
func openStoreAndKeys(ctx context.Context, cfg Config) (store.Store, *pki.Keys, error) {
	if cfg.Datastore == "" {
		st, err := openStore(ctx, cfg, "", "")
		return st, nil, err
	}
	secret, err := readSecretKey(cfg.SecretKeyFile)
	if err != nil {
		return nil, nil, err
	}
	local, err := pki.ReadKeys(cfg.DataDir)
	if err != nil {
		return nil, nil, err
	}
	// A data directory with a CA names its cluster: a database of
	// another is refused. Without one the hub joins the database's
	// cluster, or, when the database is empty, founds one with new keys.
	own, newKeys := local, false
	if own == nil {
		if own, err = pki.GenerateKeys(time.Now()); err != nil {
			return nil, nil, err
		}
		newKeys = true
	}
	ownID, err := own.CAHash()
	if err != nil {
		return nil, nil, err
	}
	clusterID, newClusterID := ownID, ""
	if newKeys {
		clusterID, newClusterID = "", ownID
	}
	st, err := openStore(ctx, cfg, clusterID, newClusterID)
	if err != nil {
		return nil, nil, err
	}
	ks := keySettler{st: st, secret: secret, secretFile: cfg.SecretKeyFile, log: cfg.Logger.With("component", "pki")}
	if pg, ok := st.(*postgres.Store); ok {
		ks.cluster = pg.ClusterID()
	}
	var keys *pki.Keys
	if ks.cluster == ownID {
		keys, err = ks.storeOrRead(ctx, own, newKeys)
	} else {
		keys, err = ks.await(ctx)
	}
	if err != nil {
		_ = st.Close()
		return nil, nil, err
	}
	if local != nil && !local.Equal(keys) {
		ks.log.Warn("the data directory's keys differ from the cluster's in the datastore; the datastore's replace them", "dir", cfg.DataDir)
	}
	return st, keys, nil
}

// keySettler reads and stores the sealed keys of one cluster.
type keySettler struct {
	st         store.Store
	cluster    string // the database's cluster id, the keys' sealing context
	secret     []byte
	secretFile string
	log        *slog.Logger
}

// storeOrRead stores own, the keys of the database's cluster, unless the
// store holds them already; then it reads those.
func (ks keySettler) storeOrRead(ctx context.Context, own *pki.Keys, generated bool) (*pki.Keys, error) {
	held, err := storage.ReadClusterKeys(ctx, ks.st)
	if err == nil {
		return ks.open(held)
	}
	if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	sealed, err := own.Seal(ks.secret, ks.cluster)
	if err != nil {
		return nil, err
	}
	held, created, err := storage.CreateClusterKeys(ctx, ks.st, sealed)
	if err != nil {
		return nil, err
	}
	if !created {
		return ks.open(held)
	}
	from := "the data directory"
	if generated {
		from = "new"
	}
	ks.log.Info("stored the cluster's keys in the datastore, sealed with the secret key", "cluster", ks.cluster, "keys", from)
	return own, nil
}

// await reads the keys of a cluster this hub has none of, waiting a while
// for the hub that created the database to store them.
func (ks keySettler) await(ctx context.Context) (*pki.Keys, error) {
	deadline := time.Now().Add(keysWait)
	for {
		held, err := storage.ReadClusterKeys(ctx, ks.st)
		if err == nil {
			ks.log.Info("read the cluster's keys from the datastore", "cluster", ks.cluster)
			return ks.open(held)
		}
		if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the datastore holds cluster %s but not its keys: start one hub whose data directory holds that cluster's CA (pki/ca.crt and ca.key) to store them; if the database holds nothing yet, recreate it", ks.cluster)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the cluster's keys: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// open decrypts sealed keys and checks they are the cluster's.
func (ks keySettler) open(sealed []byte) (*pki.Keys, error) {
	keys, err := pki.OpenKeys(sealed, ks.secret, ks.cluster)
	if errors.Is(err, pki.ErrWrongSecretKey) {
		return nil, fmt.Errorf("the cluster's keys in the datastore do not decrypt with the secret key in %s: every hub of a cluster must be given the secret key its first hub was given", ks.secretFile)
	}
	if err != nil {
		return nil, err
	}
	id, err := keys.CAHash()
	if err != nil {
		return nil, err
	}
	if id != ks.cluster {
		return nil, fmt.Errorf("the keys in the datastore are cluster %s's, not the database's cluster %s", id, ks.cluster)
	}
	return keys, nil
}

// readSecretKey reads the secret the cluster's keys are sealed with from
// path: its content, blanks around it removed.
func readSecretKey(path string) ([]byte, error) {
	if path == "" {
		return nil, errors.New(noSecretKey)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the secret key: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < pki.MinSecretKeyLength {
		return nil, fmt.Errorf("read the secret key: %s holds %d bytes, at least %d are needed (e.g. openssl rand -hex 32)", path, len(b), pki.MinSecretKeyLength)
	}
	return b, nil
}

const noSecretKey = "a PostgreSQL datastore needs a secret key file (--secret-key-file): the hubs keep the cluster's keys in the database, encrypted with it; give every hub the same file, made once with e.g. openssl rand -hex 32"
