package apiserver

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

// TestMetadataWatchBookmarks: a metadata-only watch (what garbage
// collectors use) must get its bookmarks as PartialObjectMetadata too, or
// client-go fails to decode them, drops the watch and lists again.
func TestMetadataWatchBookmarks(t *testing.T) {
	st, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	stg, err := storage.New(storage.Config{Store: st, Kinds: registry.All(), Logger: quiet, BookmarkInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Storage: stg, Kinds: registry.All(), Authenticator: tokenAuth{}, Logger: quiet, Version: version.Info{GitVersion: "v1.37.2"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(s.Handler())
	t.Cleanup(srv.Close)
	mc, err := metadata.NewForConfig(&rest.Config{Host: srv.URL, BearerToken: "good", TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := mc.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace("default").
		Watch(ctx, metav1.ListOptions{ResourceVersion: "0", AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for bookmarks := 0; bookmarks < 2; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch closed")
			}
			switch ev.Type {
			case watch.Bookmark:
				p, ok := ev.Object.(*metav1.PartialObjectMetadata)
				if !ok || p.ResourceVersion == "" {
					t.Fatalf("bookmark object %T %+v", ev.Object, ev.Object)
				}
				bookmarks++
			case watch.Error:
				t.Fatalf("watch error: %v", ev.Object)
			}
		case <-ctx.Done():
			t.Fatal("no bookmarks within 10s")
		}
	}
}
