package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Frame types. The numbering is part of the wire format: never reuse a
// number. Control frames a peer does not know are skipped, so new ones can be
// added without a new ALPN; new stream kinds need one.
const (
	frameHello     byte = 0x01 // edge→hub, first frame of the control stream
	frameWelcome   byte = 0x02 // hub→edge, answers a hello that was accepted
	frameHeartbeat byte = 0x03 // edge→hub; over the TCP fallback also hub→edge as an echo
	frameGoAway    byte = 0x04 // hub→edge: drain notice with a reconnect window
	frameFeatures  byte = 0x05 // edge→hub, after the hello: what the edge supports
	frameReport    byte = 0x06 // edge→hub: the latest report (Client.Report), opaque to the tunnel
	framePush      byte = 0x07 // edge→hub: one payload of a stream (Client.Push), opaque to the tunnel
	frameLane      byte = 0x08 // edge→hub, first frame of a bulk lane's control stream instead of a hello
	frameLaneAsk   byte = 0x09 // hub→edge on the control stream: open a bulk lane
	frameLaneIdle  byte = 0x0a // on a bulk lane's control stream: the edge will close it; the hub's echo promises no new streams
	frameOpen      byte = 0x10 // edge→hub stream preamble: an API stream
	frameDial      byte = 0x11 // hub→edge stream preamble: connect this target
)

// protoVersion is carried in Hello so that a hub can refuse an edge that
// speaks a newer dialect under the same ALPN.
const protoVersion = 1

// maxFrame bounds a frame's payload. Frames are small control messages; the
// bound keeps a hostile peer from making us allocate.
const maxFrame = 64 << 10

// MaxReport is the largest payload Client.Report sends: one control frame.
const MaxReport = maxFrame

// MaxPush is the largest payload Client.Push sends: one control frame.
const MaxPush = maxFrame

// maxDialMessage bounds the error text an edge sends back for a failed dial.
const maxDialMessage = 4 << 10

// Dial status bytes, sent by the edge as the first byte of a hub-opened stream.
const (
	statusOK     byte = 0x00
	statusFailed byte = 0x01
)

var errFrameTooLarge = errors.New("frame too large")

// appendFrame appends a frame (type, uvarint length, payload) to b.
func appendFrame(b []byte, typ byte, payload []byte) []byte {
	b = append(b, typ)
	b = binary.AppendUvarint(b, uint64(len(payload)))
	return append(b, payload...)
}

// readFrame reads one frame. The payload is freshly allocated.
func readFrame(r io.ByteReader) (typ byte, payload []byte, err error) {
	typ, err = r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, nil, fmt.Errorf("read frame length: %w", noEOF(err))
	}
	if n > maxFrame {
		return 0, nil, fmt.Errorf("read frame type %#x: %w (%d bytes)", typ, errFrameTooLarge, n)
	}
	payload = make([]byte, n)
	if err := readFull(r, payload); err != nil {
		return 0, nil, fmt.Errorf("read frame payload: %w", err)
	}
	return typ, payload, nil
}

// readFull fills p from a ByteReader, using io.ReadFull when the reader is
// also an io.Reader.
func readFull(r io.ByteReader, p []byte) error {
	if rr, ok := r.(io.Reader); ok {
		_, err := io.ReadFull(rr, p)
		return noEOF(err)
	}
	for i := range p {
		c, err := r.ReadByte()
		if err != nil {
			return noEOF(err)
		}
		p[i] = c
	}
	return nil
}

// noEOF turns an EOF in the middle of a frame into ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// byteReader reads one byte at a time from a stream without buffering, so
// that a preamble can be consumed without swallowing the data that follows
// it. Preambles are a few bytes, so the per-byte cost does not matter.
type byteReader struct {
	r   io.Reader
	buf [1]byte
}

func (b *byteReader) ReadByte() (byte, error) {
	for {
		n, err := b.r.Read(b.buf[:])
		if n == 1 {
			return b.buf[0], nil
		}
		if err != nil {
			return 0, err
		}
	}
}

func (b *byteReader) Read(p []byte) (int, error) { return b.r.Read(p) }

// payloadReader decodes the fields of one frame payload. The first decoding
// error sticks; later reads return zero values.
type payloadReader struct {
	b   []byte
	err error
}

func (p *payloadReader) uvarint() uint64 {
	if p.err != nil {
		return 0
	}
	v, n := binary.Uvarint(p.b)
	if n <= 0 {
		p.err = errors.New("bad varint")
		return 0
	}
	p.b = p.b[n:]
	return v
}

func (p *payloadReader) string() string {
	n := p.uvarint()
	if p.err != nil {
		return ""
	}
	if n > uint64(len(p.b)) {
		p.err = errors.New("string overruns frame")
		return ""
	}
	s := string(p.b[:n])
	p.b = p.b[n:]
	return s
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Hello is what an edge tells the hub first on the control stream at every
// connect.
type Hello struct {
	// Node is the node name; the hub refuses a hello whose node differs from
	// the one its certificate names.
	Node string
	// Version is the agent's version, for logs and skew checks.
	Version string
	// ResourceVersions maps a resource (e.g. "pods") to the last
	// resourceVersion the agent holds, so the hub can resume instead of
	// relisting.
	ResourceVersions map[string]string
}

// marshalHello encodes a Hello payload: protocol version, node, version,
// the resourceVersions sorted by key so that equal hellos encode equally,
// and the edge's feature bits.
func marshalHello(h Hello, features uint64) []byte {
	b := binary.AppendUvarint(nil, protoVersion)
	b = appendString(b, h.Node)
	b = appendString(b, h.Version)
	keys := make([]string, 0, len(h.ResourceVersions))
	for k := range h.ResourceVersions {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = appendString(b, k)
		b = appendString(b, h.ResourceVersions[k])
	}
	return binary.AppendUvarint(b, features)
}

// helloFeatures are the feature bits a hello carries. An edge older than
// the field sends none (known false) and says them in a features frame
// after the hello, which a hub reads only once the session runs.
type helloFeatures struct {
	flags uint64
	known bool
}

func unmarshalHello(b []byte) (Hello, helloFeatures, error) {
	p := payloadReader{b: b}
	v := p.uvarint()
	if p.err == nil && v != protoVersion {
		return Hello{}, helloFeatures{}, fmt.Errorf("decode hello: unsupported protocol version %d", v)
	}
	h := Hello{Node: p.string(), Version: p.string()}
	n := p.uvarint()
	if p.err == nil && n > uint64(len(p.b)/2) {
		// Each entry takes at least two bytes; anything larger lies.
		return Hello{}, helloFeatures{}, errors.New("decode hello: entry count overruns frame")
	}
	if n > 0 {
		h.ResourceVersions = make(map[string]string, n)
	}
	for i := uint64(0); i < n && p.err == nil; i++ {
		k := p.string()
		h.ResourceVersions[k] = p.string()
	}
	var f helloFeatures
	if p.err == nil && len(p.b) > 0 {
		f = helloFeatures{flags: p.uvarint(), known: true}
	}
	if p.err != nil {
		return Hello{}, helloFeatures{}, fmt.Errorf("decode hello: %w", p.err)
	}
	return h, f, nil
}

// welcome is the hub's answer to an accepted hello.
type welcome struct {
	// idleTimeout is the hub's idle timeout; the edge keeps its heartbeat
	// well below it.
	idleTimeoutMillis uint64
	// echo says the hub echoes heartbeats (TCP fallback only, where no
	// transport-level idle timeout exists).
	echo bool
	// parity says the hub decodes parity packets (QUIC only).
	parity bool
	// bulk says the hub accepts bulk lanes.
	bulk bool
}

func marshalWelcome(w welcome) []byte {
	b := binary.AppendUvarint(nil, w.idleTimeoutMillis)
	var flags uint64
	if w.echo {
		flags |= 1
	}
	if w.parity {
		flags |= 2
	}
	if w.bulk {
		flags |= 4
	}
	return binary.AppendUvarint(b, flags)
}

func unmarshalWelcome(b []byte) (welcome, error) {
	p := payloadReader{b: b}
	w := welcome{idleTimeoutMillis: p.uvarint()}
	flags := p.uvarint()
	w.echo, w.parity, w.bulk = flags&1 != 0, flags&2 != 0, flags&4 != 0
	if p.err != nil {
		return welcome{}, fmt.Errorf("decode welcome: %w", p.err)
	}
	return w, nil
}

// Feature bits of the hello and of the features frame.
const (
	featureParity = 1 // the edge decodes parity packets (see fecConn)
	featureBulk   = 2 // the edge opens bulk lanes when the hub asks
)

func marshalFeatures(flags uint64) []byte { return binary.AppendUvarint(nil, flags) }

func unmarshalFeatures(b []byte) (uint64, error) { return unmarshalUvarint(b, "features") }

func marshalGoAway(windowMillis uint64) []byte { return binary.AppendUvarint(nil, windowMillis) }

func unmarshalGoAway(b []byte) (uint64, error) { return unmarshalUvarint(b, "goaway") }

// unmarshalUvarint decodes the payload of a frame that is one uvarint.
func unmarshalUvarint(b []byte, frame string) (uint64, error) {
	p := payloadReader{b: b}
	v := p.uvarint()
	if p.err != nil {
		return 0, fmt.Errorf("decode %s: %w", frame, p.err)
	}
	return v, nil
}

// readDialStatus reads the edge's answer on a hub-opened stream: one status
// byte, and after a failure a uvarint-length message.
func readDialStatus(r io.ByteReader) (ok bool, msg string, err error) {
	st, err := r.ReadByte()
	if err != nil {
		return false, "", err
	}
	switch st {
	case statusOK:
		return true, "", nil
	case statusFailed:
	default:
		return false, "", fmt.Errorf("read dial status: unknown status %#x", st)
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return false, "", fmt.Errorf("read dial error: %w", noEOF(err))
	}
	if n > maxDialMessage {
		return false, "", fmt.Errorf("read dial error: %w (%d bytes)", errFrameTooLarge, n)
	}
	m := make([]byte, n)
	if err := readFull(r, m); err != nil {
		return false, "", fmt.Errorf("read dial error: %w", err)
	}
	return false, string(m), nil
}

func appendDialFailure(b []byte, msg string) []byte {
	if len(msg) > maxDialMessage {
		msg = msg[:maxDialMessage]
	}
	b = append(b, statusFailed)
	return appendString(b, msg)
}
