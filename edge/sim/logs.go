package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
)

// Simulated containers do not store logs: an instance's log is a function
// of its start, its end and the line interval, so it costs no memory however
// long the container runs. Line 0 is written at start, line k at
// start+k*interval while the instance runs, and a last line at its exit.

// ContainerLogs implements edge.Runtime.
func (r *Runtime) ContainerLogs(ctx context.Context, uid types.UID, name string, opts edge.LogOptions, w io.Writer) error {
	inst, err := r.instanceFor(uid, name, opts.Previous)
	if err != nil {
		return err
	}
	lw := &limitWriter{w: w, left: opts.LimitBytes}
	now := time.Now()
	end := now
	if !inst.end.IsZero() {
		end = inst.end
	}
	last := inst.ticks(end) // index of the last periodic line so far
	total := last + 1
	if !inst.end.IsZero() {
		total++ // the exit line, index last+1
	}
	first := int64(0)
	if opts.TailLines >= 0 && total > opts.TailLines {
		first = total - opts.TailLines
	}
	for k := first; k < total; k++ {
		var err error
		if k <= last {
			err = inst.writeLine(lw, k, opts)
		} else {
			err = inst.writeExit(lw, opts)
		}
		if err != nil {
			return ignoreLimit(err)
		}
	}
	if !inst.end.IsZero() || !opts.Follow {
		return nil
	}
	for k := last + 1; ; k++ {
		var tick <-chan time.Time
		var t *time.Timer
		if inst.interval > 0 {
			t = time.NewTimer(time.Until(inst.lineTime(k)))
			tick = t.C
		}
		stop := func() {
			if t != nil {
				t.Stop()
			}
		}
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-inst.done:
			stop()
			for ; inst.interval > 0 && !inst.lineTime(k).After(inst.end); k++ {
				if err := inst.writeLine(lw, k, opts); err != nil {
					return ignoreLimit(err)
				}
			}
			return ignoreLimit(inst.writeExit(lw, opts))
		case <-tick:
			if err := inst.writeLine(lw, k, opts); err != nil {
				return ignoreLimit(err)
			}
		}
	}
}

func (r *Runtime) instanceFor(uid types.UID, name string, previous bool) (*instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.pods[uid]
	if !ok {
		return nil, fmt.Errorf("pod %s: %w", uid, edge.ErrPodNotFound)
	}
	for _, c := range p.all() {
		if c.name != name {
			continue
		}
		inst := c.cur
		if previous {
			inst = c.prev
			if inst == nil {
				return nil, fmt.Errorf("previous terminated container %q in pod %q: %w", name, p.name, edge.ErrContainerNotFound)
			}
		}
		if inst == nil {
			return nil, fmt.Errorf("container %q in pod %q is waiting to start: %s: %w", name, p.name, c.reason, edge.ErrContainerWaiting)
		}
		return inst, nil
	}
	return nil, fmt.Errorf("container %q in pod %q: %w", name, p.name, edge.ErrContainerNotFound)
}

// ticks returns the index of the last periodic line at or before t.
func (in *instance) ticks(t time.Time) int64 {
	if in.interval <= 0 || t.Before(in.start) {
		return 0
	}
	return int64(t.Sub(in.start) / in.interval)
}

func (in *instance) lineTime(k int64) time.Time {
	return in.start.Add(time.Duration(k) * in.interval)
}

func (in *instance) writeLine(w io.Writer, k int64, opts edge.LogOptions) error {
	at := in.lineTime(k)
	if !opts.Since.IsZero() && at.Before(opts.Since) {
		return nil
	}
	var line string
	if k == 0 {
		line = fmt.Sprintf("sim: container %s started from image %s (restart %d)", in.name, in.image, in.restart)
	} else {
		line = fmt.Sprintf("sim: container %s is running: line %d", in.name, k)
	}
	return writeAt(w, at, line, opts.Timestamps)
}

func (in *instance) writeExit(w io.Writer, opts edge.LogOptions) error {
	if !opts.Since.IsZero() && in.end.Before(opts.Since) {
		return nil
	}
	return writeAt(w, in.end, fmt.Sprintf("sim: container %s exited with code %d", in.name, in.exitCode), opts.Timestamps)
}

func writeAt(w io.Writer, at time.Time, line string, timestamps bool) error {
	if timestamps {
		line = at.UTC().Format(time.RFC3339Nano) + " " + line
	}
	_, err := io.WriteString(w, line+"\n")
	return err
}

// errLimit ends a log once LimitBytes were written.
var errLimit = errors.New("log byte limit reached")

type limitWriter struct {
	w    io.Writer
	left int64 // <= 0: no limit
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.left <= 0 {
		return l.w.Write(p)
	}
	cut := false
	if int64(len(p)) >= l.left {
		p, cut = p[:l.left], true
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	if err == nil && cut {
		err = errLimit
	}
	return n, err
}

func ignoreLimit(err error) error {
	if errors.Is(err, errLimit) {
		return nil
	}
	return err
}
