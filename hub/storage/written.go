package storage

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
)

// A custom object a create stores is read back at once: the create's
// response, then every watch of the kind. Decoding its stored JSON again
// gives what a copy of the written object gives once its values take the
// forms decoding makes (an integer as int64, another number as float64),
// so the create hands such a copy, with the defaults on read applied, to
// the decode cache (expectWrite) instead.

// writtenState returns the state decoding obj's encoding as kind k would
// give (resourceVersion aside), and whether the kind's DefaultOnRead left
// it as stored; ok is false when obj holds a value whose encoding does not
// decode to itself (a string that is not UTF-8, a number of another Go
// type, any other type), or k is not the stored kind, and the caller
// decodes as usual.
func (s *Storage) writtenState(k *registry.Kind, obj runtime.Object) (out runtime.Object, same, ok bool) {
	u, isU := isUnstructured(obj)
	if !isU || s.storedKind(k) != k || k.New == nil {
		return nil, false, false
	}
	var changed bool
	m, ok := decodedForm(u.Object, 0, &changed)
	if !ok {
		return nil, false, false
	}
	cp := &unstructured.Unstructured{Object: m.(map[string]any)}
	if cp.GroupVersionKind() != k.GVK {
		// Decoding sets the kind's type on what it decodes.
		return nil, false, false
	}
	switch {
	case k.DefaultOnRead == nil:
	case changed:
		same = defaultOnRead(k, k, cp)
	default:
		// The copy is obj as decoding gives it: obj is what the
		// defaults on read are to leave as it is.
		k.DefaultOnRead(cp)
		same = jsonEqual(u.Object, cp.Object)
	}
	return cp, same, true
}

// maxDecodedDepth bounds decodedForm's recursion as the JSON decoder
// bounds its nesting; deeper objects are decoded as usual.
const maxDecodedDepth = 10000

// decodedForm returns a copy of v, a value of an unstructured object, as
// encoding it to JSON and decoding that gives it, or false if that is not
// known without doing so. It sets *changed if the copy differs from v.
func decodedForm(v any, depth int, changed *bool) (any, bool) {
	if depth > maxDecodedDepth {
		return nil, false
	}
	switch v := v.(type) {
	case map[string]any:
		if v == nil {
			*changed = true
			return nil, true
		}
		out := make(map[string]any, len(v))
		for key, val := range v {
			if !utf8.ValidString(key) {
				return nil, false
			}
			c, ok := decodedForm(val, depth+1, changed)
			if !ok {
				return nil, false
			}
			out[key] = c
		}
		return out, true
	case []any:
		if v == nil {
			*changed = true
			return nil, true
		}
		out := make([]any, len(v))
		for i, val := range v {
			c, ok := decodedForm(val, depth+1, changed)
			if !ok {
				return nil, false
			}
			out[i] = c
		}
		return out, true
	case string:
		return v, utf8.ValidString(v)
	case bool, int64, nil:
		return v, true
	case float64:
		// Encoded as the shortest text that reads back as v, which
		// decodes to an int64 when it reads as one.
		b, err := json.Marshal(v)
		if err != nil {
			return nil, false
		}
		if i, err := strconv.ParseInt(string(b), 10, 64); err == nil {
			*changed = true
			return i, true
		}
		return v, true
	}
	return nil, false
}

// marshal is json.Marshal. For an unstructured object, json.Marshal
// validates and compacts what the object's MarshalJSON wrote, which is
// compact JSON and a newline: marshal only drops the newline.
func marshal(obj runtime.Object) ([]byte, error) {
	if u, ok := isUnstructured(obj); ok {
		b, err := u.MarshalJSON()
		if err != nil {
			return nil, err
		}
		return bytes.TrimSuffix(b, []byte("\n")), nil
	}
	return json.Marshal(obj)
}
