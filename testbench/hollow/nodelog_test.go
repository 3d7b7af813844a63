package hollow_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// nodeLogs keeps the logs of a few chosen hollow nodes, so that a wait
// that fails on one of them can show what that node did. The fleet's
// logger passes every agent's node name with With("node", name); the
// handler keeps records only below a chosen name.
type nodeLogs struct {
	mu    sync.Mutex
	keep  map[string]bool
	lines map[string]*bytes.Buffer
}

func newNodeLogs(names ...string) *nodeLogs {
	l := &nodeLogs{keep: map[string]bool{}, lines: map[string]*bytes.Buffer{}}
	for _, n := range names {
		l.keep[n] = true
		l.lines[n] = &bytes.Buffer{}
	}
	return l
}

// Logger returns the logger to give the fleet.
func (l *nodeLogs) Logger() *slog.Logger { return slog.New(&nodeHandler{logs: l}) }

// Of returns what node logged so far.
func (l *nodeLogs) Of(node string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.lines[node]; b != nil {
		return b.String()
	}
	return ""
}

// nodeHandler is the slog.Handler behind nodeLogs.Logger: until it learns
// its node it drops everything; then it formats the kept nodes' records
// as text.
type nodeHandler struct {
	logs  *nodeLogs
	node  string
	attrs []slog.Attr
}

func (h *nodeHandler) Enabled(context.Context, slog.Level) bool {
	return h.node != "" && h.logs.keep[h.node]
}

func (h *nodeHandler) Handle(_ context.Context, r slog.Record) error {
	if !h.Enabled(context.Background(), r.Level) {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  %s %s %s", r.Time.UTC().Format("15:04:05.000"), r.Level, r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s", a)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s", a)
		return true
	})
	b.WriteByte('\n')
	h.logs.mu.Lock()
	h.logs.lines[h.node].WriteString(b.String())
	h.logs.mu.Unlock()
	return nil
}

func (h *nodeHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), attrs...)
	for _, a := range attrs {
		if a.Key == "node" && c.node == "" {
			c.node = a.Value.String()
		}
	}
	return &c
}

func (h *nodeHandler) WithGroup(string) slog.Handler { return h }

// describePod says where a pod that is not running stands: its phase,
// conditions and node, what its node logged and what the hub logged of it.
func describePod(p *corev1.Pod, logs *nodeLogs, hubLogs string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod %s on %q: phase %q, resourceVersion %s", p.Name, p.Spec.NodeName, p.Status.Phase, p.ResourceVersion)
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, "; %s=%s", c.Type, c.Status)
	}
	fmt.Fprintf(&b, "\n  its node's log:\n%s  the hub's lines that name it or its node:\n", logs.Of(p.Spec.NodeName))
	for _, line := range strings.Split(hubLogs, "\n") {
		if strings.Contains(line, p.Name) || strings.Contains(line, p.Spec.NodeName) {
			fmt.Fprintf(&b, "  %s\n", line)
		}
	}
	return b.String()
}
