package apiserver

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// minWatchTimeout is the shortest default watch duration; each watch
// without timeoutSeconds lasts between one and two times this.
const minWatchTimeout = 30 * time.Minute

func (s *Server) watch(w http.ResponseWriter, r *http.Request, t target) {
	out, err := s.negotiateKind(r, t.kind, "Table", "PartialObjectMetadata")
	if err != nil {
		s.writeError(w, err)
		return
	}
	opts, err := decodeListOptions(r.URL.Query())
	if err != nil {
		s.writeError(w, err)
		return
	}
	timeout := minWatchTimeout + time.Duration(rand.Int64N(int64(minWatchTimeout)))
	if opts.TimeoutSeconds != nil && *opts.TimeoutSeconds > 0 {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	wi, err := s.cfg.Storage.Watch(ctx, t.kind, t.namespace, storage.WatchOptions{
		Label: opts.LabelSelector, Field: opts.FieldSelector,
		ResourceVersion: opts.ResourceVersion, AllowBookmarks: opts.AllowWatchBookmarks,
		SendInitialEvents: opts.SendInitialEvents,
		// Events are only read and encoded here, so every watch of a kind
		// can use one decoded object per change.
		Shared: true})
	if err != nil {
		s.writeError(w, err)
		return
	}
	defer wi.Stop()

	framed := out.info.StreamSerializer
	if framed == nil {
		info, _ := s.serializerFor(mediaJSON)
		out.info = info
		framed = info.StreamSerializer
	}
	ct := out.info.MediaType
	if out.info.MediaType == mediaProtobuf {
		ct = mediaProtobuf + ";stream=watch"
	}
	fw := framed.Framer.NewFrameWriter(w)
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}

	gv := t.kind.GVK.GroupVersion()
	first := true
	// write sends one event; false ends the watch. more says another
	// event is ready: the flush waits for the last of them.
	write := func(ev watch.Event, more bool) bool {
		obj := ev.Object
		ogv := gv
		switch {
		case ev.Type == watch.Error:
			st := toStatus(apierrors.FromObject(obj)).ErrStatus
			obj, ogv = &st, schema.GroupVersion{Version: "v1"}
		case ev.Type == watch.Bookmark && out.as == "Table":
			// A bookmark carries only a resourceVersion, in the form the
			// client asked for.
			m, err := meta.Accessor(obj)
			if err != nil {
				return false
			}
			tbl := &metav1.Table{ListMeta: metav1.ListMeta{ResourceVersion: m.GetResourceVersion()}}
			tbl.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind("Table"))
			obj, ogv = tbl, schema.GroupVersion{Group: metav1.GroupName, Version: out.asVersion}
		case out.as == "Table":
			tbl, err := s.toTable(t.kind, obj, r.URL.Query().Get("includeObject"), first)
			if err != nil {
				s.log.Error("apiserver: convert watch event to table", "error", err)
				return false
			}
			first = false
			tbl.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind("Table"))
			obj, ogv = tbl, schema.GroupVersion{Group: metav1.GroupName, Version: out.asVersion}
		case out.as == "PartialObjectMetadata":
			p, err := toPartial(obj)
			if err != nil {
				s.log.Error("apiserver: convert watch event to metadata", "error", err)
				return false
			}
			obj, ogv = p, schema.GroupVersion{Group: metav1.GroupName, Version: out.asVersion}
		}
		// encodeEvent encodes the event into buffers that go back to the
		// pool once the frame is written (or copied into the cache).
		var bufs *eventBuffers
		defer func() {
			if bufs != nil {
				s.putEventBuffers(bufs)
			}
		}()
		encodeEvent := func() ([]byte, error) {
			if bufs == nil {
				bufs = s.getEventBuffers()
			}
			obuf, ebuf := &bufs.object, &bufs.event
			obuf.Reset()
			if err := s.encodeEventObject(t, out, ev.Type, obj, ogv, obuf); err != nil {
				return nil, err
			}
			we := &metav1.WatchEvent{Type: string(ev.Type), Object: runtime.RawExtension{Raw: obuf.Bytes()}}
			ebuf.Reset()
			if err := framed.Serializer.Encode(we, ebuf); err != nil {
				return nil, err
			}
			return ebuf.Bytes(), nil
		}
		var b []byte
		var err error
		switch ev.Type {
		case watch.Added, watch.Modified, watch.Deleted:
			if out.as != "" {
				b, err = encodeEvent()
				break
			}
			// The same change reaches every watch of the kind: encode it
			// once per output format.
			key := frameKey{obj: obj, typ: ev.Type, media: out.info.MediaType, gv: ogv}
			b, err = s.frames.get(key, func() ([]byte, error) {
				b, err := encodeEvent()
				return bytes.Clone(b), err
			})
		default:
			b, err = encodeEvent()
		}
		if err != nil {
			s.log.Error("apiserver: encode watch event", "error", err)
			return false
		}
		if _, err := fw.Write(b); err != nil {
			return false
		}
		if !more && flusher != nil {
			flusher.Flush()
		}
		return ev.Type != watch.Error
	}
	// The storage's watches run in this goroutine; others are read from
	// their channel.
	if st, ok := wi.(streamer); ok {
		st.Stream(write)
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-wi.ResultChan():
			if !ok || !write(ev, len(wi.ResultChan()) > 0) {
				return
			}
		}
	}
}

// streamer is a watch that delivers its events in the caller's goroutine
// (see storage.Storage.Watch).
type streamer interface {
	Stream(send func(ev watch.Event, more bool) bool)
}

// eventBuffers are what a watch encodes one event in: the object, then
// the watch event that wraps it.
type eventBuffers struct{ object, event bytes.Buffer }

// protoItemer is implemented by storage that keeps the protobuf encoding
// of the objects its protobuf lists send (*storage.Storage does): a watch
// event's object, encoded as the list item of its revision, is then
// encoded once for the watches and the lists that follow.
type protoItemer interface {
	ProtoItem(k *registry.Kind, obj runtime.Object) ([]byte, bool)
}

// encodeEventObject writes the object of a watch event of t's kind as out
// encodes it in gv. A protobuf event that adds or modifies an object in
// t's own version takes the object's encoding from the storage's list
// items (protoItemer), in Kubernetes' protobuf envelope: the same bytes as
// the protobuf serializer writes.
func (s *Server) encodeEventObject(t target, out output, typ watch.EventType, obj runtime.Object, gv schema.GroupVersion, w *bytes.Buffer) error {
	pi, ok := s.cfg.Storage.(protoItemer)
	if !ok || out.as != "" || out.info.MediaType != mediaProtobuf || gv != t.kind.GVK.GroupVersion() ||
		typ != watch.Added && typ != watch.Modified {
		return s.encode(out, obj, gv, w)
	}
	item, ok := pi.ProtoItem(t.kind, obj)
	if !ok {
		return s.encode(out, obj, gv, w)
	}
	gvk, err := s.kindOf(obj, gv)
	if err != nil {
		return err
	}
	unk := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind}, Raw: item}
	n := unk.Size()
	w.Grow(len(storage.ProtoPrefix) + n)
	w.WriteString(storage.ProtoPrefix)
	b := w.AvailableBuffer()[:n]
	if _, err := unk.MarshalToSizedBuffer(b); err != nil {
		return err
	}
	w.Write(b)
	return nil
}

// maxPooledEventBuffer is the largest buffer kept for the next event: a
// rare large object's buffers are let go rather than held by the pool.
const maxPooledEventBuffer = 64 << 10

func (s *Server) getEventBuffers() *eventBuffers {
	if b, ok := s.eventBufs.Get().(*eventBuffers); ok {
		return b
	}
	return &eventBuffers{}
}

func (s *Server) putEventBuffers(b *eventBuffers) {
	if b.object.Cap() > maxPooledEventBuffer || b.event.Cap() > maxPooledEventBuffer {
		return
	}
	s.eventBufs.Put(b)
}
