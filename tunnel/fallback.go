package tunnel

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// The TCP fallback carries streams over yamux. yamux has no way to reset a
// single stream on demand, so after the preamble every payload byte on a
// fallback stream travels in a data frame, and a reset is a frame of its
// own. That keeps "a reset is an error, not EOF" true on both transports.
const (
	dataFrameData  byte = 0x00 // uvarint length, payload
	dataFrameReset byte = 0x01 // uvarint error code; the stream ends
	dataFrameFin   byte = 0x02 // uvarint 0; the sender's graceful end (bulk lanes only)
)

// maxDataChunk bounds one data frame, so a frame never waits on more yamux
// window than a typical stream has.
const maxDataChunk = 32 << 10

// yamuxStream frames payload on a yamux stream.
type yamuxStream struct {
	s *yamux.Stream
	// strict marks a bulk lane's stream: its graceful end is a fin frame,
	// so an end of stream without one is the lane's loss, surfaced as a
	// *ResetError rather than io.EOF. The fallback's streams are not
	// strict, for peers that predate the fin frame.
	strict  bool
	sess    *yamux.Session
	finSent atomic.Bool

	rmu sync.Mutex // guards fr
	fr  *dataFrameReader

	wmu  sync.Mutex // serialises frames on the wire
	wbuf []byte

	reset   atomic.Pointer[ResetError] // set once the stream is reset either way
	stopped atomic.Bool                // stopReading was called
}

func newYamuxStream(s *yamux.Stream, sess *yamux.Session, strict bool) *yamuxStream {
	return &yamuxStream{s: s, sess: sess, strict: strict}
}

// rawRead reads unframed bytes; used for preambles and the dial status,
// which precede the framed payload.
func (y *yamuxStream) rawRead(p []byte) (int, error) {
	n, err := y.s.Read(p)
	if y.strict && (err == io.EOF || err == io.ErrUnexpectedEOF) {
		return n, y.lost()
	}
	return n, err
}

// lost records and returns the reset of a stream whose bulk lane ended
// under it.
func (y *yamuxStream) lost() error {
	y.reset.CompareAndSwap(nil, &ResetError{Code: codeLaneLost})
	return y.reset.Load()
}

// rawWrite writes unframed bytes (preambles, dial status).
func (y *yamuxStream) rawWrite(p []byte) (int, error) { return y.s.Write(p) }

func (y *yamuxStream) Read(p []byte) (int, error) {
	if e := y.reset.Load(); e != nil {
		return 0, e
	}
	y.rmu.Lock()
	defer y.rmu.Unlock()
	if y.fr == nil {
		y.fr = newDataFrameReader(yamuxReader{y.s})
	}
	n, code, isReset, err := y.fr.read(p)
	if isReset {
		y.reset.CompareAndSwap(nil, &ResetError{Code: code, Remote: true})
		// Our side of the stream is finished too: unblock local writers.
		y.s.Close()
		return 0, y.reset.Load()
	}
	if y.strict && !y.fr.fin && (err == io.EOF || err == io.ErrUnexpectedEOF) {
		return n, y.lost()
	}
	if err != nil {
		return n, y.readErr(err)
	}
	return n, nil
}

// dataFrameReader decodes the fallback's data frames.
type dataFrameReader struct {
	br        *bufio.Reader
	remaining uint64 // payload bytes left in the current data frame
	fin       bool   // a fin frame arrived: the sender ended gracefully
}

func newDataFrameReader(r io.Reader) *dataFrameReader {
	return &dataFrameReader{br: bufio.NewReaderSize(r, 16<<10)}
}

// read returns payload bytes, or the code of a reset frame. An EOF between
// frames is io.EOF; inside one, io.ErrUnexpectedEOF.
func (f *dataFrameReader) read(p []byte) (n int, resetCode uint64, isReset bool, err error) {
	for f.remaining == 0 {
		typ, err := f.br.ReadByte()
		if err != nil {
			return 0, 0, false, err
		}
		v, err := binary.ReadUvarint(f.br)
		if err != nil {
			return 0, 0, false, noEOF(err)
		}
		switch typ {
		case dataFrameData:
			f.remaining = v
		case dataFrameReset:
			return 0, v, true, nil
		case dataFrameFin:
			f.fin = true
			return 0, 0, false, io.EOF
		default:
			return 0, 0, false, fmt.Errorf("read fallback frame: unknown type %#x", typ)
		}
	}
	if len(p) == 0 {
		return 0, 0, false, nil
	}
	if uint64(len(p)) > f.remaining {
		p = p[:f.remaining]
	}
	n, err = f.br.Read(p)
	f.remaining -= uint64(n)
	if err != nil {
		return n, 0, false, noEOF(err)
	}
	return n, 0, false, nil
}

func (y *yamuxStream) readErr(err error) error {
	if e := y.reset.Load(); e != nil {
		return e
	}
	if y.stopped.Load() && err != io.EOF {
		return net.ErrClosed
	}
	return err
}

func (y *yamuxStream) Write(p []byte) (int, error) {
	return y.write(nil, p)
}

func (y *yamuxStream) writeWithPreamble(pre, p []byte) error {
	_, err := y.write(pre, p)
	return err
}

// write sends pre unframed, then p in data frames; pre shares the first
// yamux frame with the first chunk.
func (y *yamuxStream) write(pre, p []byte) (int, error) {
	if e := y.reset.Load(); e != nil {
		return 0, e
	}
	y.wmu.Lock()
	defer y.wmu.Unlock()
	written := 0
	if len(p) == 0 && len(pre) > 0 {
		_, err := y.s.Write(pre)
		return 0, err
	}
	for len(p) > 0 {
		chunk := p
		if len(chunk) > maxDataChunk {
			chunk = chunk[:maxDataChunk]
		}
		y.wbuf = append(y.wbuf[:0], pre...)
		pre = nil
		y.wbuf = append(y.wbuf, dataFrameData)
		y.wbuf = binary.AppendUvarint(y.wbuf, uint64(len(chunk)))
		y.wbuf = append(y.wbuf, chunk...)
		if _, err := y.s.Write(y.wbuf); err != nil {
			if e := y.reset.Load(); e != nil {
				return written, e
			}
			if y.strict && y.sess.IsClosed() {
				return written, y.lost()
			}
			return written, err
		}
		written += len(chunk)
		p = p[len(chunk):]
	}
	return written, nil
}

func (y *yamuxStream) closeWrite() error {
	if y.strict && y.finSent.CompareAndSwap(false, true) {
		y.wmu.Lock()
		_, err := y.s.Write([]byte{dataFrameFin, 0})
		y.wmu.Unlock()
		if err != nil && y.sess.IsClosed() {
			return y.lost()
		}
	}
	return y.s.Close()
}

// abort sends a reset frame and ends the stream. The frame may have to wait
// for yamux window if the peer stopped reading, so it is sent off the
// caller's goroutine: an abort never blocks.
func (y *yamuxStream) abort(code uint64) {
	if !y.reset.CompareAndSwap(nil, &ResetError{Code: code}) {
		return
	}
	y.s.SetReadDeadline(time.Unix(1, 0))  // wake local readers
	y.s.SetWriteDeadline(time.Unix(1, 0)) // and a writer blocked on window
	go func() {
		y.wmu.Lock()
		defer y.wmu.Unlock()
		y.s.SetWriteDeadline(time.Now().Add(10 * time.Second))
		b := binary.AppendUvarint([]byte{dataFrameReset}, code)
		y.s.Write(b)
		y.s.Close()
	}()
}

// stopReading wakes local readers; yamux cannot tell the peer to stop
// sending, so a peer that only writes stalls on flow control until yamux's
// stream close timeout resets the stream.
func (y *yamuxStream) stopReading(uint64) {
	y.stopped.Store(true)
	y.s.SetReadDeadline(time.Unix(1, 0))
}

func (y *yamuxStream) SetDeadline(t time.Time) error {
	if y.stopped.Load() || y.reset.Load() != nil {
		return nil
	}
	return y.s.SetDeadline(t)
}

func (y *yamuxStream) SetReadDeadline(t time.Time) error {
	if y.stopped.Load() || y.reset.Load() != nil {
		return nil
	}
	return y.s.SetReadDeadline(t)
}

func (y *yamuxStream) SetWriteDeadline(t time.Time) error { return y.s.SetWriteDeadline(t) }

// yamuxReader hides yamux's stream type from bufio so reads go through
// its plain Read.
type yamuxReader struct{ s *yamux.Stream }

func (r yamuxReader) Read(p []byte) (int, error) { return r.s.Read(p) }
