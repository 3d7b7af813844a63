package postgres

import (
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/internal/rowcodec"
)

// A list of thousands of objects is decoded from the rows' raw binary
// values rather than scanned column by column: scanning allocates every
// column of every row on its own, and the labels and fields of a
// resource's objects repeat the same few strings. The decoder copies the
// values into shared chunks and hands out one string for equal bytes.

const (
	// valueChunk is the size of the chunks values are copied into. An
	// object the caller keeps holds on to its chunk; larger values get a
	// slice of their own.
	valueChunk = 64 << 10
	// maxInterned bounds the strings one list shares.
	maxInterned = 4096
)

// listColumns are the columns of a list query, in the order decodeRow reads.
const listColumns = `o.namespace, o.name, o.rev, l.value, l.labels, l.fields`

// binaryResults makes a query return every column in binary format, which
// decodeRow reads. The simple protocol knows only text, so a connection
// configured for it runs the query with the extended protocol, without a
// prepared statement, as pgx.QueryExecModeExec does.
func (s *Store) binaryResults() []any {
	opts := []any{pgx.QueryResultFormats{pgx.BinaryFormatCode}}
	if s.connCfg.DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol {
		opts = append(opts, pgx.QueryExecModeExec)
	}
	return opts
}

// listDecoder turns the rows of one list into objects.
type listDecoder struct {
	resource string
	chunk    []byte
	strs     map[string]string
	checked  bool
}

func newListDecoder(resource string) *listDecoder {
	return &listDecoder{resource: resource, strs: map[string]string{}}
}

// intern returns a string equal to b, shared with earlier equal ones.
func (d *listDecoder) intern(b []byte) string {
	if s, ok := d.strs[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(d.strs) < maxInterned {
		d.strs[s] = s
	}
	return s
}

// copyValue returns a copy of b that no other object's value overlaps.
func (d *listDecoder) copyValue(b []byte) []byte {
	if len(b) == 0 {
		return []byte{}
	}
	if len(b) > valueChunk/4 {
		return append([]byte{}, b...)
	}
	if cap(d.chunk)-len(d.chunk) < len(b) {
		d.chunk = make([]byte, 0, valueChunk)
	}
	start := len(d.chunk)
	d.chunk = append(d.chunk, b...)
	return d.chunk[start:len(d.chunk):len(d.chunk)]
}

// decodeRow reads the current row of a query selecting listColumns in
// binary format. keep, if not nil, is asked first whether the object's
// labels and fields select it; a row it rejects yields false, and its value
// is not copied.
func (d *listDecoder) decodeRow(rows pgx.Rows, keep func(labels, fields map[string]string) bool) (store.Object, bool, error) {
	if !d.checked {
		fds := rows.FieldDescriptions()
		if len(fds) != 6 {
			return store.Object{}, false, fmt.Errorf("list query returned %d columns, want 6", len(fds))
		}
		for _, fd := range fds {
			if fd.Format != pgtype.BinaryFormatCode {
				return store.Object{}, false, fmt.Errorf("list query returned column %s in text format", fd.Name)
			}
		}
		d.checked = true
	}
	raw := rows.RawValues()
	if len(raw[2]) != 8 {
		return store.Object{}, false, fmt.Errorf("list: revision of %d bytes, want 8", len(raw[2]))
	}
	o := store.Object{Key: store.Key{Resource: d.resource, Namespace: d.intern(raw[0]), Name: string(raw[1])}}
	o.Revision = int64(binary.BigEndian.Uint64(raw[2]))
	// A field often repeats the object's name or namespace.
	str := func(b []byte) string {
		switch {
		case string(b) == o.Name:
			return o.Name
		case string(b) == o.Namespace:
			return o.Namespace
		}
		return d.intern(b)
	}
	var err error
	if o.Labels, err = rowcodec.DecodeMapWith(raw[4], str); err != nil {
		return store.Object{}, false, fmt.Errorf("labels of %v: %w", o.Key, err)
	}
	if o.Fields, err = rowcodec.DecodeMapWith(raw[5], str); err != nil {
		return store.Object{}, false, fmt.Errorf("fields of %v: %w", o.Key, err)
	}
	if keep != nil && !keep(o.Labels, o.Fields) {
		return store.Object{}, false, nil
	}
	o.Value = d.copyValue(raw[3])
	return o, true, nil
}
