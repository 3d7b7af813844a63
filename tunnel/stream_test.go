package tunnel

import (
	"bytes"
	"io"
	"sync"
	"testing"
	"time"
)

// orderStream is a rawStream that records what is written, in order, and
// takes its time over a preamble, as a stream short of flow-control credit
// does.
type orderStream struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *orderStream) Read([]byte) (int, error)         { return 0, io.EOF }
func (s *orderStream) rawRead([]byte) (int, error)      { return 0, io.EOF }
func (s *orderStream) rawWrite(p []byte) (int, error)   { return s.Write(p) }
func (s *orderStream) closeWrite() error                { return nil }
func (s *orderStream) abort(uint64)                     {}
func (s *orderStream) stopReading(uint64)               {}
func (s *orderStream) SetDeadline(time.Time) error      { return nil }
func (s *orderStream) SetReadDeadline(time.Time) error  { return nil }
func (s *orderStream) SetWriteDeadline(time.Time) error { return nil }
func (s *orderStream) writeWithPreamble(pre, p []byte) error {
	time.Sleep(time.Millisecond)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(pre)
	s.buf.Write(p)
	return nil
}

func (s *orderStream) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

// TestLazyPreambleGoesFirst: an HTTP client reads a new conn (its read
// loop) while it writes the request; the read sends the preamble, and the
// request must follow it, never precede it.
func TestLazyPreambleGoesFirst(t *testing.T) {
	pre := appendFrame(nil, frameOpen, nil)
	for range 200 {
		st := &orderStream{}
		c := &streamConn{raw: st, pending: appendFrame(nil, frameOpen, nil)}
		c.lazy.Store(true)
		var wg sync.WaitGroup
		wg.Go(func() { c.Read(make([]byte, 1)) })
		time.Sleep(100 * time.Microsecond) // the read is in its preamble
		if _, err := c.Write([]byte("GET /")); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if got := st.buf.Bytes(); !bytes.HasPrefix(got, pre) || !bytes.Equal(got[len(pre):], []byte("GET /")) {
			t.Fatalf("stream carries %q, want the preamble %q, then the request", got, pre)
		}
	}
}
