package apiserver

import (
	"bytes"
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/registry"
)

// TestWatchProtobufItems: a protobuf watch event whose object comes from
// the storage's list items (encodeEventObject) is byte for byte what the
// protobuf serializer writes, and a client-go protobuf watch and list
// read the same objects as before.
func TestWatchProtobufItems(t *testing.T) {
	h := newHub(t)
	ctx := context.Background()
	cfg := rest.CopyConfig(h.cfg)
	cfg.ContentType = mediaProtobuf
	cfg.AcceptContentTypes = mediaProtobuf
	pb, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pods := pb.CoreV1().Pods("default")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w", Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A protobuf list puts the storage's item cache in use.
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("protobuf list: %v", err)
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, TimeoutSeconds: ptr.To(int64(10))})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	cur := list.Items[0].DeepCopy()
	cur.Labels["app"] = "y"
	updated, err := pods.Update(ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		got, ok := ev.Object.(*corev1.Pod)
		if ev.Type != watch.Modified || !ok || got.ResourceVersion != updated.ResourceVersion || got.Labels["app"] != "y" {
			t.Fatalf("event %s %+v", ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no protobuf watch event")
	}
	list, err = pods.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 || list.Items[0].ResourceVersion != updated.ResourceVersion || list.Items[0].Labels["app"] != "y" {
		t.Fatalf("protobuf list after the update: %v %+v", err, list)
	}

	// The envelope around the stored item is the serializer's.
	k := registry.Lookup(schema.GroupVersionResource{Version: "v1", Resource: "pods"})
	info, ok := h.api.serializerFor(mediaProtobuf)
	if k == nil || !ok {
		t.Fatal("no pods kind or protobuf serializer")
	}
	out := output{info: info}
	gv := k.GVK.GroupVersion()
	obj, err := h.api.cfg.Storage.Get(ctx, k, "default", "w")
	if err != nil {
		t.Fatal(err)
	}
	var want, got bytes.Buffer
	if err := h.api.encode(out, obj, gv, &want); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []watch.EventType{watch.Added, watch.Modified, watch.Deleted} {
		got.Reset()
		if err := h.api.encodeEventObject(target{kind: k, namespace: "default"}, out, typ, obj, gv, &got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("%s: the event's object differs from the serializer's encoding (%d and %d bytes)", typ, got.Len(), want.Len())
		}
	}
}
