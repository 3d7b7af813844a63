package containerd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
)

// Container logs are files in the CRI log format, one line per line of
// output:
//
//	2026-01-02T15:04:05.999999999Z stdout F the line
//
// "P" instead of "F" marks a partial line (longer than the line buffer,
// or output that ended without a newline). A log is rotated to
// <file>.1, <file>.2, ... when it reaches the size limit.

const maxLogLine = 16 << 10

func (r *Runtime) podLogDir(p *pod) string {
	return filepath.Join(r.logsDir, p.namespace+"_"+p.name+"_"+string(p.uid))
}

func (r *Runtime) logPath(p *pod, container string, attempt int32) string {
	return filepath.Join(r.podLogDir(p), container, strconv.Itoa(int(attempt))+".log")
}

func removeLogs(path string) {
	matches, _ := filepath.Glob(path + "*")
	for _, m := range matches {
		_ = os.Remove(m)
	}
}

// logWriter appends a container's output to its log and copies it to
// attached clients.
type logWriter struct {
	path     string
	maxSize  int64
	maxFiles int

	mu      sync.Mutex
	f       *os.File
	size    int64
	closed  bool
	changed chan struct{} // closed and replaced at every write
	attach  map[*attachment]struct{}
}

// attachment is an attached client's view of the output.
type attachment struct {
	stdout, stderr io.Writer
}

func newLogWriter(path string, maxSize int64, maxFiles int) (*logWriter, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("create log directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open container log: %w", err)
	}
	st, _ := f.Stat()
	return &logWriter{path: path, maxSize: maxSize, maxFiles: maxFiles, f: f, size: st.Size(),
		changed: make(chan struct{}), attach: map[*attachment]struct{}{}}, nil
}

// stream returns the writer of one output stream; it splits output into
// lines.
func (l *logWriter) stream(name string) io.Writer {
	return &lineSplitter{l: l, stream: name}
}

type lineSplitter struct {
	l      *logWriter
	stream string
	buf    []byte
}

func (s *lineSplitter) Write(p []byte) (int, error) {
	n := len(p)
	s.l.forward(s.stream, p)
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			break
		}
		s.l.line(s.stream, "F", s.buf[:i])
		s.buf = s.buf[i+1:]
	}
	for len(s.buf) >= maxLogLine {
		s.l.line(s.stream, "P", s.buf[:maxLogLine])
		s.buf = s.buf[maxLogLine:]
	}
	if len(s.buf) == 0 {
		s.buf = nil
	}
	return n, nil
}

func (l *logWriter) forward(stream string, p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for a := range l.attach {
		w := a.stdout
		if stream == "stderr" && a.stderr != nil {
			w = a.stderr
		}
		if w != nil {
			_, _ = w.Write(p)
		}
	}
}

func (l *logWriter) line(stream, tag string, b []byte) {
	var buf bytes.Buffer
	buf.WriteString(time.Now().UTC().Format(time.RFC3339Nano))
	buf.WriteByte(' ')
	buf.WriteString(stream)
	buf.WriteByte(' ')
	buf.WriteString(tag)
	buf.WriteByte(' ')
	buf.Write(b)
	buf.WriteByte('\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if l.size+int64(buf.Len()) > l.maxSize && l.size > 0 {
		l.rotate()
	}
	n, _ := l.f.Write(buf.Bytes())
	l.size += int64(n)
	close(l.changed)
	l.changed = make(chan struct{})
}

// rotate moves the current file to .1 (and older ones up). l.mu is held.
func (l *logWriter) rotate() {
	_ = l.f.Close()
	for i := l.maxFiles - 1; i >= 1; i-- {
		src := l.path
		if i > 1 {
			src = l.path + "." + strconv.Itoa(i-1)
		}
		_ = os.Rename(src, l.path+"."+strconv.Itoa(i))
	}
	if l.maxFiles <= 1 {
		_ = os.Remove(l.path)
	}
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		l.closed = true
		return
	}
	l.f, l.size = f, 0
}

// Close ends the log; readers following it stop at its end.
func (l *logWriter) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		_ = l.f.Close()
		close(l.changed)
	}
}

func (l *logWriter) subscribe(a *attachment) {
	l.mu.Lock()
	l.attach[a] = struct{}{}
	l.mu.Unlock()
}

func (l *logWriter) unsubscribe(a *attachment) {
	l.mu.Lock()
	delete(l.attach, a)
	l.mu.Unlock()
}

// wait returns a channel closed at the next write or at Close, and
// whether the log is closed.
func (l *logWriter) wait() (<-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed, l.closed
}

// stdinPipe feeds a container's standard input from attached clients; it
// never blocks the container when nobody is attached.
type stdinPipe struct {
	r *io.PipeReader
	w *io.PipeWriter
}

func newStdinPipe() *stdinPipe {
	r, w := io.Pipe()
	return &stdinPipe{r: r, w: w}
}

func (s *stdinPipe) Read(p []byte) (int, error) { return s.r.Read(p) }
func (s *stdinPipe) Close() error               { return s.w.Close() }

// logLine is a parsed CRI log line.
type logLine struct {
	t       time.Time
	stream  string
	partial bool
	msg     []byte
}

func parseLogLine(b []byte) (logLine, bool) {
	parts := bytes.SplitN(b, []byte{' '}, 4)
	if len(parts) < 4 {
		return logLine{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(parts[0]))
	if err != nil {
		return logLine{}, false
	}
	return logLine{t: t, stream: string(parts[1]), partial: string(parts[2]) == "P", msg: parts[3]}, true
}

// ContainerLogs implements edge.Runtime.
func (r *Runtime) ContainerLogs(ctx context.Context, uid types.UID, name string, opts edge.LogOptions, w io.Writer) error {
	p := r.pod(uid)
	if p == nil {
		return fmt.Errorf("pod %s: %w", uid, edge.ErrPodNotFound)
	}
	p.mu.Lock()
	cs := p.find(name)
	var inst *instance
	if cs != nil {
		inst = cs.cur
		if opts.Previous {
			inst = cs.prev
		}
	}
	p.mu.Unlock()
	switch {
	case cs == nil:
		return fmt.Errorf("container %q in pod %s: %w", name, p.key(), edge.ErrContainerNotFound)
	case inst == nil && opts.Previous:
		return fmt.Errorf("previous terminated container %q in pod %s: %w", name, p.key(), edge.ErrContainerNotFound)
	case inst == nil:
		return fmt.Errorf("container %q in pod %s: %w", name, p.key(), edge.ErrContainerWaiting)
	}
	var live *logWriter
	p.mu.Lock()
	if inst.running && opts.Follow {
		live = inst.logs
	}
	p.mu.Unlock()
	return readLog(ctx, inst.logPath, opts, live, w)
}

// readLog writes the log at path as the options select; with live it
// follows the log until it is closed.
func readLog(ctx context.Context, path string, opts edge.LogOptions, live *logWriter, w io.Writer) error {
	lw := &limitWriter{w: w, left: opts.LimitBytes}
	emit := func(l logLine) error {
		if !opts.Since.IsZero() && l.t.Before(opts.Since) {
			return nil
		}
		if opts.Timestamps {
			if _, err := io.WriteString(lw, l.t.Format(time.RFC3339Nano)+" "); err != nil {
				return err
			}
		}
		msg := l.msg
		if !l.partial {
			msg = append(msg[:len(msg):len(msg)], '\n')
		}
		_, err := lw.Write(msg)
		return err
	}
	// Rotated files first, oldest first.
	var files []string
	for i := 9; i >= 1; i-- {
		if _, err := os.Stat(path + "." + strconv.Itoa(i)); err == nil {
			files = append(files, path+"."+strconv.Itoa(i))
		}
	}
	files = append(files, path)
	var lines []logLine
	for _, f := range files[:len(files)-1] {
		b, _ := os.ReadFile(f)
		for _, raw := range bytes.Split(b, []byte{'\n'}) {
			if l, ok := parseLogLine(raw); ok {
				lines = append(lines, l)
			}
		}
	}
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("open container log: %w", err)
	}
	defer func() { f.Close() }()
	br := bufio.NewReaderSize(f, 64<<10)
	var pending []byte
	readAvailable := func(collect bool) error {
		for {
			chunk, err := br.ReadBytes('\n')
			pending = append(pending, chunk...)
			if err != nil {
				return nil // EOF: the rest of the line is not written yet
			}
			l, ok := parseLogLine(bytes.TrimSuffix(pending, []byte{'\n'}))
			pending = nil
			if !ok {
				continue
			}
			if collect {
				lines = append(lines, l)
			} else if err := emit(l); err != nil {
				return err
			}
		}
	}
	_ = readAvailable(true)
	if opts.TailLines >= 0 && int64(len(lines)) > opts.TailLines {
		lines = lines[int64(len(lines))-opts.TailLines:]
	}
	for _, l := range lines {
		if err := emit(l); err != nil {
			return nilIfLimit(err)
		}
	}
	if live == nil {
		return nil
	}
	for {
		ch, closed := live.wait()
		if err := readAvailable(false); err != nil {
			return nilIfLimit(err)
		}
		if closed {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
		case <-time.After(time.Second):
			// The file may have been rotated: follow the new one.
			if st, err := os.Stat(path); err == nil {
				if cur, err := f.Stat(); err == nil && !os.SameFile(st, cur) {
					_ = readAvailable(false)
					f.Close()
					if f, err = os.Open(path); err != nil {
						return nil
					}
					br.Reset(f)
				}
			}
		}
	}
}

var errLimit = errors.New("log limit reached")

func nilIfLimit(err error) error {
	if errors.Is(err, errLimit) {
		return nil
	}
	return err
}

type limitWriter struct {
	w    io.Writer
	left int64 // <= 0: no limit
	set  bool
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.left > 0 || l.set {
		l.set = true
		if l.left <= 0 {
			return 0, errLimit
		}
		if int64(len(p)) > l.left {
			p = p[:l.left]
		}
		l.left -= int64(len(p))
	}
	return l.w.Write(p)
}

// lastLines returns the last n lines of a log (at most max bytes), for
// termination messages taken from the log.
func lastLines(path string, n, max int) string {
	var buf strings.Builder
	_ = readLog(context.Background(), path, edge.LogOptions{TailLines: int64(n)}, nil, &buf)
	s := buf.String()
	if len(s) > max {
		s = s[len(s)-max:]
	}
	return s
}
