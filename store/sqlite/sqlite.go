// Package sqlite implements [store.Store] on one SQLite database in WAL mode.
//
// Current state lives in memory (key → value, labels, fields, revision) and in
// the objects table, which only points at the change-log row holding the
// object's newest state, so a value is written to disk once. The change log
// (revision → type, key, value, labels, fields, previous revision) is bounded
// by background compaction, which keeps rows that are still current or that a
// retained row needs as its previous state. A single writer goroutine drains a
// queue of operations into one transaction per batch, so concurrent writers
// share one fsync. Watches are fed from memory as batches commit; a watch
// resuming from an older revision replays the change log first.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"sync"
	"time"

	_ "github.com/mattn/go-sqlite3" // registers the sqlite3 driver

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/eventring"
	"github.com/tether-edge/tether/store/internal/rowcodec"
	"github.com/tether-edge/tether/store/internal/watchq"
)

var _ store.Store = (*Store)(nil)

// Config configures a Store. Only Path is required.
type Config struct {
	// Path is the database file; created if missing.
	Path string
	// MaxBatch caps the operations committed in one transaction; zero means 512.
	MaxBatch int
	// BatchWait is how long the writer waits for more operations after the
	// first one of a batch arrives; zero means it commits whatever is queued
	// at once (concurrent writers still share a commit while the previous
	// one is being fsync'd).
	BatchWait time.Duration
	// MaxValueSize limits Object.Value; zero means 3 MiB.
	MaxValueSize int
	// Retain is how many revisions the change log keeps at least; zero
	// means 100,000.
	Retain int64
	// RetainFor is the age after which log entries are compacted even if
	// fewer than Retain revisions exist; zero means one hour.
	RetainFor time.Duration
	// CompactInterval is how often compaction runs; zero means 30 seconds.
	CompactInterval time.Duration
	// WatchCache is how many recent events stay in memory for watches that
	// resume from a recent revision; zero means 10,000.
	WatchCache int
	// WatchCacheBytes bounds the states those events hold (see
	// eventring.Cost); zero means 32 MiB. Watches resuming from further
	// back replay the change log.
	WatchCacheBytes int64
	// WatchQueue is how many undelivered events one watch may hold before
	// it ends with store.ErrWatchOverflow; zero means 10,000.
	WatchQueue int
	// Logger receives background errors; nil means slog.Default().
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.MaxBatch <= 0 {
		c.MaxBatch = 512
	}
	if c.MaxValueSize <= 0 {
		c.MaxValueSize = 3 << 20
	}
	if c.Retain <= 0 {
		c.Retain = 100_000
	}
	if c.RetainFor <= 0 {
		c.RetainFor = time.Hour
	}
	if c.CompactInterval <= 0 {
		c.CompactInterval = 30 * time.Second
	}
	if c.WatchCache <= 0 {
		c.WatchCache = 10_000
	}
	if c.WatchCacheBytes <= 0 {
		c.WatchCacheBytes = 32 << 20
	}
	if c.WatchQueue <= 0 {
		c.WatchQueue = 10_000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// busyTimeout is how long a connection waits for a lock held by another.
const busyTimeout = 10 * time.Second

const schema = `
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log (
	rev INTEGER PRIMARY KEY,
	type INTEGER NOT NULL,
	resource TEXT NOT NULL,
	namespace TEXT NOT NULL,
	name TEXT NOT NULL,
	value BLOB,
	labels BLOB,
	fields BLOB,
	prev_rev INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS log_prev ON log(prev_rev);
CREATE TABLE IF NOT EXISTS objects (
	resource TEXT NOT NULL,
	namespace TEXT NOT NULL,
	name TEXT NOT NULL,
	rev INTEGER NOT NULL,
	PRIMARY KEY (resource, namespace, name)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS objects_rev ON objects(rev);
INSERT OR IGNORE INTO meta(k, v) VALUES ('rev', 0), ('compacted', 0);
`

// state is one object's current state; never modified once published.
type state struct {
	value  []byte
	labels map[string]string
	fields map[string]string
	rev    int64
}

// Store is a SQLite-backed store.Store. Create it with Open.
type Store struct {
	cfg Config
	db  *sql.DB // writer connection
	rdb *sql.DB // readers (watch replay)
	cdb *sql.DB // checkpoints
	// ckptMu keeps the background checkpoint and the writer's restart of
	// the write-ahead log apart, so that a restart never finds the log
	// busy with the former and waits for the copying instead.
	ckptMu sync.Mutex
	bg     sync.WaitGroup
	log    *slog.Logger

	ops  chan *op
	quit chan struct{}
	done chan struct{}

	closeOnce  sync.Once
	closeErr   error
	sendMu     sync.RWMutex
	sendClosed bool

	mu        sync.RWMutex
	objs      map[string]map[store.Key]*state // resource → key → state
	rev       int64
	compacted int64
	closed    bool
	ring      *eventring.Ring       // recent events
	watchers  *watchq.Set[*watcher] // every watch, routed by a field's value

	checkpoints []checkpoint // compaction's record of (time, revision)

	gen    map[string]uint64 // resource → bumped when a key appears or goes; under mu
	sortMu sync.Mutex
	sorted map[string]sortedKeys // resource → keys in list order
}

type sortedKeys struct {
	gen  uint64
	keys []store.Key
}

type checkpoint struct {
	at  time.Time
	rev int64
}

// Open opens or creates the database at cfg.Path.
func Open(cfg Config) (*Store, error) {
	cfg.defaults()
	if cfg.Path == "" {
		return nil, errors.New("open sqlite store: Config.Path is empty")
	}
	q := url.Values{}
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", "FULL")
	q.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	q.Set("_auto_vacuum", "incremental")
	q.Set("_txlock", "immediate")
	q.Set("_cache_size", "-32000")
	dsn := "file:" + cfg.Path + "?" + q.Encode()
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("create schema: %w", err)
	}
	// Checkpoints run on their own connection (see checkpointLoop) so
	// commits never wait for one.
	if _, err := db.Exec(`PRAGMA wal_autocheckpoint = 0`); err != nil {
		db.Close()
		return nil, fmt.Errorf("turn off automatic checkpoints: %w", err)
	}
	// The writer restarts the log once it outgrows walCheckpointBytes (see
	// writer.boundWAL); this cuts the file back to that size when the log
	// restarts.
	if _, err := db.Exec(fmt.Sprintf(`PRAGMA journal_size_limit = %d`, walCheckpointBytes)); err != nil {
		db.Close()
		return nil, fmt.Errorf("limit write-ahead log size: %w", err)
	}
	rq := url.Values{}
	rq.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	rq.Set("_query_only", "1")
	rq.Set("_txlock", "deferred")
	rdb, err := sql.Open("sqlite3", "file:"+cfg.Path+"?"+rq.Encode())
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open database for reading: %w", err)
	}
	rdb.SetMaxOpenConns(4)
	cq := url.Values{}
	cq.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	cq.Set("_synchronous", "FULL")
	cdb, err := sql.Open("sqlite3", "file:"+cfg.Path+"?"+cq.Encode())
	if err != nil {
		db.Close()
		rdb.Close()
		return nil, fmt.Errorf("open database for checkpoints: %w", err)
	}
	cdb.SetMaxOpenConns(1)
	s := &Store{
		cfg:      cfg,
		db:       db,
		rdb:      rdb,
		cdb:      cdb,
		log:      cfg.Logger,
		ops:      make(chan *op, cfg.MaxBatch*4),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		objs:     map[string]map[store.Key]*state{},
		watchers: watchq.NewSet[*watcher](),
		gen:      map[string]uint64{},
		sorted:   map[string]sortedKeys{},
	}
	if err := s.load(); err != nil {
		db.Close()
		rdb.Close()
		cdb.Close()
		return nil, err
	}
	s.ring = eventring.New(s.cfg.WatchCache, s.cfg.WatchCacheBytes, s.rev)
	w, err := newWriter(s)
	if err != nil {
		db.Close()
		rdb.Close()
		cdb.Close()
		return nil, err
	}
	go w.run()
	s.bg.Go(s.checkpointLoop)
	return s, nil
}

func (s *Store) load() error {
	if err := s.db.QueryRow(`SELECT v FROM meta WHERE k = 'rev'`).Scan(&s.rev); err != nil {
		return fmt.Errorf("read revision: %w", err)
	}
	if err := s.db.QueryRow(`SELECT v FROM meta WHERE k = 'compacted'`).Scan(&s.compacted); err != nil {
		return fmt.Errorf("read compacted revision: %w", err)
	}
	var maxLog sql.NullInt64
	if err := s.db.QueryRow(`SELECT max(rev) FROM log`).Scan(&maxLog); err != nil {
		return fmt.Errorf("read newest log revision: %w", err)
	}
	if maxLog.Int64 > s.rev {
		s.rev = maxLog.Int64
	}
	rows, err := s.db.Query(`SELECT o.resource, o.namespace, o.name, l.value, l.labels, l.fields, o.rev
		FROM objects o JOIN log l ON l.rev = o.rev`)
	if err != nil {
		return fmt.Errorf("load objects: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k store.Key
		var st state
		var lb, fb []byte
		if err := rows.Scan(&k.Resource, &k.Namespace, &k.Name, &st.value, &lb, &fb, &st.rev); err != nil {
			return fmt.Errorf("load objects: %w", err)
		}
		if st.value == nil {
			st.value = []byte{}
		}
		if st.labels, err = rowcodec.DecodeMap(lb); err != nil {
			return fmt.Errorf("load labels of %v: %w", k, err)
		}
		if st.fields, err = rowcodec.DecodeMap(fb); err != nil {
			return fmt.Errorf("load fields of %v: %w", k, err)
		}
		s.putLocked(k, &st)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load objects: %w", err)
	}
	return nil
}

func (s *Store) putLocked(k store.Key, st *state) {
	m := s.objs[k.Resource]
	if m == nil {
		m = map[store.Key]*state{}
		s.objs[k.Resource] = m
	}
	if _, ok := m[k]; !ok {
		s.gen[k.Resource]++
	}
	m[k] = st
}

func (s *Store) removeLocked(k store.Key) {
	delete(s.objs[k.Resource], k)
	s.gen[k.Resource]++
}

func (s *Store) getLocked(k store.Key) *state {
	return s.objs[k.Resource][k]
}

// Revision returns the revision of the newest acknowledged write.
func (s *Store) Revision() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rev
}

// CompactedRevision returns the newest revision no longer in the change log.
func (s *Store) CompactedRevision() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.compacted
}

// Close flushes queued writes, ends all watches with store.ErrClosed and
// closes the database.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.sendMu.Lock()
		s.sendClosed = true
		s.sendMu.Unlock()
		close(s.quit)
		<-s.done
		s.bg.Wait()
		s.mu.Lock()
		s.closed = true
		for w := range s.watchers.All() {
			w.End(store.ErrClosed)
			s.watchers.Remove(w)
		}
		s.mu.Unlock()
		if _, err := s.cdb.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
			s.log.Warn("checkpoint on close", "err", err)
		}
		err1 := s.rdb.Close()
		err2 := s.cdb.Close()
		err3 := s.db.Close()
		if err := errors.Join(err1, err2, err3); err != nil {
			s.closeErr = fmt.Errorf("close database: %w", err)
		}
	})
	return s.closeErr
}

func objectOf(k store.Key, st *state) store.Object {
	return store.Object{
		Key:      k,
		Value:    append([]byte{}, st.value...),
		Labels:   cloneMap(st.labels),
		Fields:   cloneMap(st.fields),
		Revision: st.rev,
	}
}

// viewOf shares st's value and maps; events hold views and watchers copy
// them on delivery.
func viewOf(k store.Key, st *state) store.Object {
	return store.Object{Key: k, Value: st.value, Labels: st.labels, Fields: st.fields, Revision: st.rev}
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	return maps.Clone(m)
}

func cloneObject(o store.Object) store.Object {
	o.Value = append([]byte{}, o.Value...)
	o.Labels = cloneMap(o.Labels)
	o.Fields = cloneMap(o.Fields)
	return o
}

// Get returns the current state of one object.
func (s *Store) Get(ctx context.Context, key store.Key) (store.Object, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return store.Object{}, store.ErrClosed
	}
	st := s.getLocked(key)
	if st == nil {
		return store.Object{}, fmt.Errorf("get %v: %w", key, store.ErrNotFound)
	}
	return objectOf(key, st), nil
}

// checkpointLoop copies the write-ahead log into the database file in the
// background, every second while writes come. Passive checkpoints never
// block the writer; the log restarts from its beginning once a checkpoint
// has caught up, which under sustained writes only the writer's own
// restart (see writer.boundWAL) achieves.
func (s *Store) checkpointLoop() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last int64 = -1
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
		}
		rev := s.Revision()
		if rev == last {
			continue
		}
		last = rev
		s.ckptMu.Lock()
		_, err := s.cdb.Exec(`PRAGMA wal_checkpoint(PASSIVE)`)
		s.ckptMu.Unlock()
		if err != nil {
			s.log.Warn("checkpoint write-ahead log", "err", err)
		}
	}
}
