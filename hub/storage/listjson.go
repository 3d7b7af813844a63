package storage

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// ListJSON answers a List as JSON without decoding the stored objects: the
// body is byte for byte what encoding/json's Encoder writes for the list
// List returns (trailing newline included). Each item is the stored value
// with apiVersion and kind removed (list items carry no type) and
// metadata.resourceVersion inserted where ObjectMeta's field order puts it;
// stored values are written by encoding/json from the typed object, so
// decoding and encoding them again yields the same bytes.
//
// The body is not assembled: it refers to the store's own immutable values
// and is written out piece by piece, so a list of thousands of objects
// costs neither a copy of every object nor a body-sized buffer.
//
// Custom resources are answered the same way (see listJSONUnstructured).
//
// ok is false, with no error, when the list cannot be answered this way:
// the kind is stored as another kind, is a built-in kind defaulted on
// read, or a stored value does not have the shape this package writes.
// The caller then uses List.
func (s *Storage) ListJSON(ctx context.Context, k *registry.Kind, namespace string, opts ListOptions) (body *JSONList, ok bool, err error) {
	k, err = s.served(k)
	if err != nil {
		return nil, false, err
	}
	if s.storedKind(k) != k || (k.DefaultOnRead != nil && k.New == nil) {
		// Views and built-in kinds defaulted on read decode every item.
		return nil, false, nil
	}
	if k.New != nil {
		return s.listJSONUnstructured(ctx, k, namespace, opts)
	}
	res, list, err := s.listPage(ctx, k, namespace, opts)
	if err != nil {
		return nil, false, err
	}
	env, err := json.Marshal(list)
	if err != nil {
		return nil, false, apierrors.NewInternalError(err)
	}
	const tail = `"items":[]}`
	if !bytes.HasSuffix(env, []byte(tail)) {
		return nil, false, nil
	}
	b := &JSONList{env: env[:len(env)-2], items: make([]listItem, len(res.Objects))}
	for i, o := range res.Objects {
		start := len(b.heads)
		var rest int
		if b.heads, rest, ok = appendListItem(b.heads, o.Value, o.Revision); !ok {
			return nil, false, nil
		}
		b.items[i] = listItem{head: len(b.heads) - start, rest: o.Value[rest:]}
		b.size += len(b.heads) - start + len(o.Value) - rest
	}
	b.size += len(b.env) + max(len(b.items)-1, 0)*len(comma) + len(listEnd)
	return b, true, nil
}

// listPage reads one page of a list answered from stored encodings: the
// stored objects, read only, and the typed list without items that
// carries the page's metadata.
func (s *Storage) listPage(ctx context.Context, k *registry.Kind, namespace string, opts ListOptions) (store.ListResult, runtime.Object, error) {
	res, err := s.list(ctx, k, namespace, opts, true)
	if err != nil {
		return store.ListResult{}, nil, err
	}
	list, err := s.makeList(k, nil, res.Revision, res.Continue, res.Remaining)
	if err != nil {
		return store.ListResult{}, nil, err
	}
	return res, list, nil
}

// JSONList is the body ListJSON answers with.
type JSONList struct {
	env   []byte // the list without items, up to and including "items":[
	heads []byte // every item's rewritten start, one after the other
	items []listItem
	end   []byte // what follows the items; nil means listEnd
	size  int
}

// listItem is one list item: pre, a start of the stored value shared as it
// is (custom resources only), its head in JSONList.heads (the next head
// bytes), then the rest of the stored value, which is shared, not copied.
type listItem struct {
	pre  []byte
	head int
	rest []byte
}

// Len returns the length of the body in bytes.
func (b *JSONList) Len() int { return b.size }

// WriteTo writes the body to w, through a buffer of 64 KiB unless w is a
// buffered writer already.
func (b *JSONList) WriteTo(w io.Writer) (int64, error) {
	bw, ok := w.(*bufio.Writer)
	if !ok {
		bw = bufio.NewWriterSize(w, 64<<10)
	}
	var n int64
	write := func(p []byte) {
		m, _ := bw.Write(p)
		n += int64(m)
	}
	write(b.env)
	off := 0
	for i, it := range b.items {
		if i > 0 {
			write(comma)
		}
		write(it.pre)
		write(b.heads[off : off+it.head])
		off += it.head
		write(it.rest)
	}
	if b.end != nil {
		write(b.end)
	} else {
		write(listEnd)
	}
	return n, bw.Flush()
}

// Bytes returns the body as one slice.
func (b *JSONList) Bytes() []byte {
	var buf bytes.Buffer
	buf.Grow(b.size)
	b.WriteTo(&buf)
	return buf.Bytes()
}

var (
	comma   = []byte{','}
	listEnd = []byte("]}\n")
)

// metaBeforeRV are the ObjectMeta fields encoded before resourceVersion.
var metaBeforeRV = map[string]bool{"name": true, "generateName": true, "namespace": true, "selfLink": true, "uid": true}

// appendListItem appends the start of stored value v as a list item of
// revision rev, up to the point from which v is copied as it is: the item
// is dst's new bytes followed by v[rest:].
// encoding/json writes the members of TypeMeta first and metadata next, so
// everything after the point where resourceVersion goes is copied as it is.
func appendListItem(dst, v []byte, rev int64) (_ []byte, rest int, ok bool) {
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '{' || v[len(v)-1] != '}' {
		return dst, 0, false
	}
	dst = append(dst, '{')
	i = skipSpace(v, i+1)
	for i < len(v) && v[i] == '"' {
		ke, ok := skipString(v, i)
		if !ok {
			return dst, 0, false
		}
		key := v[i+1 : ke-1]
		i = skipSpace(v, ke)
		if i >= len(v) || v[i] != ':' {
			return dst, 0, false
		}
		vs := skipSpace(v, i+1)
		switch string(key) {
		case "kind", "apiVersion":
		case "metadata":
			dst = append(dst, `"metadata":`...)
			dst, rest, ok := appendMeta(dst, v[vs:], rev)
			return dst, vs + rest, ok
		default:
			return dst, 0, false
		}
		ve, ok := skipValue(v, vs)
		if !ok {
			return dst, 0, false
		}
		i = skipSpace(v, ve)
		if i >= len(v) || v[i] != ',' {
			return dst, 0, false
		}
		i = skipSpace(v, i+1)
	}
	return dst, 0, false
}

// appendMeta appends the start of v, the rest of a stored value from its
// metadata object on, with resourceVersion rev inserted into the metadata.
// The stored metadata has no resourceVersion (encode clears it) and its
// members are in ObjectMeta's order, so v[rest:], what follows the
// insertion point, is copied as it is.
func appendMeta(dst, v []byte, rev int64) (_ []byte, rest int, ok bool) {
	if len(v) < 2 || v[0] != '{' {
		return dst, 0, false
	}
	dst = append(dst, '{')
	i := skipSpace(v, 1)
	first := true
	for i < len(v) && v[i] == '"' {
		ke, ok := skipString(v, i)
		if !ok {
			return dst, 0, false
		}
		if !metaBeforeRV[string(v[i+1:ke-1])] {
			break
		}
		j := skipSpace(v, ke)
		if j >= len(v) || v[j] != ':' {
			return dst, 0, false
		}
		ve, ok := skipValue(v, skipSpace(v, j+1))
		if !ok {
			return dst, 0, false
		}
		if !first {
			dst = append(dst, ',')
		}
		dst = append(dst, v[i:ve]...)
		first = false
		i = skipSpace(v, ve)
		if i >= len(v) {
			return dst, 0, false
		}
		switch v[i] {
		case ',':
			i = skipSpace(v, i+1)
		case '}':
		default:
			return dst, 0, false
		}
	}
	if !first {
		dst = append(dst, ',')
	}
	dst = append(dst, `"resourceVersion":"`...)
	dst = strconv.AppendInt(dst, rev, 10)
	dst = append(dst, '"')
	if i < len(v) && v[i] == '"' {
		if bytes.HasPrefix(v[i:], []byte(`"resourceVersion"`)) {
			return dst, 0, false
		}
		dst = append(dst, ',')
	}
	return dst, i, true
}

// listJSONUnstructured is ListJSON for a custom resource. Its objects are
// stored as encoding/json writes an unstructured object, members sorted
// by name, and an unstructured list encodes as a map too: apiVersion,
// items, kind, metadata. Items keep their apiVersion and kind; each gets
// its resourceVersion inserted in metadata where the sorted order puts it.
// An object stored in another version (written before the definition
// changed its storage version), or one the kind's defaults on read change
// (see readDefaults), is decoded and encoded as List would.
func (s *Storage) listJSONUnstructured(ctx context.Context, k *registry.Kind, namespace string, opts ListOptions) (*JSONList, bool, error) {
	res, list, err := s.listPage(ctx, k, namespace, opts)
	if err != nil {
		return nil, false, err
	}
	env, err := json.Marshal(list)
	if err != nil {
		return nil, false, apierrors.NewInternalError(err)
	}
	const items = `"items":[]`
	cut := bytes.Index(env, []byte(items))
	if cut < 0 || !bytes.HasPrefix(env, []byte(`{"apiVersion":`)) {
		return nil, false, nil
	}
	cut += len(items) - 1
	b := &JSONList{env: env[:cut], end: append(env[cut:len(env):len(env)], '\n'), items: make([]listItem, len(res.Objects))}
	av, err := json.Marshal(k.GVK.GroupVersion().String())
	if err != nil {
		return nil, false, apierrors.NewInternalError(err)
	}
	kind, err := json.Marshal(k.GVK.Kind)
	if err != nil {
		return nil, false, apierrors.NewInternalError(err)
	}
	var known []bool
	if k.DefaultOnRead != nil {
		known = s.rdefaults.unchanged(k, res.Objects)
	}
	for i, o := range res.Objects {
		v := o.Value
		at, ok := unstructuredRVAt(v, av, kind)
		var obj runtime.Object
		if ok && known != nil && !known[i] {
			// Not known to read as stored: decode it once to find out.
			var same bool
			if obj, same, err = s.decodeReporting(k, o); err != nil {
				return nil, false, err
			}
			if ok = same; same {
				s.rdefaults.note(k, o.Key, o.Revision)
			}
		}
		if !ok {
			// Changed by the defaults on read, or stored in another
			// version: the item is the decoded object, encoded.
			if obj == nil {
				if obj, err = s.decode(k, o); err != nil {
					return nil, false, err
				}
			}
			u, isU := obj.(*unstructured.Unstructured)
			if !isU {
				return nil, false, nil
			}
			item, err := json.Marshal(u.Object)
			if err != nil {
				return nil, false, apierrors.NewInternalError(fmt.Errorf("encode %s: %w", o.Key, err))
			}
			b.items[i] = listItem{pre: item}
			b.size += len(item)
			continue
		}
		start := len(b.heads)
		if v[at] == '}' {
			b.heads = append(b.heads, `,"resourceVersion":"`...)
		} else {
			b.heads = append(b.heads, `"resourceVersion":"`...)
		}
		b.heads = strconv.AppendInt(b.heads, o.Revision, 10)
		if v[at] == '}' {
			b.heads = append(b.heads, '"')
		} else {
			b.heads = append(b.heads, `",`...)
		}
		b.items[i] = listItem{pre: v[:at], head: len(b.heads) - start, rest: v[at:]}
		b.size += len(v) + len(b.heads) - start
	}
	b.size += len(b.env) + max(len(b.items)-1, 0)*len(comma) + len(b.end)
	return b, true, nil
}

// unstructuredRVAt returns where resourceVersion goes in v, a stored custom
// resource: in its metadata, before the first member sorting after it, or
// before the closing brace. ok is false unless v is an object of apiVersion
// av and kind kind (both as encoded) with a metadata object.
func unstructuredRVAt(v, av, kind []byte) (int, bool) {
	if len(v) < 2 || v[0] != '{' {
		return 0, false
	}
	sawAV, sawKind := false, false
	for i := 1; i < len(v) && v[i] == '"'; {
		ke, ok := skipString(v, i)
		if !ok || ke >= len(v) || v[ke] != ':' {
			return 0, false
		}
		key, vs := string(v[i+1:ke-1]), ke+1
		ve, ok := skipValue(v, vs)
		if !ok || ve >= len(v) {
			return 0, false
		}
		switch key {
		case "apiVersion":
			sawAV = bytes.Equal(v[vs:ve], av)
		case "kind":
			sawKind = bytes.Equal(v[vs:ve], kind)
		case "metadata":
			if !sawAV || !sawKind || v[vs] != '{' {
				return 0, false
			}
			return metaRVAt(v, vs+1)
		}
		if v[ve] != ',' {
			return 0, false
		}
		i = ve + 1
	}
	return 0, false
}

// metaRVAt is unstructuredRVAt inside the metadata object whose members
// start at v[i].
func metaRVAt(v []byte, i int) (int, bool) {
	if i >= len(v) || v[i] != '"' {
		return 0, false // a stored object always has a name
	}
	for i < len(v) && v[i] == '"' {
		ke, ok := skipString(v, i)
		if !ok {
			return 0, false
		}
		switch key := string(v[i+1 : ke-1]); {
		case key == "resourceVersion":
			return 0, false
		case key > "resourceVersion":
			return i, true
		}
		if ke >= len(v) || v[ke] != ':' {
			return 0, false
		}
		ve, ok := skipValue(v, ke+1)
		if !ok || ve >= len(v) {
			return 0, false
		}
		switch v[ve] {
		case ',':
			i = ve + 1
		case '}':
			return ve, true
		default:
			return 0, false
		}
	}
	return 0, false
}

func skipSpace(v []byte, i int) int {
	for i < len(v) && (v[i] == ' ' || v[i] == '\t' || v[i] == '\n' || v[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at v[i] == '"'.
func skipString(v []byte, i int) (int, bool) {
	for j := i + 1; j < len(v); j++ {
		switch v[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return 0, false
}

// skipValue returns the index after the JSON value starting at v[i].
func skipValue(v []byte, i int) (int, bool) {
	if i >= len(v) {
		return 0, false
	}
	switch v[i] {
	case '"':
		return skipString(v, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(v); j++ {
			switch v[j] {
			case '"':
				e, ok := skipString(v, j)
				if !ok {
					return 0, false
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, true
				}
			}
		}
		return 0, false
	}
	j := i
	for j < len(v) {
		switch v[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j, j > i
		}
		j++
	}
	return j, j > i
}
