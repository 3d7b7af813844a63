package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"gopkg.in/natefinch/lumberjack.v2"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

// Options configure a Log, as kube-apiserver's --audit-log-* flags do.
type Options struct {
	// Path is the log file; "-" writes to standard output. Required.
	Path string
	// PolicyFile is an audit.k8s.io/v1 Policy; "" logs every request at
	// Metadata level (DefaultPolicy).
	PolicyFile string
	// MaxSizeMB is the size in megabytes at which the file is rotated;
	// zero means lumberjack's default, 100.
	MaxSizeMB int
	// MaxBackups is how many rotated files are kept; zero keeps all
	// (subject to MaxAgeDays).
	MaxBackups int
	// MaxAgeDays is how many days rotated files are kept; zero keeps them
	// regardless of age.
	MaxAgeDays int
	// Compress gzips rotated files.
	Compress bool
	// Logger reports write errors; nil means slog.Default().
	Logger *slog.Logger
}

// queueLen bounds the events waiting to be written; a full queue makes
// requests wait rather than lose events.
const queueLen = 8192

// syncInterval is how often written events are forced to disk.
const syncInterval = time.Second

// Log is an audit log. Record queues an event and returns; one goroutine
// encodes queued events and writes them in batches (one write per batch,
// a batch being whatever queued up while the previous one was written),
// so requests pay for a channel send, not for encoding or I/O. Written
// events are fsynced at most once a second, and on Close.
//
// What a crash loses: on kill -9 of the hub, the events still queued (not
// yet written: in practice those of requests that completed within the
// last milliseconds); everything written is in the kernel's page cache and
// survives. On power loss, additionally up to one second of written
// events (the sync interval). Close (at hub shutdown, after the API has
// stopped serving) writes every queued event and syncs.
type Log struct {
	policy *Policy
	out    io.WriteCloser
	path   string
	log    *slog.Logger
	queue  chan *auditv1.Event
	done   chan struct{}
	once   sync.Once
	// mu guards closed against Record after Close.
	mu     sync.RWMutex
	closed bool
}

// New opens the log of o and starts its writer; it fails when the policy
// file is malformed or the file cannot be created.
func New(o Options) (*Log, error) {
	if o.Path == "" {
		return nil, fmt.Errorf("open audit log: no path")
	}
	policy := DefaultPolicy()
	if o.PolicyFile != "" {
		p, err := LoadPolicyFile(o.PolicyFile)
		if err != nil {
			return nil, fmt.Errorf("load audit policy: %w", err)
		}
		policy = p
	}
	l := &Log{policy: policy, log: o.Logger, queue: make(chan *auditv1.Event, queueLen), done: make(chan struct{})}
	if l.log == nil {
		l.log = slog.Default()
	}
	if o.Path == "-" {
		l.out = nopCloser{os.Stdout}
	} else {
		if err := os.MkdirAll(filepath.Dir(o.Path), 0o700); err != nil {
			return nil, fmt.Errorf("create audit log directory: %w", err)
		}
		f, err := os.OpenFile(o.Path, os.O_CREATE|os.O_APPEND|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open audit log: %w", err)
		}
		_ = f.Close()
		l.path = o.Path
		l.out = &lumberjack.Logger{Filename: o.Path, MaxSize: o.MaxSizeMB, MaxBackups: o.MaxBackups,
			MaxAge: o.MaxAgeDays, Compress: o.Compress}
	}
	go l.run()
	return l, nil
}

// Evaluate returns the policy's decision for a.
func (l *Log) Evaluate(a *Attributes) Decision { return l.policy.Evaluate(a) }

// Record queues ev for writing; ev must not be changed afterwards. It
// blocks only while the queue is full.
func (l *Log) Record(ev *auditv1.Event) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return
	}
	l.queue <- ev
}

// Close writes the queued events, syncs and closes the file.
func (l *Log) Close() error {
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		close(l.queue)
		l.mu.Unlock()
	})
	<-l.done
	return nil
}

func (l *Log) run() {
	defer close(l.done)
	var batch, one bytes.Buffer
	enc := json.NewEncoder(&one)
	enc.SetEscapeHTML(false)
	tick := time.NewTicker(syncInterval)
	defer tick.Stop()
	dirty := false
	// add encodes ev into the batch, writing the batch first when ev
	// would take it over batchBytes: lumberjack refuses any single write
	// larger than its maximum file size.
	add := func(ev *auditv1.Event) {
		one.Reset()
		ev.TypeMeta.Kind, ev.TypeMeta.APIVersion = "Event", auditv1.SchemeGroupVersion.String()
		if err := enc.Encode(ev); err != nil {
			l.log.Error("audit: encode event", "error", err, "auditID", ev.AuditID)
			return
		}
		if batch.Len() > 0 && batch.Len()+one.Len() > batchBytes {
			l.write(&batch)
		}
		batch.Write(one.Bytes())
	}
	for {
		select {
		case ev, ok := <-l.queue:
			if !ok {
				if dirty {
					l.sync()
				}
				_ = l.out.Close()
				return
			}
			add(ev)
		drain:
			for {
				select {
				case ev, ok := <-l.queue:
					if !ok {
						break drain
					}
					add(ev)
				default:
					break drain
				}
			}
			l.write(&batch)
			dirty = true
		case <-tick.C:
			if dirty {
				l.sync()
				dirty = false
			}
		}
	}
}

// batchBytes bounds one write of queued events.
const batchBytes = 256 << 10

func (l *Log) write(b *bytes.Buffer) {
	if b.Len() == 0 {
		return
	}
	if _, err := l.out.Write(b.Bytes()); err != nil {
		l.log.Error("audit: write log", "error", err)
	}
	b.Reset()
}

// sync forces the current file to disk; lumberjack has no Sync, and any
// descriptor of a file syncs its data.
func (l *Log) sync() {
	if l.path == "" {
		return
	}
	f, err := os.Open(l.path)
	if err != nil {
		return
	}
	if err := f.Sync(); err != nil {
		l.log.Warn("audit: sync log", "error", err)
	}
	_ = f.Close()
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
