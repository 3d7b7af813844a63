package sqlite

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/rowcodec"
)

func compareKeys(a, b store.Key) int {
	if c := cmp.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return cmp.Compare(a.Name, b.Name)
}

// sortedLocked returns the keys of one resource in list order, rebuilding
// the cached order only after keys appeared or went; s.mu is read-locked.
func (s *Store) sortedLocked(resource string) []store.Key {
	gen := s.gen[resource]
	s.sortMu.Lock()
	defer s.sortMu.Unlock()
	if c, ok := s.sorted[resource]; ok && c.gen == gen {
		return c.keys
	}
	m := s.objs[resource]
	keys := make([]store.Key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	s.sorted[resource] = sortedKeys{gen: gen, keys: keys}
	return keys
}

// List returns the current objects of one resource, filtered and paged.
func (s *Store) List(ctx context.Context, opts store.ListOptions) (store.ListResult, error) {
	if opts.Resource == "" {
		return store.ListResult{}, fmt.Errorf("list: resource is required")
	}
	var after *rowcodec.Continue
	if opts.Continue != "" {
		c, err := rowcodec.DecodeContinue(opts.Continue)
		if err != nil {
			return store.ListResult{}, err
		}
		after = &c
	}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return store.ListResult{}, store.ErrClosed
	}
	if after != nil && after.Rev < s.compacted {
		s.mu.RUnlock()
		return store.ListResult{}, fmt.Errorf("continue list at revision %d: %w", after.Rev, store.ErrCompacted)
	}
	rev := s.rev
	m := s.objs[opts.Resource]
	keys := s.sortedLocked(opts.Resource)
	lo, hi := 0, len(keys)
	if opts.Namespace != "" {
		lo, _ = slices.BinarySearchFunc(keys, opts.Namespace, func(k store.Key, ns string) int { return cmp.Compare(k.Namespace, ns) })
		hi, _ = slices.BinarySearchFunc(keys, opts.Namespace+"\x00", func(k store.Key, ns string) int { return cmp.Compare(k.Namespace, ns) })
	}
	if after != nil {
		i, found := slices.BinarySearchFunc(keys, store.Key{Namespace: after.Namespace, Name: after.Name}, compareKeys)
		if found {
			i++
		}
		lo = max(lo, i)
	}
	res := store.ListResult{Revision: rev}
	filtered := (opts.Label != nil && !opts.Label.Empty()) || (opts.Field != nil && !opts.Field.Empty())
	n := hi - lo
	if opts.Limit > 0 && int64(n) > opts.Limit {
		n = int(opts.Limit)
	}
	if n < 0 {
		n = 0
	}
	res.Objects = make([]store.Object, 0, n)
	var last store.Key
	i := lo
	for ; i < hi; i++ {
		if opts.Limit > 0 && int64(len(res.Objects)) == opts.Limit {
			break
		}
		k := keys[i]
		st := m[k]
		if filtered && !store.Matches(opts.Label, opts.Field, st.labels, st.fields) {
			continue
		}
		res.Objects = append(res.Objects, viewOf(k, st))
		last = k
	}
	var remaining int64
	for ; i < hi; i++ {
		if !filtered {
			remaining = int64(hi - i)
			break
		}
		st := m[keys[i]]
		if store.Matches(opts.Label, opts.Field, st.labels, st.fields) {
			remaining++
		}
	}
	s.mu.RUnlock()
	if opts.ReadOnly {
		// States are immutable once published: a reader that keeps its
		// promise can share them.
		return s.finishList(res, rev, after, last, remaining), nil
	}
	// States are immutable once published: copy outside the lock. All
	// values go into one backing array, which bytes.Join allocates without
	// zeroing it first; the maps must be copied one by one.
	vals := make([][]byte, len(res.Objects))
	for i := range res.Objects {
		vals[i] = res.Objects[i].Value
	}
	buf := bytes.Join(vals, nil)
	off := 0
	for i := range res.Objects {
		o := &res.Objects[i]
		end := off + len(o.Value)
		o.Value = buf[off:end:end]
		off = end
		o.Labels = cloneMap(o.Labels)
		o.Fields = cloneMap(o.Fields)
	}
	return s.finishList(res, rev, after, last, remaining), nil
}

// finishList sets the continue token of a page that stopped before the end.
func (s *Store) finishList(res store.ListResult, rev int64, after *rowcodec.Continue, last store.Key, remaining int64) store.ListResult {
	if remaining > 0 {
		tokRev := rev
		if after != nil {
			tokRev = after.Rev
		}
		res.Continue = rowcodec.Continue{Rev: tokRev, Namespace: last.Namespace, Name: last.Name}.Encode()
		res.Remaining = remaining
	}
	return res
}
