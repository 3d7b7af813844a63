package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"reflect"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// ListProtobuf answers a List as Kubernetes' protobuf encoding
// (application/vnd.kubernetes.protobuf) of what List returns, byte for
// byte, without building the typed list: the body is written piece by
// piece from each item's own encoding, laid out as apimachinery's
// streaming list encoder lays out a list (the same bytes as its buffered
// encoder).
//
// client-go's typed clients ask for protobuf, so informers and
// controllers list this way. The hub stores JSON, and decoding an item
// costs about five times encoding it; so the encoding of each item a list
// sent is kept (protoItems) and the next list of an unchanged item sends
// it again without decoding. Under churn most items of a list are those
// the previous list sent, and most of the others reached the hub's
// protobuf watches (the controllers' informers, the agents') since: their
// events take the item from ProtoItem, so a changed item is encoded once
// for the watches and the list, and not decoded again for the list.
//
// ok is false, with no error, for kinds whose objects have no protobuf
// encoding (custom resources) or whose list type is not laid out as
// Kubernetes' lists are. The caller then uses List.
func (s *Storage) ListProtobuf(ctx context.Context, k *registry.Kind, namespace string, opts ListOptions) (body *ProtoList, ok bool, err error) {
	k, err = s.served(k)
	if err != nil {
		return nil, false, err
	}
	if k.New != nil || k.NoProtobuf {
		return nil, false, nil
	}
	res, list, err := s.listPage(ctx, k, namespace, opts)
	if err != nil {
		return nil, false, err
	}
	lm, ok := protoListMeta(list)
	if !ok {
		return nil, false, nil
	}
	s.protos.listed()
	gvk := list.GetObjectKind().GroupVersionKind()
	b := &ProtoList{
		unk:   runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind}},
		items: make([][]byte, len(res.Objects)),
	}
	if b.meta, err = lm.Marshal(); err != nil {
		return nil, false, apierrors.NewInternalError(err)
	}
	b.raw = fieldSize(len(b.meta))
	for i, o := range res.Objects {
		item, ok, err := s.protoItem(k, o)
		if err != nil || !ok {
			return nil, false, err
		}
		b.items[i] = item
		b.raw += fieldSize(len(item))
	}
	return b, true, nil
}

// protoItem returns the protobuf encoding of a stored object as a list
// item, from protoItems or encoded now. An object a watch decoded
// recently is not decoded again.
func (s *Storage) protoItem(k *registry.Kind, o store.Object) ([]byte, bool, error) {
	key := pendingKey{kind: k, key: o.Key}
	if b := s.protos.get(key, o.Revision); b != nil {
		return b, true, nil
	}
	obj, _, err := s.decodeForRead(k, o)
	if err != nil {
		return nil, false, err
	}
	m, ok := obj.(interface{ Marshal() ([]byte, error) })
	if !ok {
		return nil, false, nil
	}
	b, err := m.Marshal()
	if err != nil {
		return nil, false, apierrors.NewInternalError(err)
	}
	s.protos.put(key, o.Revision, b)
	return b, true, nil
}

// ProtoItem returns the protobuf encoding of obj, an object of kind k
// that a watch of k carries in an Added or Modified event (the stored
// object at its resourceVersion), as ListProtobuf sends it in a list. A
// watch that encodes its events in protobuf and a list that follows so
// encode each revision of an object once between them: the item comes
// from protoItems when a list or another watch encoded it, and an item
// encoded here is kept there while clients list the kind in protobuf
// (see protoItems.offer). ok is false for objects ListProtobuf does not
// encode itself; the caller then encodes the object as usual.
func (s *Storage) ProtoItem(k *registry.Kind, obj runtime.Object) (item []byte, ok bool) {
	k, err := s.served(k)
	if err != nil || k.New != nil || k.NoProtobuf {
		return nil, false
	}
	m, ok := obj.(interface{ Marshal() ([]byte, error) })
	if !ok {
		return nil, false
	}
	acc, err := meta.Accessor(obj)
	if err != nil {
		return nil, false
	}
	rev, err := strconv.ParseInt(acc.GetResourceVersion(), 10, 64)
	if err != nil || rev <= 0 {
		return nil, false
	}
	key := pendingKey{kind: k, key: s.key(k, acc.GetNamespace(), acc.GetName())}
	if b := s.protos.get(key, rev); b != nil {
		return b, true
	}
	b, err := m.Marshal()
	if err != nil {
		return nil, false
	}
	s.protos.offer(key, rev, b)
	return b, true
}

// protoListMeta returns the ListMeta of a typed list whose type is laid
// out as the streaming list encoder requires: TypeMeta (not encoded),
// ListMeta as field 1 and Items as field 2, nothing else.
func protoListMeta(list runtime.Object) (metav1.ListMeta, bool) {
	v := reflect.ValueOf(list)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return metav1.ListMeta{}, false
	}
	v = v.Elem()
	t := v.Type()
	if t.NumField() != 3 ||
		t.Field(0).Type != reflect.TypeFor[metav1.TypeMeta]() || t.Field(0).Tag.Get("protobuf") != "" ||
		t.Field(1).Type != reflect.TypeFor[metav1.ListMeta]() || t.Field(1).Tag.Get("protobuf") != "bytes,1,opt,name=metadata" ||
		t.Field(2).Tag.Get("protobuf") != "bytes,2,rep,name=items" {
		return metav1.ListMeta{}, false
	}
	return v.Field(1).Interface().(metav1.ListMeta), true
}

// ProtoPrefix starts every body of Kubernetes' protobuf encoding.
const ProtoPrefix = "k8s\x00"

// Field tags of the list message (ListMeta 1, Items 2), each a
// length-delimited field.
const (
	tagListMeta = 1<<3 | 2
	tagItem     = 2<<3 | 2
)

// fieldSize is the encoded size of a length-delimited field of n bytes.
func fieldSize(n int) int {
	var b [binary.MaxVarintLen64]byte
	return 1 + binary.PutUvarint(b[:], uint64(n)) + n
}

// ProtoList is the body ListProtobuf answers with. It refers to item
// encodings that are never modified, so it may be written while other
// lists share them.
type ProtoList struct {
	unk   runtime.Unknown // the envelope, Raw left out
	meta  []byte          // the encoded ListMeta
	items [][]byte
	raw   int // the encoded list's size, the envelope's Raw
}

// Len returns the body's length in bytes.
func (b *ProtoList) Len() int {
	return len(ProtoPrefix) + b.unk.Size() + fieldSize(b.raw)
}

// WriteTo writes the body to w.
func (b *ProtoList) WriteTo(w io.Writer) (int64, error) {
	n, err := io.WriteString(w, ProtoPrefix)
	if err != nil {
		return int64(n), err
	}
	m, err := b.unk.MarshalToWriter(w, b.raw, b.writeRaw)
	return int64(n + m), err
}

// writeRaw writes the encoded list: its ListMeta, then each item.
func (b *ProtoList) writeRaw(w io.Writer) (int, error) {
	var head [1 + binary.MaxVarintLen64]byte
	field := func(tag byte, v []byte) (int, error) {
		head[0] = tag
		h := 1 + binary.PutUvarint(head[1:], uint64(len(v)))
		n, err := w.Write(head[:h])
		if err != nil {
			return n, err
		}
		m, err := w.Write(v)
		return n + m, err
	}
	size, err := field(tagListMeta, b.meta)
	if err != nil {
		return size, err
	}
	for _, it := range b.items {
		n, err := field(tagItem, it)
		size += n
		if err != nil {
			return size, err
		}
	}
	return size, nil
}

// Bytes returns the body as one slice.
func (b *ProtoList) Bytes() []byte {
	var buf bytes.Buffer
	buf.Grow(b.Len())
	b.WriteTo(&buf)
	return buf.Bytes()
}

// protoItemsAge is how long an item encoding nobody lists stays in
// protoItems: between one and two of these. A hub whose clients stopped
// listing soon holds none.
const protoItemsAge = 30 * time.Second

// protoItemEntry is one object's encoding at one revision.
type protoItemEntry struct {
	rev int64
	b   []byte
}

// cost is what the entry counts against the budget.
func (e protoItemEntry) cost() int { return len(e.b) + protoEntryOverhead }

// protoItems keeps the protobuf encodings protobuf lists sent, one per
// object (the latest revision listed), within a byte budget. Entries live
// in two generations: every protoItemsAge the current one becomes the old
// one and the old one is dropped; a list that sends an old entry moves it
// to the current generation. While the budget is full the old generation
// goes first, then nothing new is kept until the next turn.
type protoItems struct {
	mu sync.Mutex
	// guards the following fields
	budget   int
	cur, old map[pendingKey]protoItemEntry
	size     int // bytes held by both generations
	turn     *time.Timer
	// lastList is when a protobuf list last used the cache.
	lastList time.Time
}

// protoEntryOverhead approximates what an entry costs beside its bytes:
// its map slot and key.
const protoEntryOverhead = 96

func (c *protoItems) get(key pendingKey, rev int64) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.cur[key]; ok && e.rev == rev {
		return e.b
	}
	e, ok := c.old[key]
	if !ok || e.rev != rev {
		return nil
	}
	delete(c.old, key)
	if c.cur == nil {
		c.cur = make(map[pendingKey]protoItemEntry)
	}
	c.cur[key] = e
	return e.b
}

// listed records that a protobuf list is being answered.
func (c *protoItems) listed() {
	c.mu.Lock()
	c.lastList = time.Now()
	c.mu.Unlock()
}

// offer keeps an item a watch encoded, if a protobuf list was answered
// within protoItemsAge: a hub whose clients do not list in protobuf holds
// nothing for them.
func (c *protoItems) offer(key pendingKey, rev int64, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastList.IsZero() || time.Since(c.lastList) > protoItemsAge {
		return
	}
	c.putLocked(key, rev, b)
}

func (c *protoItems) put(key pendingKey, rev int64, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(key, rev, b)
}

// putLocked keeps b as key's item at rev; c.mu is held.
func (c *protoItems) putLocked(key pendingKey, rev int64, b []byte) {
	if c.budget <= 0 {
		return
	}
	entry := protoItemEntry{rev: rev, b: b}
	if e, ok := c.cur[key]; ok {
		c.size -= e.cost()
		delete(c.cur, key)
	}
	if e, ok := c.old[key]; ok {
		c.size -= e.cost()
		delete(c.old, key)
	}
	if c.size+entry.cost() > c.budget {
		c.dropOld()
	}
	if c.size+entry.cost() > c.budget {
		return
	}
	if c.cur == nil {
		c.cur = make(map[pendingKey]protoItemEntry)
	}
	c.cur[key] = entry
	c.size += entry.cost()
	if c.turn == nil {
		c.turn = time.AfterFunc(protoItemsAge, c.age)
	}
}

// dropOld drops the old generation; c.mu is held.
func (c *protoItems) dropOld() {
	for _, e := range c.old {
		c.size -= e.cost()
	}
	c.old = nil
}

// age drops the old generation and makes the current one old; it comes
// back while anything is held.
func (c *protoItems) age() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropOld()
	c.old, c.cur = c.cur, nil
	if len(c.old) == 0 {
		c.old = nil
		c.turn = nil
		return
	}
	c.turn.Reset(protoItemsAge)
}
