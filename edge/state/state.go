// Package state is the edge agent's local state: the objects a node must
// run (its pods and what they reference) and the resourceVersion of each of
// its watches, kept in one SQLite file in the agent's data directory, so
// that the agent starts its pods without the hub and resumes its watches
// where they stopped.
//
// The agent writes a change here before it acts on it. Writes are durable
// when Commit returns (WAL, synchronous=FULL); concurrent commits share one
// transaction and one fsync (group commit). Reads are rare (start-up, a new
// reference), so the store keeps nothing in memory but SQLite's small page
// cache.
package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers the sqlite3 driver
)

// Key names one stored object. Objects are kept per UID: a pod deleted and
// created again under the same name is another pod, and both may be stored
// for a while (the old one as a tombstone).
type Key struct {
	Kind, Namespace, Name, UID string
}

// Object is a stored object.
type Object struct {
	Key
	// Gone marks a tombstone: the hub deleted the object, and what the
	// agent must do about it (stop a pod) may not be done yet.
	Gone  bool
	Value []byte
}

// Op is one change of a Commit.
type Op struct {
	Key
	// Delete removes the object; otherwise it is written with Value and
	// Gone.
	Delete bool
	Gone   bool
	Value  []byte
}

// Store is a local state file. Its methods may be called concurrently.
type Store struct {
	db   *sql.DB
	reqs chan *commit
	quit chan struct{}
	done chan struct{}

	mu   sync.Mutex
	lazy map[string]string // watch resourceVersions not yet written
	err  error             // set once closed
}

type commit struct {
	ops     []Op
	watches map[string]string // watch → resourceVersion; "" deletes
	done    chan error
}

const schema = `
CREATE TABLE IF NOT EXISTS objects (
	kind      TEXT NOT NULL,
	namespace TEXT NOT NULL,
	name      TEXT NOT NULL,
	uid       TEXT NOT NULL,
	gone      INTEGER NOT NULL DEFAULT 0,
	value     BLOB NOT NULL,
	PRIMARY KEY (kind, namespace, name, uid)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS watches (
	name TEXT PRIMARY KEY,
	rv   TEXT NOT NULL
) WITHOUT ROWID;
`

// lazyFlush is how long a resourceVersion recorded with SetLazy may wait
// for a commit that carries it.
const lazyFlush = 5 * time.Minute

// Open opens (or creates) the state file at path. It holds Secrets: the
// file is readable by its owner only.
func Open(path string) (*Store, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open local state: %w", err)
	}
	err = f.Chmod(0o600)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("open local state: %w", err)
	}
	q := url.Values{}
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", "FULL")
	q.Set("_busy_timeout", "5000")
	q.Set("_txlock", "immediate")
	// A small page cache: the file is read at start-up and when a pod
	// references a new object, and the agent must stay small.
	q.Set("_cache_size", "-256")
	db, err := sql.Open("sqlite3", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open local state: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	for _, stmt := range []string{schema, `PRAGMA wal_autocheckpoint = 256`, `PRAGMA journal_size_limit = 1048576`, `PRAGMA mmap_size = 0`} {
		if _, err := db.Exec(stmt); err != nil {
			db.Close()
			return nil, fmt.Errorf("open local state %s: %w", path, err)
		}
	}
	s := &Store{db: db, reqs: make(chan *commit, 64), quit: make(chan struct{}), done: make(chan struct{}), lazy: map[string]string{}}
	go s.writer()
	return s, nil
}

// Close writes what SetLazy recorded and closes the file.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil
	}
	s.err = errClosed
	s.mu.Unlock()
	close(s.quit)
	<-s.done
	return s.db.Close()
}

// Commit applies ops and sets the resourceVersions of watches ("" removes
// a watch) in one transaction, durable when Commit returns.
func (s *Store) Commit(ops []Op, watches map[string]string) error {
	c := &commit{ops: ops, watches: watches, done: make(chan error, 1)}
	s.mu.Lock()
	err := s.err
	s.mu.Unlock()
	if err != nil {
		return err
	}
	select {
	case s.reqs <- c:
	case <-s.quit:
		return errClosed
	}
	select {
	case err := <-c.done:
		return err
	case <-s.done:
		// The writer stopped; it may have answered just before.
		select {
		case err := <-c.done:
			return err
		default:
			return errClosed
		}
	}
}

var errClosed = errors.New("local state closed")

// SetLazy records a watch's resourceVersion without a write of its own: it
// goes with the next commit, or within lazyFlush, or at Close. Bookmarks
// use it: losing one costs nothing but a longer replay.
func (s *Store) SetLazy(watch, rv string) {
	s.mu.Lock()
	s.lazy[watch] = rv
	s.mu.Unlock()
}

func (s *Store) writer() {
	defer close(s.done)
	t := time.NewTicker(lazyFlush)
	defer t.Stop()
	for {
		var batch []*commit
		select {
		case c := <-s.reqs:
			batch = append(batch, c)
		case <-t.C:
		case <-s.quit:
			// Commits already queued still go in; then the lazy ones.
			for {
				select {
				case c := <-s.reqs:
					batch = append(batch, c)
					continue
				default:
				}
				break
			}
			s.write(batch)
			return
		}
		// Whatever queued meanwhile shares the transaction.
	more:
		for len(batch) < 256 {
			select {
			case c := <-s.reqs:
				batch = append(batch, c)
			default:
				break more
			}
		}
		s.write(batch)
	}
}

// write commits a batch and answers its commits.
func (s *Store) write(batch []*commit) {
	s.mu.Lock()
	lazy := s.lazy
	if len(lazy) > 0 {
		s.lazy = map[string]string{}
	}
	s.mu.Unlock()
	if len(batch) == 0 && len(lazy) == 0 {
		return
	}
	err := s.apply(batch, lazy)
	if err != nil && len(lazy) > 0 {
		// Keep the lazy versions for the next try, unless newer
		// ones arrived.
		s.mu.Lock()
		for k, v := range lazy {
			if _, ok := s.lazy[k]; !ok {
				s.lazy[k] = v
			}
		}
		s.mu.Unlock()
	}
	for _, c := range batch {
		c.done <- err
	}
}

func (s *Store) apply(batch []*commit, lazy map[string]string) error {
	ctx := context.Background()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("write local state: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	put, err := tx.Prepare(`INSERT INTO objects (kind, namespace, name, uid, gone, value) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (kind, namespace, name, uid) DO UPDATE SET gone = excluded.gone, value = excluded.value`)
	if err != nil {
		return fmt.Errorf("write local state: %w", err)
	}
	defer put.Close()
	watch := func(name, rv string) error {
		var err error
		if rv == "" {
			_, err = tx.Exec(`DELETE FROM watches WHERE name = ?`, name)
		} else {
			_, err = tx.Exec(`INSERT INTO watches (name, rv) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET rv = excluded.rv`, name, rv)
		}
		return err
	}
	// Lazy versions first: a commit's own version of the same watch is
	// newer and wins.
	for name, rv := range lazy {
		if err := watch(name, rv); err != nil {
			return fmt.Errorf("write local state: %w", err)
		}
	}
	for _, c := range batch {
		for _, op := range c.ops {
			var err error
			if op.Delete {
				_, err = tx.Exec(`DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ? AND uid = ?`,
					op.Kind, op.Namespace, op.Name, op.UID)
			} else {
				_, err = put.Exec(op.Kind, op.Namespace, op.Name, op.UID, op.Gone, op.Value)
			}
			if err != nil {
				return fmt.Errorf("write local state: %w", err)
			}
		}
		for name, rv := range c.watches {
			if err := watch(name, rv); err != nil {
				return fmt.Errorf("write local state: %w", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit local state: %w", err)
	}
	return nil
}

// List returns the objects of kind, restricted to namespace when it is
// not empty, and to name in namespace when name is not empty (an empty
// namespace then names a cluster-scoped object).
func (s *Store) List(kind, namespace, name string) ([]Object, error) {
	q := `SELECT namespace, name, uid, gone, value FROM objects WHERE kind = ?`
	args := []any{kind}
	switch {
	case name != "":
		q += ` AND namespace = ? AND name = ?`
		args = append(args, namespace, name)
	case namespace != "":
		q += ` AND namespace = ?`
		args = append(args, namespace)
	}
	rows, err := s.db.Query(q, args...)
	if err != nil {
		return nil, fmt.Errorf("read local state: %w", err)
	}
	defer rows.Close()
	var out []Object
	for rows.Next() {
		o := Object{Key: Key{Kind: kind}}
		if err := rows.Scan(&o.Namespace, &o.Name, &o.UID, &o.Gone, &o.Value); err != nil {
			return nil, fmt.Errorf("read local state: %w", err)
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read local state: %w", err)
	}
	return out, nil
}

// Keys returns the keys of every object of kind.
func (s *Store) Keys(kind string) ([]Key, error) {
	rows, err := s.db.Query(`SELECT namespace, name, uid FROM objects WHERE kind = ?`, kind)
	if err != nil {
		return nil, fmt.Errorf("read local state: %w", err)
	}
	defer rows.Close()
	var out []Key
	for rows.Next() {
		k := Key{Kind: kind}
		if err := rows.Scan(&k.Namespace, &k.Name, &k.UID); err != nil {
			return nil, fmt.Errorf("read local state: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// Watch returns the stored resourceVersion of a watch, "" when none.
func (s *Store) Watch(name string) (string, error) {
	s.mu.Lock()
	rv, ok := s.lazy[name]
	s.mu.Unlock()
	if ok {
		return rv, nil
	}
	err := s.db.QueryRow(`SELECT rv FROM watches WHERE name = ?`, name).Scan(&rv)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read local state: %w", err)
	}
	return rv, nil
}

// Watches returns every stored watch and its resourceVersion.
func (s *Store) Watches() (map[string]string, error) {
	rows, err := s.db.Query(`SELECT name, rv FROM watches`)
	if err != nil {
		return nil, fmt.Errorf("read local state: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var n, rv string
		if err := rows.Scan(&n, &rv); err != nil {
			return nil, fmt.Errorf("read local state: %w", err)
		}
		out[n] = rv
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	for n, rv := range s.lazy {
		out[n] = rv
	}
	s.mu.Unlock()
	return out, nil
}
