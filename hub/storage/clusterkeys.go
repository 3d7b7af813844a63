package storage

import (
	"context"
	"errors"
	"fmt"

	"github.com/tether-edge/tether/store"
)

// clusterKeysKey is the store key of the cluster's keys, sealed (see
// pki.Keys.Seal), shared by the hubs of a PostgreSQL datastore. Its
// resource is no registry kind's: the API serves it to nobody, whatever
// the caller's rights; only a hub starting reads and writes it.
var clusterKeysKey = store.Key{Resource: "clusterkeys.tether.internal", Name: "cluster"}

// ReadClusterKeys returns the sealed cluster keys st holds, or an error
// wrapping store.ErrNotFound when it holds none.
func ReadClusterKeys(ctx context.Context, st store.Store) ([]byte, error) {
	o, err := st.Get(ctx, clusterKeysKey)
	if err != nil {
		return nil, fmt.Errorf("read the cluster's keys from the store: %w", err)
	}
	return o.Value, nil
}

// CreateClusterKeys stores sealed as the cluster's keys unless st holds
// some already, with the store's Create, so that of hubs creating them at
// once exactly one wins. It returns what st holds afterwards and whether
// it is sealed.
func CreateClusterKeys(ctx context.Context, st store.Store, sealed []byte) ([]byte, bool, error) {
	_, err := st.Create(ctx, store.Object{Key: clusterKeysKey, Value: sealed})
	if err == nil {
		return sealed, true, nil
	}
	if !errors.Is(err, store.ErrExists) {
		return nil, false, fmt.Errorf("store the cluster's keys: %w", err)
	}
	held, err := ReadClusterKeys(ctx, st)
	if err != nil {
		return nil, false, err
	}
	return held, false, nil
}
