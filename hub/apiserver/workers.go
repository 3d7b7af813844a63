package apiserver

import (
	"net/http"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// maxWorkers bounds the goroutines that stay around to run writes.
const maxWorkers = 64

// workers runs request handling on goroutines kept between requests. The
// HTTP server starts a goroutine per request with a small stack, and a
// write (JSON and protobuf decoding, patches, managed fields, encoding)
// recurses deep enough to grow it several times, copying it each time;
// a kept goroutine has grown its stack already. When every kept goroutine
// is busy and no more may be started, the handler runs where it was
// called, as without workers.
type workers struct {
	work chan func()
	n    atomic.Int32
}

func newWorkers() *workers {
	return &workers{work: make(chan func())}
}

// workerPanic carries a panic out of a worker, with the worker's stack.
type workerPanic struct {
	value any
	stack []byte
}

// run runs fn on a kept goroutine and waits for it. A panic in fn is
// raised again in the caller: http.ErrAbortHandler as itself, anything
// else as a *workerPanic holding the worker's stack.
func (p *workers) run(fn func()) {
	done := make(chan *workerPanic, 1)
	job := func() {
		defer func() {
			if v := recover(); v != nil {
				wp := &workerPanic{value: v}
				if v != http.ErrAbortHandler {
					wp.stack = debug.Stack()
				}
				done <- wp
				return
			}
			done <- nil
		}()
		fn()
	}
	select {
	case p.work <- job:
	default:
		if p.n.Add(1) > maxWorkers {
			p.n.Add(-1)
			fn()
			return
		}
		go p.worker(job)
	}
	if wp := <-done; wp != nil {
		if wp.value == http.ErrAbortHandler {
			panic(wp.value)
		}
		panic(wp)
	}
}

// workerIdle is how long a kept goroutine waits for work before it ends.
const workerIdle = 10 * time.Second

func (p *workers) worker(job func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		job()
		idle.Reset(workerIdle)
		select {
		case job = <-p.work:
		case <-idle.C:
			p.n.Add(-1)
			return
		}
	}
}

// pooled reports whether a request is handled on a worker: writes, which
// are short; not watches or upgraded streams (exec, attach, port
// forwarding), which would hold a worker for as long as they last.
func pooled(r *http.Request) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return r.Header.Get("Upgrade") == ""
	}
	return false
}
