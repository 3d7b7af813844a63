package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/rowcodec"
)

// List returns the current objects of one resource, filtered and paged, in
// one snapshot. Objects come by (namespace, name) in byte order straight
// from the primary key of tether_objects.
func (s *Store) List(ctx context.Context, opts store.ListOptions) (store.ListResult, error) {
	if opts.Resource == "" {
		return store.ListResult{}, fmt.Errorf("list: resource is required")
	}
	if s.closed.Load() {
		return store.ListResult{}, store.ErrClosed
	}
	var after *rowcodec.Continue
	if opts.Continue != "" {
		c, err := rowcodec.DecodeContinue(opts.Continue)
		if err != nil {
			return store.ListResult{}, err
		}
		after = &c
	}
	res, err := s.list(ctx, opts, after)
	if err != nil && s.closed.Load() {
		return store.ListResult{}, store.ErrClosed
	}
	return res, err
}

func (s *Store) list(ctx context.Context, opts store.ListOptions, after *rowcodec.Continue) (store.ListResult, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return store.ListResult{}, fmt.Errorf("list %s: %w", opts.Resource, unavailable(err))
	}
	defer tx.Rollback(context.Background())
	var rev, compacted int64
	if err := tx.QueryRow(ctx, `SELECT rev, compacted FROM tether_counter WHERE id = 1`).Scan(&rev, &compacted); err != nil {
		return store.ListResult{}, fmt.Errorf("list %s: read revision: %w", opts.Resource, unavailable(err))
	}
	s.noteRev(rev)
	if after != nil && after.Rev < compacted {
		return store.ListResult{}, fmt.Errorf("continue list at revision %d: %w", after.Rev, store.ErrCompacted)
	}
	where := `o.resource = $1`
	args := []any{opts.Resource}
	if opts.Namespace != "" {
		args = append(args, opts.Namespace)
		where += fmt.Sprintf(` AND o.namespace = $%d`, len(args))
	}
	if after != nil {
		args = append(args, after.Namespace, after.Name)
		where += fmt.Sprintf(` AND (o.namespace, o.name) > ($%d, $%d)`, len(args)-1, len(args))
	}
	filtered := (opts.Label != nil && !opts.Label.Empty()) || (opts.Field != nil && !opts.Field.Empty())
	// The keys are ordered (and limited) before the values are fetched,
	// each by the log's primary key: ordering the joined rows would sort
	// every value, on disk beyond work_mem, and the planner, with stale
	// statistics of a table that just grew, picks that sort. Both
	// subqueries are fenced with OFFSET 0 so that it cannot flatten them
	// back into one join; the nested loop keeps the keys' order.
	limit := ""
	if opts.Limit > 0 && !filtered {
		limit = fmt.Sprintf(` LIMIT %d`, opts.Limit)
	}
	q := `SELECT ` + listColumns + `
		FROM (SELECT o.namespace, o.name, o.rev FROM tether_objects o
			WHERE ` + where + ` ORDER BY o.namespace, o.name` + limit + ` OFFSET 0) o
		CROSS JOIN LATERAL (SELECT value, labels, fields FROM tether_log WHERE rev = o.rev OFFSET 0) l
		ORDER BY o.namespace, o.name`
	rows, err := tx.Query(ctx, q, append(s.binaryResults(), args...)...)
	if err != nil {
		return store.ListResult{}, fmt.Errorf("list %s: %w", opts.Resource, unavailable(err))
	}
	res := store.ListResult{Revision: rev, Objects: []store.Object{}}
	full := false
	dec := newListDecoder(opts.Resource)
	var keep func(labels, fields map[string]string) bool
	if filtered {
		keep = func(l, f map[string]string) bool { return store.Matches(opts.Label, opts.Field, l, f) }
	}
	for rows.Next() {
		if opts.Limit > 0 && int64(len(res.Objects)) == opts.Limit {
			full = true
			break
		}
		o, ok, err := dec.decodeRow(rows, keep)
		if err != nil {
			rows.Close()
			return store.ListResult{}, fmt.Errorf("list %s: %w", opts.Resource, err)
		}
		if !ok {
			continue
		}
		res.Objects = append(res.Objects, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return store.ListResult{}, fmt.Errorf("list %s: %w", opts.Resource, unavailable(err))
	}
	if opts.Limit <= 0 || int64(len(res.Objects)) < opts.Limit || (filtered && !full) {
		return res, nil
	}
	// The page is full: count what follows its last object.
	last := res.Objects[len(res.Objects)-1]
	args = append(args[:len(args):len(args)], last.Namespace, last.Name)
	rest := where + fmt.Sprintf(` AND (o.namespace, o.name) > ($%d, $%d)`, len(args)-1, len(args))
	var remaining int64
	if !filtered {
		err = tx.QueryRow(ctx, `SELECT count(*) FROM tether_objects o WHERE `+rest, args...).Scan(&remaining)
		if err != nil {
			return store.ListResult{}, fmt.Errorf("list %s: count the rest: %w", opts.Resource, unavailable(err))
		}
	} else {
		rows, err := tx.Query(ctx, `SELECT l.labels, l.fields FROM tether_objects o JOIN tether_log l ON l.rev = o.rev WHERE `+rest, args...)
		if err != nil {
			return store.ListResult{}, fmt.Errorf("list %s: count the rest: %w", opts.Resource, unavailable(err))
		}
		for rows.Next() {
			var lb, fb []byte
			if err := rows.Scan(&lb, &fb); err != nil {
				rows.Close()
				return store.ListResult{}, fmt.Errorf("list %s: count the rest: %w", opts.Resource, unavailable(err))
			}
			l, err1 := rowcodec.DecodeMap(lb)
			f, err2 := rowcodec.DecodeMap(fb)
			if err1 == nil && err2 == nil && store.Matches(opts.Label, opts.Field, l, f) {
				remaining++
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return store.ListResult{}, fmt.Errorf("list %s: count the rest: %w", opts.Resource, unavailable(err))
		}
	}
	if remaining > 0 {
		tokRev := rev
		if after != nil {
			tokRev = after.Rev
		}
		res.Continue = rowcodec.Continue{Rev: tokRev, Namespace: last.Namespace, Name: last.Name}.Encode()
		res.Remaining = remaining
	}
	return res, nil
}
