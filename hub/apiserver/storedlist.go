package apiserver

import (
	"bytes"
	"context"
	"io"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// jsonLister is implemented by storage that can answer a plain JSON list
// without building typed objects (*storage.Storage does); the body must
// equal the JSON encoding of what List returns.
type jsonLister interface {
	ListJSON(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (body *storage.JSONList, ok bool, err error)
}

// protoLister is implemented by storage that can answer a plain protobuf
// list without building the typed list (*storage.Storage does); the body
// must equal the protobuf encoding of what List returns.
type protoLister interface {
	ListProtobuf(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (body *storage.ProtoList, ok bool, err error)
}

// listBody is a list body written from storage's own encodings.
type listBody interface {
	Len() int
	WriteTo(w io.Writer) (int64, error)
}

// storedList answers a plain JSON or protobuf list (no Table, no partial
// metadata) from the storage's own encodings, where the storage can; nil
// and no error when it cannot, and List must. A JSON list whose audit
// event records the response is written once to memory and recorded; a
// protobuf one is left to List, whose list the event records as JSON.
func (s *Server) storedList(ctx context.Context, t target, out output, opts storage.ListOptions) (listBody, error) {
	audited := auditsResponseBody(ctx)
	if out.as != "" || audited && out.info.MediaType != mediaJSON {
		return nil, nil
	}
	switch out.info.MediaType {
	case mediaJSON:
		if jl, ok := s.cfg.Storage.(jsonLister); ok {
			body, ok, err := jl.ListJSON(ctx, t.kind, t.namespace, opts)
			if err != nil {
				return nil, err
			}
			if ok && audited {
				return auditedList(ctx, body)
			}
			if ok {
				return body, nil
			}
		}
	case mediaProtobuf:
		if pl, ok := s.cfg.Storage.(protoLister); ok {
			body, ok, err := pl.ListProtobuf(ctx, t.kind, t.namespace, opts)
			if err != nil {
				return nil, err
			}
			if ok {
				return body, nil
			}
		}
	}
	return nil, nil
}

// auditedList writes body to memory, records it as the response of the
// request's audit event and returns it.
func auditedList(ctx context.Context, body listBody) (listBody, error) {
	var buf bytes.Buffer
	buf.Grow(body.Len())
	if _, err := body.WriteTo(&buf); err != nil {
		return nil, err
	}
	auditFrom(ctx).respBody = buf.Bytes()
	return bytesBody(buf.Bytes()), nil
}

// bytesBody is a list body already in memory.
type bytesBody []byte

func (b bytesBody) Len() int { return len(b) }

func (b bytesBody) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(b)
	return int64(n), err
}
