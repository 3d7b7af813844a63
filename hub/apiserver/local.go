package apiserver

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/tether-edge/tether/hub/auth"
)

type localUserKey struct{}

// LocalTransport returns a RoundTripper that serves each request by
// calling the server's handler in this process, as user u: the hub's own
// controllers and scheduler are API clients like any other (same
// validation, admission, authorization, watches and metrics) without
// paying for TLS, HTTP/2 framing and the loopback socket on every call.
// Use it as rest.Config.Transport, with no TLS settings.
func (s *Server) LocalTransport(u *auth.User) http.RoundTripper {
	return &localTransport{h: s.Handler(), user: u}
}

type localTransport struct {
	h    http.Handler
	user *auth.User
}

// localUser returns the user a request of LocalTransport carries; only
// code in this process can put it in a request's context.
func localUser(ctx context.Context) *auth.User {
	u, _ := ctx.Value(localUserKey{}).(*auth.User)
	return u
}

func (t *localTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(context.WithValue(req.Context(), localUserKey{}, t.user))
	r := req.Clone(ctx)
	r.RequestURI = req.URL.RequestURI()
	r.RemoteAddr = "local"
	if r.Body == nil {
		r.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &localResponse{header: make(http.Header), pw: pw, req: req, ready: make(chan struct{})}
	w.body = &localBody{PipeReader: pr, cancel: cancel}
	go func() {
		defer func() {
			p := recover()
			if p != nil && p != http.ErrAbortHandler {
				panic(p)
			}
			w.finish(p != nil)
		}()
		t.h.ServeHTTP(w, r)
	}()
	select {
	case <-w.ready:
		return w.resp, nil
	case <-req.Context().Done():
		cancel()
		pr.Close()
		return nil, req.Context().Err()
	}
}

// localBody is a response body; closing it ends the request's context, so
// a handler still writing (a watch) stops.
type localBody struct {
	*io.PipeReader
	cancel context.CancelFunc
}

func (b *localBody) Close() error {
	b.cancel()
	return b.PipeReader.Close()
}

// localResponse is the handler's side: the header is sent on the first
// WriteHeader, Write or Flush, and the body streams through a pipe that
// the client reads at its own pace.
type localResponse struct {
	header http.Header
	pw     *io.PipeWriter
	req    *http.Request
	body   *localBody

	once    sync.Once
	ready   chan struct{}
	resp    *http.Response
	discard bool // a response without a body: writes go nowhere
}

func (w *localResponse) Header() http.Header { return w.header }

func (w *localResponse) WriteHeader(code int) {
	w.once.Do(func() {
		h := w.header.Clone()
		n := int64(-1)
		if v := h.Get("Content-Length"); v != "" {
			if c, err := strconv.ParseInt(v, 10, 64); err == nil {
				n = c
			}
		}
		w.resp = &http.Response{
			Status:        strconv.Itoa(code) + " " + http.StatusText(code),
			StatusCode:    code,
			Proto:         "HTTP/1.1",
			ProtoMajor:    1,
			ProtoMinor:    1,
			Header:        h,
			Body:          w.body,
			ContentLength: n,
			Request:       w.req,
		}
		if w.req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified {
			w.resp.Body = http.NoBody
			w.discard = true
		}
		close(w.ready)
	})
}

func (w *localResponse) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.discard {
		return len(p), nil
	}
	return w.pw.Write(p)
}

func (w *localResponse) Flush() { w.WriteHeader(http.StatusOK) }

// finish ends the body once the handler returns; an aborted handler ends
// it with an error, as a connection cut in the middle of a body would.
func (w *localResponse) finish(aborted bool) {
	w.WriteHeader(http.StatusOK)
	if w.discard {
		w.body.cancel()
		w.pw.Close()
		return
	}
	if aborted {
		w.pw.CloseWithError(errors.New("apiserver: handler aborted the response"))
		return
	}
	w.pw.Close()
}
