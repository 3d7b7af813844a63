package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/rowcodec"
)

// Dump reads the current state of the database at path without opening a
// Store: fn gets every live object with its revision, then Dump returns the
// store's revision. The database is opened read-only; the hub using it
// should be stopped.
func Dump(ctx context.Context, path string, fn func(store.Object) error) (int64, error) {
	if _, err := os.Stat(path); err != nil {
		return 0, fmt.Errorf("dump sqlite store: %w", err)
	}
	q := url.Values{}
	q.Set("mode", "ro")
	q.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	db, err := sql.Open("sqlite3", "file:"+path+"?"+q.Encode())
	if err != nil {
		return 0, fmt.Errorf("open database: %w", err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("begin dump: %w", err)
	}
	defer tx.Rollback()
	var rev int64
	if err := tx.QueryRowContext(ctx, `SELECT v FROM meta WHERE k = 'rev'`).Scan(&rev); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("dump sqlite store: %s holds no tether store", path)
		}
		return 0, fmt.Errorf("read revision: %w", err)
	}
	var maxLog sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT max(rev) FROM log`).Scan(&maxLog); err != nil {
		return 0, fmt.Errorf("read newest log revision: %w", err)
	}
	rev = max(rev, maxLog.Int64)
	rows, err := tx.QueryContext(ctx, `SELECT o.resource, o.namespace, o.name, l.value, l.labels, l.fields, o.rev
		FROM objects o JOIN log l ON l.rev = o.rev ORDER BY o.rev`)
	if err != nil {
		return 0, fmt.Errorf("read objects: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var o store.Object
		var lb, fb []byte
		if err := rows.Scan(&o.Resource, &o.Namespace, &o.Name, &o.Value, &lb, &fb, &o.Revision); err != nil {
			return 0, fmt.Errorf("read objects: %w", err)
		}
		o.Value = nonNil(o.Value)
		if o.Labels, err = rowcodec.DecodeMap(lb); err != nil {
			return 0, fmt.Errorf("read labels of %v: %w", o.Key, err)
		}
		if o.Fields, err = rowcodec.DecodeMap(fb); err != nil {
			return 0, fmt.Errorf("read fields of %v: %w", o.Key, err)
		}
		if err := fn(o); err != nil {
			return 0, err
		}
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read objects: %w", err)
	}
	return rev, nil
}
