package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// claimsResource is the store resource that holds the claims allocators
// make (see registry.Claims): one key per handed-out address, port or
// range, named by pool (namespace) and value (name). The API serves no
// such resource; only allocators read and write it.
const claimsResource = "allocations.tether.internal"

// claimKey is the store key of one claim. Store names carry no "/", so
// a CIDR's is written "_".
func claimKey(pool, name string) store.Key {
	return store.Key{Resource: claimsResource, Namespace: pool, Name: strings.ReplaceAll(name, "/", "_")}
}

// claimLister is the Lister admission gets outside dry runs: it lists and
// records claims in the store.
type claimLister struct{ lister }

// admitLister returns the Lister a kind's Admit and Release get: one that
// records claims, unless the write is a dry run, which must leave the
// store as it is.
func (s *Storage) admitLister(dryRun bool) registry.Lister {
	if dryRun {
		return lister{s}
	}
	return claimLister{lister{s}}
}

// Claim implements registry.Claims with the store's Create, which fails
// when the key exists, and a takeover with Update at the revision read,
// so that of two hubs claiming at once exactly one succeeds.
func (l claimLister) Claim(ctx context.Context, pool, name string, c registry.Claim, reclaim func(held registry.Claim) bool) (registry.Claim, bool, error) {
	key := claimKey(pool, name)
	if c.Time.IsZero() {
		c.Time = time.Now()
	}
	val, err := json.Marshal(c)
	if err != nil {
		return registry.Claim{}, false, err
	}
	for range 4 {
		_, err := l.s.st.Create(ctx, store.Object{Key: key, Value: val})
		if err == nil {
			return c, true, nil
		}
		if !errors.Is(err, store.ErrExists) {
			return registry.Claim{}, false, fmt.Errorf("claim %s %s: %w", pool, name, err)
		}
		o, err := l.s.st.Get(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return registry.Claim{}, false, fmt.Errorf("claim %s %s: %w", pool, name, err)
		}
		var held registry.Claim
		if err := json.Unmarshal(o.Value, &held); err != nil {
			return registry.Claim{}, false, fmt.Errorf("claim %s %s: decode: %w", pool, name, err)
		}
		if held.Owner == c.Owner {
			return held, true, nil
		}
		if reclaim == nil || !reclaim(held) {
			return held, false, nil
		}
		_, err = l.s.st.Update(ctx, store.Object{Key: key, Value: val}, o.Revision)
		if err == nil {
			return c, true, nil
		}
		if !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) {
			return registry.Claim{}, false, fmt.Errorf("reclaim %s %s: %w", pool, name, err)
		}
	}
	return registry.Claim{}, false, fmt.Errorf("claim %s %s: contended", pool, name)
}

// Unclaim implements registry.Claims: it deletes the claim if owner still
// holds it, at the revision read.
func (l claimLister) Unclaim(ctx context.Context, pool, name, owner string) error {
	key := claimKey(pool, name)
	o, err := l.s.st.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release %s %s: %w", pool, name, err)
	}
	var held registry.Claim
	if err := json.Unmarshal(o.Value, &held); err != nil || held.Owner != owner {
		return nil
	}
	if _, err := l.s.st.Delete(ctx, key, o.Revision); err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, store.ErrConflict) {
		return fmt.Errorf("release %s %s: %w", pool, name, err)
	}
	return nil
}

// ListClaims implements registry.Claims.
func (l claimLister) ListClaims(ctx context.Context, pool string) (map[string]registry.Claim, error) {
	res, err := l.s.st.List(ctx, store.ListOptions{Resource: claimsResource, Namespace: pool})
	if err != nil {
		return nil, fmt.Errorf("list %s claims: %w", pool, err)
	}
	out := make(map[string]registry.Claim, len(res.Objects))
	for _, o := range res.Objects {
		var c registry.Claim
		if json.Unmarshal(o.Value, &c) == nil {
			out[strings.ReplaceAll(o.Name, "_", "/")] = c
		}
	}
	return out, nil
}

// release undoes what a kind's Admit reserved. Releasing runs after the
// request's own work, so it gets a context of its own: a client that gave
// up must not leave the claims behind.
func (s *Storage) release(k *registry.Kind, obj runtime.Object) {
	if k.Release == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k.Release(ctx, claimLister{lister{s}}, obj)
}
