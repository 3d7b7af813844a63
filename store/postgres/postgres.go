// Package postgres implements [store.Store] on a PostgreSQL database, so that
// the hub's state can live on a managed database server rather than in a
// local SQLite file.
//
// # Tables
//
// tether_log is the change log, keyed by revision: one row per write with the
// key, the new value, labels and fields (NULL for deletions) and the revision
// of the key's previous state. tether_objects maps each live key to the log
// row holding its current state, so a value is written once; its primary key
// (resource, namespace, name), in byte order, serves lists by resource and
// namespace and paging, and its unique index on rev lets compaction tell
// current rows apart. tether_counter is a single row holding the current and
// the compacted revision; tether_meta holds the schema version and the
// cluster id. Nothing reads the log by scanning it: watch replay and the
// change feed read revision ranges by primary key, compaction deletes
// revision ranges and looks up successors through the prev_rev index.
//
// # Sequencing
//
// Every write transaction first takes one transaction-level advisory lock
// (pg_advisory_xact_lock), then reads the counter, checks its operations
// against the current state, writes its log rows with the next revisions and
// moves the counter. The lock is held until commit, and PostgreSQL makes a
// commit visible before it releases the transaction's locks, so the next
// writer, whichever server it runs on, sees every earlier revision when it
// draws its own: revision order is commit order and the log has no gaps.
// A reader that sees revision n therefore sees everything below n, which is
// what lets a watch follow the log from its last seen revision without
// waiting for stragglers. kine instead takes revisions from an
// auto-increment sequence outside any lock; sequences hand out numbers at
// insert time, not commit time, so with two writers a higher id can become
// visible before a lower one, and a lower one can vanish in a rollback:
// watchers must poll and guess how long a gap may stay open.
//
// The alternative is a leader: one server elected to draw all revisions,
// the others forwarding writes to it. That needs an election, forwarding
// and fencing of a deposed leader, and a write waits for the leader's
// round trip anyway. The advisory lock gives the same total order with
// nothing but the database. Its cost: writes are serialised on the
// database, one transaction at a time for the whole cluster, so write
// throughput is bounded by one transaction's latency (lock, a few
// statements, commit with its WAL flush). Each server therefore batches the
// operations queued meanwhile into one transaction (group commit), as the
// SQLite backend does; reads and watches take no lock at all.
//
// # Watches
//
// A writer's transaction ends with pg_notify carrying its newest revision.
// Each Store holds one LISTEN connection; a notification (or a local commit)
// wakes its feed, which reads the log above the last revision it has seen,
// in revision order, and fans the events out in memory to the watchers, as
// the SQLite backend does. A notification is only a wake-up: the log is the
// truth, so a missed or coalesced notification loses nothing, and nothing
// polls. A watch starting below the feed's recent events replays the log in
// one snapshot first.
//
// # Failures
//
// Open refuses, and writes nothing, when the server cannot be reached, when
// the database holds another cluster's data (tether_meta's cluster id
// differs from Config.ClusterID) or a schema newer than this binary's.
// While the database is unreachable operations fail with
// store.ErrUnavailable; the pool reconnects on its own and the feed resumes
// from its last revision once the database is back, so watches continue
// without a gap. A write whose commit was cut off is reported as failed but
// may have been committed, as with any remote database.
package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/eventring"
	"github.com/tether-edge/tether/store/internal/rowcodec"
	"github.com/tether-edge/tether/store/internal/watchq"
)

var _ store.Store = (*Store)(nil)

// Config configures a Store. Only DSN is required.
type Config struct {
	// DSN is a postgres:// URL or a key=value connection string.
	DSN string
	// ClusterID identifies the cluster whose data the database holds. An
	// empty database records it (a random one when empty); a database
	// holding another id is refused. Empty accepts any.
	ClusterID string
	// NewClusterID is the id an empty database records when ClusterID is
	// empty; "" means a random one. A used database is not checked
	// against it: ClusterID says which id it tells after Open.
	NewClusterID string
	// MaxConns caps the connection pool; zero means 10. One more
	// connection listens for notifications.
	MaxConns int32
	// ConnectTimeout bounds each connection attempt; zero means 5 seconds.
	ConnectTimeout time.Duration
	// WriteTimeout bounds one write transaction, lock wait included; zero
	// means 30 seconds.
	WriteTimeout time.Duration
	// MaxBatch caps the operations committed in one transaction; zero means 256.
	MaxBatch int
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
	if c.MaxConns <= 0 {
		c.MaxConns = 10
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 5 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 30 * time.Second
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 256
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

// SchemaVersion is the version of the tables this package reads and writes.
const SchemaVersion = 1

// writeLock is the advisory lock every write transaction takes; advisory
// locks are scoped to one database.
const writeLock int64 = 0x7465746865720001 // "tether" and 1

// notifyChannel carries the newest revision of each commit.
const notifyChannel = "tether_log"

const schema = `
CREATE TABLE tether_meta (k text COLLATE "C" PRIMARY KEY, v text NOT NULL);
CREATE TABLE tether_counter (
	id int PRIMARY KEY CHECK (id = 1),
	rev bigint NOT NULL,
	compacted bigint NOT NULL
);
INSERT INTO tether_counter VALUES (1, 0, 0);
CREATE TABLE tether_log (
	rev bigint PRIMARY KEY,
	type smallint NOT NULL,
	resource text COLLATE "C" NOT NULL,
	namespace text COLLATE "C" NOT NULL,
	name text COLLATE "C" NOT NULL,
	value bytea,
	labels bytea,
	fields bytea,
	prev_rev bigint NOT NULL
);
CREATE INDEX tether_log_prev ON tether_log (prev_rev) WHERE prev_rev > 0;
CREATE TABLE tether_objects (
	resource text COLLATE "C" NOT NULL,
	namespace text COLLATE "C" NOT NULL,
	name text COLLATE "C" NOT NULL,
	rev bigint NOT NULL,
	PRIMARY KEY (resource, namespace, name)
);
CREATE UNIQUE INDEX tether_objects_rev ON tether_objects (rev);
`

// Store is a PostgreSQL-backed store.Store. Create it with Open.
type Store struct {
	cfg       Config
	pool      *pgxpool.Pool
	connCfg   *pgx.ConnConfig
	log       *slog.Logger
	clusterID string

	rev       atomic.Int64 // newest revision acknowledged or seen
	compacted atomic.Int64

	ops  chan *op
	quit chan struct{}
	done chan struct{} // writer ended
	wake chan struct{} // the feed has something to read
	bg   sync.WaitGroup
	// stop ends the feed and the listener.
	stop context.CancelFunc
	ctx  context.Context

	closeOnce  sync.Once
	closeErr   error
	sendMu     sync.RWMutex
	sendClosed bool
	closed     atomic.Bool

	mu       sync.Mutex
	feedRev  int64                 // newest revision the feed published
	ring     *eventring.Ring       // recent events
	watchers *watchq.Set[*watcher] // every watch, routed by a field's value

	checkpoints []checkpoint // compaction's record of (time, revision); compaction goroutine only
}

type checkpoint struct {
	at  time.Time
	rev int64
}

// Open connects to the database, creates the tables in an empty one and
// checks that a used one belongs to cfg.ClusterID and has a schema this
// package knows.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	cfg.defaults()
	if cfg.DSN == "" {
		return nil, errors.New("open postgres store: Config.DSN is empty")
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("parse postgres DSN: %w", redact(err))
	}
	pcfg.MaxConns = cfg.MaxConns
	pcfg.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	// pgx prepares statements, and PostgreSQL may switch a prepared
	// statement to a generic plan made while the tables were small: a
	// sequential scan of the log or the objects, kept as they grow. Plans
	// made for each execution's parameters and the tables' current size
	// use the indexes.
	pcfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	pcfg.HealthCheckPeriod = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres pool: %w", err)
	}
	s := &Store{
		cfg:      cfg,
		pool:     pool,
		connCfg:  pcfg.ConnConfig,
		log:      cfg.Logger,
		ops:      make(chan *op, cfg.MaxBatch*4),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		wake:     make(chan struct{}, 1),
		watchers: watchq.NewSet[*watcher](),
	}
	if err := s.prepare(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.ring = eventring.New(s.cfg.WatchCache, s.cfg.WatchCacheBytes, s.rev.Load())
	s.feedRev = s.rev.Load()
	w := &writer{s: s}
	go w.run()
	s.bg.Go(s.listen)
	s.bg.Go(s.feed)
	s.bg.Go(s.compactLoop)
	return s, nil
}

// redact drops a DSN's password from a parse error.
func redact(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New(pe.Error())
	}
	return err
}

// prepare checks or creates the schema under the write lock, so that two
// servers opening one empty database do not both create it.
func (s *Store) prepare(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("connect to postgres: %w", unavailable(err))
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin schema check: %w", unavailable(err))
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, writeLock); err != nil {
		return fmt.Errorf("lock schema: %w", unavailable(err))
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('tether_meta') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("look for tether's tables: %w", unavailable(err))
	}
	if !exists {
		var other bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('tether_log') IS NOT NULL OR to_regclass('tether_objects') IS NOT NULL`).Scan(&other); err != nil {
			return fmt.Errorf("look for tether's tables: %w", unavailable(err))
		}
		if other {
			return errors.New("open postgres store: the database holds tether tables but no tether_meta; refusing to use it")
		}
		id := s.cfg.ClusterID
		if id == "" {
			id = s.cfg.NewClusterID
		}
		if id == "" {
			b := make([]byte, 16)
			rand.Read(b)
			id = hex.EncodeToString(b)
		}
		if _, err := tx.Exec(ctx, schema); err != nil {
			return fmt.Errorf("create schema: %w", unavailable(err))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO tether_meta VALUES ('schema_version', $1), ('cluster_id', $2)`, strconv.Itoa(SchemaVersion), id); err != nil {
			return fmt.Errorf("record schema version: %w", unavailable(err))
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("commit schema: %w", unavailable(err))
		}
		s.clusterID = id
		return nil
	}
	meta := map[string]string{}
	rows, err := tx.Query(ctx, `SELECT k, v FROM tether_meta`)
	if err != nil {
		return fmt.Errorf("read tether_meta: %w", unavailable(err))
	}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return fmt.Errorf("read tether_meta: %w", unavailable(err))
		}
		meta[k] = v
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read tether_meta: %w", unavailable(err))
	}
	ver, err := strconv.Atoi(meta["schema_version"])
	if err != nil {
		return fmt.Errorf("open postgres store: schema version %q unreadable", meta["schema_version"])
	}
	if ver > SchemaVersion {
		return fmt.Errorf("open postgres store: the database has schema version %d, newer than this tether's %d; run a newer tether", ver, SchemaVersion)
	}
	if id := meta["cluster_id"]; s.cfg.ClusterID != "" && id != s.cfg.ClusterID {
		return fmt.Errorf("open postgres store: the database holds cluster %s, not this hub's cluster %s; refusing to mix their data", id, s.cfg.ClusterID)
	}
	s.clusterID = meta["cluster_id"]
	var rev, compacted int64
	if err := tx.QueryRow(ctx, `SELECT rev, compacted FROM tether_counter WHERE id = 1`).Scan(&rev, &compacted); err != nil {
		return fmt.Errorf("read revision: %w", unavailable(err))
	}
	s.rev.Store(rev)
	s.compacted.Store(compacted)
	return nil
}

// ClusterID returns the id of the cluster whose data the database holds.
func (s *Store) ClusterID() string { return s.clusterID }

// unavailable marks errors that mean the database cannot be reached with
// store.ErrUnavailable; other errors are returned as they are.
func unavailable(err error) error {
	if err == nil || errors.Is(err, store.ErrUnavailable) {
		return err
	}
	if isUnavailable(err) {
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return err
}

func isUnavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Class 08: connection exception; 57P01-57P03: shutdown, crash
		// shutdown, cannot connect now; 53300: too many connections.
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P0") || pgErr.Code == "53300"
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	switch {
	case errors.As(err, &ce), errors.As(err, &ne),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ENOENT),
		errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err):
		return true
	}
	return strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "conn busy")
}

// noteRev raises the revision to at least r.
func (s *Store) noteRev(r int64) {
	for {
		cur := s.rev.Load()
		if r <= cur || s.rev.CompareAndSwap(cur, r) {
			return
		}
	}
}

func (s *Store) noteCompacted(r int64) {
	for {
		cur := s.compacted.Load()
		if r <= cur || s.compacted.CompareAndSwap(cur, r) {
			return
		}
	}
}

// Revision returns the newest revision this store wrote or saw.
func (s *Store) Revision() int64 { return s.rev.Load() }

// CompactedRevision returns the newest revision no longer in the change log.
func (s *Store) CompactedRevision() int64 { return s.compacted.Load() }

// Close flushes queued writes, ends all watches with store.ErrClosed and
// closes the pool.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.sendMu.Lock()
		s.sendClosed = true
		s.sendMu.Unlock()
		close(s.quit)
		<-s.done
		s.closed.Store(true)
		s.stop()
		s.bg.Wait()
		s.mu.Lock()
		for w := range s.watchers.All() {
			w.End(store.ErrClosed)
			s.watchers.Remove(w)
		}
		s.mu.Unlock()
		s.pool.Close()
	})
	return s.closeErr
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

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Get returns the current state of one object.
func (s *Store) Get(ctx context.Context, key store.Key) (store.Object, error) {
	if s.closed.Load() {
		return store.Object{}, store.ErrClosed
	}
	o := store.Object{Key: key}
	var lb, fb []byte
	err := s.pool.QueryRow(ctx, `SELECT l.value, l.labels, l.fields, o.rev
		FROM tether_objects o JOIN tether_log l ON l.rev = o.rev
		WHERE o.resource = $1 AND o.namespace = $2 AND o.name = $3`,
		key.Resource, key.Namespace, key.Name).Scan(&o.Value, &lb, &fb, &o.Revision)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Object{}, fmt.Errorf("get %v: %w", key, store.ErrNotFound)
	}
	if err != nil {
		if s.closed.Load() {
			return store.Object{}, store.ErrClosed
		}
		return store.Object{}, fmt.Errorf("get %v: %w", key, unavailable(err))
	}
	o.Value = nonNil(o.Value)
	if o.Labels, err = rowcodec.DecodeMap(lb); err != nil {
		return store.Object{}, fmt.Errorf("get labels of %v: %w", key, err)
	}
	if o.Fields, err = rowcodec.DecodeMap(fb); err != nil {
		return store.Object{}, fmt.Errorf("get fields of %v: %w", key, err)
	}
	s.noteRev(o.Revision)
	return o, nil
}
