package apiserver

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
)

// gzipThreshold is the size from which response bodies are compressed for
// clients that accept gzip, as kube-apiserver does; smaller bodies are not
// worth the header and the CPU.
const gzipThreshold = 128 << 10

// gzipWriters holds writers at the fastest level: a list of pods shrinks
// about twenty-fold at a few nanoseconds per byte, which pays on a loopback
// and matters on an edge site's thin link.
var gzipWriters = sync.Pool{New: func() any {
	w, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed)
	return w
}}

// acceptsGzip reports whether the request's Accept-Encoding allows gzip.
func acceptsGzip(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept-Encoding") {
		for _, part := range strings.Split(v, ",") {
			coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			if !strings.EqualFold(strings.TrimSpace(coding), "gzip") {
				continue
			}
			if q, ok := strings.CutPrefix(strings.TrimSpace(params), "q="); ok {
				if f, err := strconv.ParseFloat(q, 64); err == nil && f == 0 {
					return false
				}
			}
			return true
		}
	}
	return false
}

// writeBody sends a response body of size bytes produced by write, with the
// headers already set on w. Bodies from gzipThreshold up go out compressed
// when the client accepts gzip.
func writeBody(w http.ResponseWriter, r *http.Request, code, size int, write func(io.Writer) error) {
	h := w.Header()
	h.Add("Vary", "Accept-Encoding")
	if size < gzipThreshold || !acceptsGzip(r) {
		h.Set("Content-Length", strconv.Itoa(size))
		w.WriteHeader(code)
		_ = write(w)
		return
	}
	h.Set("Content-Encoding", "gzip")
	w.WriteHeader(code)
	gz := gzipWriters.Get().(*gzip.Writer)
	gz.Reset(w)
	// The compressor emits blocks of its own size; a buffer in front of
	// it keeps small writes of the producer from reaching it one by one.
	bw := bufio.NewWriterSize(gz, 32<<10)
	if write(bw) == nil && bw.Flush() == nil {
		_ = gz.Close()
	}
	gz.Reset(io.Discard)
	gzipWriters.Put(gz)
}
