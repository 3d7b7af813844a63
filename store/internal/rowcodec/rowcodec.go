// Package rowcodec holds the encodings the SQL store backends share: the
// label and field maps kept beside each object in a row, and the continue
// token of a limited list.
package rowcodec

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// EncodeMap writes a string map as a count followed by length-prefixed keys
// and values in key order; nil and empty maps encode as nil.
func EncodeMap(m map[string]string) []byte {
	if len(m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m))
	n := binary.MaxVarintLen64
	for k, v := range m {
		keys = append(keys, k)
		n += len(k) + len(v) + 2*binary.MaxVarintLen64
	}
	slices.Sort(keys)
	b := make([]byte, 0, n)
	b = binary.AppendUvarint(b, uint64(len(m)))
	for _, k := range keys {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		v := m[k]
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	return b
}

var errCorrupt = errors.New("corrupt map encoding")

// DecodeMap reads a map EncodeMap wrote.
func DecodeMap(b []byte) (map[string]string, error) {
	return DecodeMapWith(b, nil)
}

// DecodeMapWith reads a map EncodeMap wrote, turning keys and values into
// strings with str, which may hand out one string for equal bytes; nil
// converts each on its own.
func DecodeMapWith(b []byte, str func([]byte) string) (map[string]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, errCorrupt
	}
	b = b[k:]
	m := make(map[string]string, n)
	next := func() (string, error) {
		l, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < l {
			return "", errCorrupt
		}
		field := b[k : k+int(l)]
		b = b[k+int(l):]
		if str == nil {
			return string(field), nil
		}
		return str(field), nil
	}
	for range n {
		key, err := next()
		if err != nil {
			return nil, err
		}
		val, err := next()
		if err != nil {
			return nil, err
		}
		m[key] = val
	}
	return m, nil
}

// Continue is the position after which a limited list resumes.
type Continue struct {
	Rev       int64
	Namespace string
	Name      string
}

// Encode returns the token as a list's continue string.
func (c Continue) Encode() string {
	b := binary.AppendVarint(nil, c.Rev)
	b = binary.AppendUvarint(b, uint64(len(c.Namespace)))
	b = append(b, c.Namespace...)
	b = append(b, c.Name...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodeContinue reads a continue string Encode wrote.
func DecodeContinue(s string) (Continue, error) {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return Continue{}, fmt.Errorf("decode continue token: %w", err)
	}
	var c Continue
	var k int
	c.Rev, k = binary.Varint(b)
	if k <= 0 {
		return Continue{}, errors.New("decode continue token: bad revision")
	}
	b = b[k:]
	l, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < l {
		return Continue{}, errors.New("decode continue token: bad namespace")
	}
	c.Namespace = string(b[k : k+int(l)])
	c.Name = string(b[k+int(l):])
	return c, nil
}
