package usage

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// Wire format (version 1). A payload is a version byte, a flags byte and
// a body, deflated (raw DEFLATE) when flagDeflated is set.
//
// With flagTable (a full sample) the body is:
//
//	uvarint time (Unix milliseconds), uvarint window (milliseconds),
//	uvarint pods, pods × (string namespace, string name, uvarint n,
//	n × string container), then the values as uvarints
//
// and without it (changes since the previous payload):
//
//	varint time change (ms), varint window change (ms), then each
//	value's change as a zig-zag varint
//
// Strings are a uvarint length and bytes. The values are, in order, the
// node's CPU (microcores) and working set (KiB), then the same two for
// each container in table order.

// Encoder writes a stream of samples for one [Decoder]. The zero value is
// ready to use; it is not safe for concurrent use.
type Encoder struct {
	have   bool
	table  table
	values []uint64
	time   int64 // ms
	window int64 // ms
}

// Reset forgets what was written: the next payload is a full sample. Call
// it whenever the payloads start going to a new decoder.
func (e *Encoder) Reset() { *e = Encoder{} }

// Encode returns the payload that carries s to the decoder that has seen
// every payload this encoder wrote since its last Reset.
func (e *Encoder) Encode(s Sample) ([]byte, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	tab, vals := tableOf(&s), valuesOf(&s)
	ms, win := s.Time.UnixMilli(), s.Window.Milliseconds()
	if ms < 0 || ms > maxTime {
		return nil, fmt.Errorf("usage: time %v out of range", s.Time)
	}
	var body []byte
	flags := byte(0)
	if !e.have || !tab.equal(e.table) {
		flags |= flagTable
		body = binary.AppendUvarint(body, uint64(ms))
		body = binary.AppendUvarint(body, uint64(win))
		body = binary.AppendUvarint(body, uint64(len(tab.pods)))
		for _, p := range tab.pods {
			body = appendString(body, p.namespace)
			body = appendString(body, p.name)
			body = binary.AppendUvarint(body, uint64(len(p.containers)))
			for _, c := range p.containers {
				body = appendString(body, c)
			}
		}
		for _, v := range vals {
			body = binary.AppendUvarint(body, v)
		}
		if z, ok := deflate(body); ok {
			flags |= flagDeflated
			body = z
		}
	} else {
		body = binary.AppendVarint(body, ms-e.time)
		body = binary.AppendVarint(body, win-e.window)
		for i, v := range vals {
			body = binary.AppendVarint(body, int64(v-e.values[i]))
		}
	}
	out := append([]byte{version, flags}, body...)
	if len(out) > MaxPayload {
		return nil, fmt.Errorf("usage: payload of %d bytes, at most %d", len(out), MaxPayload)
	}
	e.have, e.table, e.values, e.time, e.window = true, tab, vals, ms, win
	return out, nil
}

// Decoder reads the payloads of one [Encoder]. The zero value is ready to
// use; it is not safe for concurrent use.
type Decoder struct {
	have   bool
	table  table
	values []uint64
	time   int64
	window int64
}

// Decode returns the sample payload carries. On error the decoder is
// unchanged, so the next full sample decodes.
func (d *Decoder) Decode(payload []byte) (Sample, error) {
	if len(payload) > MaxPayload {
		return Sample{}, fmt.Errorf("usage: payload of %d bytes, at most %d", len(payload), MaxPayload)
	}
	if len(payload) < 2 {
		return Sample{}, errors.New("usage: payload too short")
	}
	if payload[0] != version {
		return Sample{}, fmt.Errorf("usage: unknown version %d", payload[0])
	}
	flags, body := payload[1], payload[2:]
	if flags&^flagsKnown != 0 {
		return Sample{}, fmt.Errorf("usage: unknown flags %#x", flags)
	}
	if flags&flagDeflated != 0 {
		if flags&flagTable == 0 {
			return Sample{}, errors.New("usage: deflated changes")
		}
		var err error
		if body, err = inflate(body); err != nil {
			return Sample{}, err
		}
	}
	r := &reader{b: body}
	var next Decoder
	if flags&flagTable != 0 {
		next = d.full(r)
	} else {
		next = d.changes(r)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d bytes after the sample", len(r.b))
	}
	if r.err != nil {
		return Sample{}, r.err
	}
	*d = next
	return d.sample(), nil
}

func (d *Decoder) full(r *reader) Decoder {
	n := Decoder{have: true}
	n.time = r.int(maxTime)
	n.window = r.int(maxWindow)
	pods := r.count(MaxPods, "pods")
	seen := make(map[string]bool)
	values := 2
	for range pods {
		p := tablePod{namespace: r.name(), name: r.name()}
		k := p.namespace + "/" + p.name
		if r.err == nil && seen[k] {
			r.fail("pod %s twice", k)
		}
		seen[k] = true
		nc := r.count(MaxContainers, "containers")
		names := make(map[string]bool, nc)
		for range nc {
			c := r.name()
			if r.err == nil && names[c] {
				r.fail("pod %s: container %s twice", k, c)
			}
			names[c] = true
			p.containers = append(p.containers, c)
		}
		values += 2 * nc
		n.table.pods = append(n.table.pods, p)
		if r.err != nil {
			return n
		}
	}
	n.values = make([]uint64, values)
	for i := range n.values {
		if n.values[i] = r.uvarint(); n.values[i] > maxValue {
			r.fail("value %d out of range", i)
		}
	}
	return n
}

func (d *Decoder) changes(r *reader) Decoder {
	if !d.have {
		r.err = ErrNoBase
		return Decoder{}
	}
	n := Decoder{have: true, table: d.table, values: make([]uint64, len(d.values))}
	n.time = add(r, d.time, maxTime, "time")
	n.window = add(r, d.window, maxWindow, "window")
	for i, v := range d.values {
		delta := r.varint()
		if (delta < 0 && uint64(-delta) > v) || (delta > 0 && uint64(delta) > maxValue-v) {
			r.fail("value %d out of range", i)
		}
		n.values[i] = v + uint64(delta)
	}
	return n
}

func add(r *reader, base, limit int64, what string) int64 {
	delta := r.varint()
	v := base + delta
	if (delta > 0 && v < base) || (delta < 0 && v > base) || v < 0 || v > limit {
		r.fail("%s out of range", what)
	}
	return v
}

func (d *Decoder) sample() Sample {
	s := Sample{
		Time:   time.UnixMilli(d.time),
		Window: time.Duration(d.window) * time.Millisecond,
		Node:   Resources{CPUNanoCores: d.values[0] * cpuUnit, MemoryWorkingSetBytes: d.values[1] * memUnit},
		Pods:   make([]Pod, len(d.table.pods)),
	}
	i := 2
	for pi, tp := range d.table.pods {
		p := Pod{Namespace: tp.namespace, Name: tp.name, Containers: make([]Container, len(tp.containers))}
		for ci, c := range tp.containers {
			p.Containers[ci] = Container{Name: c, Usage: Resources{CPUNanoCores: d.values[i] * cpuUnit, MemoryWorkingSetBytes: d.values[i+1] * memUnit}}
			i += 2
		}
		s.Pods[pi] = p
	}
	return s
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// deflate returns b deflated when that is shorter.
func deflate(b []byte) ([]byte, bool) {
	if len(b) < 64 {
		return nil, false
	}
	var buf bytes.Buffer
	w, _ := flate.NewWriter(&buf, flate.BestCompression)
	w.Write(b)
	w.Close()
	if buf.Len() >= len(b) {
		return nil, false
	}
	return buf.Bytes(), true
}

// Bounds of a sample's time (the end of year 9999) and window, in
// milliseconds.
const (
	maxTime   = 253402300799999
	maxWindow = int64(time.Hour / time.Millisecond)
)

// maxValue bounds a value on the wire so that it fits in its unit.
const maxValue = math.MaxUint64 / memUnit

// maxInflated bounds a deflated table: a payload may not inflate beyond
// what the largest table could need.
const maxInflated = 8 << 20

func inflate(b []byte) ([]byte, error) {
	out, err := io.ReadAll(io.LimitReader(flate.NewReader(bytes.NewReader(b)), maxInflated+1))
	if err != nil {
		return nil, fmt.Errorf("usage: inflate: %w", err)
	}
	if len(out) > maxInflated {
		return nil, fmt.Errorf("usage: inflates beyond %d bytes", maxInflated)
	}
	return out, nil
}

// reader reads the body; the first failure sticks and later reads return
// zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("usage: "+format, args...)
	}
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("bad uvarint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) int(limit int64) int64 {
	v := r.uvarint()
	if v > uint64(limit) {
		r.fail("number %d out of range", v)
		return 0
	}
	return int64(v)
}

func (r *reader) count(limit int, what string) int {
	v := r.uvarint()
	if v > uint64(limit) {
		r.fail("%d %s, at most %d", v, what, limit)
		return 0
	}
	return int(v)
}

func (r *reader) name() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.fail("string runs past the end")
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	if err := checkName(s); err != nil {
		r.fail("%v", err)
	}
	return s
}
