package apiserver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

// watchListServer serves the API over a fresh store and returns a client.
func watchListServer(t *testing.T) (kubernetes.Interface, *rest.Config) {
	t.Helper()
	st, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	stg, err := storage.New(storage.Config{Store: st, Kinds: registry.All(), Logger: quiet, BookmarkInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Storage: stg, Kinds: registry.All(), Authenticator: tokenAuth{}, Logger: quiet, Version: version.Info{GitVersion: "v1.37.2"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(s.Handler())
	t.Cleanup(srv.Close)
	cfg := &rest.Config{Host: srv.URL, BearerToken: "good", QPS: -1, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cs, cfg
}

func createConfigMaps(ctx context.Context, t *testing.T, cs kubernetes.Interface, prefix string, n int) string {
	t.Helper()
	var rv string
	for i := 0; i < n; i++ {
		cm, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%d", prefix, i), Labels: map[string]string{"i": strconv.Itoa(i % 2)}}},
			metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rv = cm.ResourceVersion
	}
	return rv
}

func nextEvent(ctx context.Context, t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("watch closed")
		}
		return ev
	case <-ctx.Done():
		t.Fatal("no watch event within the deadline")
	}
	return watch.Event{}
}

// TestWatchListEventSequence: a watch with sendInitialEvents=true starts
// with one ADDED event per object matching its selector as of one
// revision, then a BOOKMARK at that revision annotated
// k8s.io/initial-events-end, then the changes after that revision.
func TestWatchListEventSequence(t *testing.T) {
	cs, _ := watchListServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	createConfigMaps(ctx, t, cs, "a", 10)

	for _, tc := range []struct {
		name     string
		rv       string
		selector string
		want     int
	}{
		{"most recent", "", "", 10},
		{"not older than", "1", "", 10},
		{"any", "0", "", 10},
		{"selector", "", "i=1", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := cs.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{
				ResourceVersion: tc.rv, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
				SendInitialEvents: ptr.To(true), AllowWatchBookmarks: true, LabelSelector: tc.selector})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			seen := map[string]bool{}
			var maxRV int64
			for len(seen) < tc.want {
				ev := nextEvent(ctx, t, w)
				cm, ok := ev.Object.(*corev1.ConfigMap)
				if ev.Type != watch.Added || !ok || seen[cm.Name] {
					t.Fatalf("event %d: %s %+v, want a new ADDED ConfigMap", len(seen), ev.Type, ev.Object)
				}
				seen[cm.Name] = true
				rv, _ := strconv.ParseInt(cm.ResourceVersion, 10, 64)
				maxRV = max(maxRV, rv)
			}
			ev := nextEvent(ctx, t, w)
			m, err := meta.Accessor(ev.Object)
			if err != nil || ev.Type != watch.Bookmark {
				t.Fatalf("after the initial events: %s %+v, want BOOKMARK", ev.Type, ev.Object)
			}
			if m.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
				t.Fatalf("bookmark annotations %v, want %s: true", m.GetAnnotations(), metav1.InitialEventsAnnotationKey)
			}
			bmRV, _ := strconv.ParseInt(m.GetResourceVersion(), 10, 64)
			if bmRV < maxRV {
				t.Fatalf("bookmark resourceVersion %d older than an initial object's %d", bmRV, maxRV)
			}
			// The watch goes on from the bookmark's revision.
			cm, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "after-" + strings.ReplaceAll(tc.name, " ", "-"), Labels: map[string]string{"i": "1"}}},
				metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ev = nextEvent(ctx, t, w)
			got, ok := ev.Object.(*corev1.ConfigMap)
			if ev.Type != watch.Added || !ok || got.Name != cm.Name || got.ResourceVersion != cm.ResourceVersion {
				t.Fatalf("after the bookmark: %s %+v, want ADDED %s", ev.Type, ev.Object, cm.Name)
			}
			if err := cs.CoreV1().ConfigMaps("default").Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if ev = nextEvent(ctx, t, w); ev.Type != watch.Deleted {
				t.Fatalf("after delete: %s, want DELETED", ev.Type)
			}
		})
	}
}

// TestWatchListWithoutBookmarksOrInitialEvents: without
// allowWatchBookmarks the initial events come without the closing
// bookmark, and sendInitialEvents=false starts from the resourceVersion
// (the current one for "") without them, as in Kubernetes.
func TestWatchListWithoutBookmarksOrInitialEvents(t *testing.T) {
	cs, _ := watchListServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	createConfigMaps(ctx, t, cs, "b", 3)

	w, err := cs.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, SendInitialEvents: ptr.To(true)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := 0; i < 3; i++ {
		if ev := nextEvent(ctx, t, w); ev.Type != watch.Added {
			t.Fatalf("event %d: %s, want ADDED", i, ev.Type)
		}
	}
	w2, err := cs.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, SendInitialEvents: ptr.To(false), AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Stop()
	createConfigMaps(ctx, t, cs, "c", 1)
	for _, w := range []watch.Interface{w, w2} {
		ev := nextEvent(ctx, t, w)
		if cm, ok := ev.Object.(*corev1.ConfigMap); ev.Type != watch.Added || !ok || cm.Name != "c0" {
			t.Fatalf("next event %s %+v, want ADDED c0", ev.Type, ev.Object)
		}
	}
}

// TestWatchListMetadata: a metadata-only streaming list (what garbage
// collectors' informers send) ends with a PartialObjectMetadata bookmark
// that keeps the initial-events-end annotation.
func TestWatchListMetadata(t *testing.T) {
	cs, cfg := watchListServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	createConfigMaps(ctx, t, cs, "m", 2)
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := mc.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace("default").
		Watch(ctx, metav1.ListOptions{ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
			SendInitialEvents: ptr.To(true), AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := 0; i < 2; i++ {
		if ev := nextEvent(ctx, t, w); ev.Type != watch.Added {
			t.Fatalf("event %d: %s, want ADDED", i, ev.Type)
		}
	}
	ev := nextEvent(ctx, t, w)
	p, ok := ev.Object.(*metav1.PartialObjectMetadata)
	if ev.Type != watch.Bookmark || !ok || p.Annotations[metav1.InitialEventsAnnotationKey] != "true" {
		t.Fatalf("after the initial events: %s %+v, want an annotated PartialObjectMetadata BOOKMARK", ev.Type, ev.Object)
	}
}

// TestWatchListValidation: streaming list options are checked as
// Kubernetes checks them, with its messages, before anything is served.
func TestWatchListValidation(t *testing.T) {
	cs, _ := watchListServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cms := cs.CoreV1().ConfigMaps("default")
	for _, tc := range []struct {
		name  string
		watch bool
		opts  metav1.ListOptions
		field string
		msg   string
	}{
		{"no match", true, metav1.ListOptions{SendInitialEvents: ptr.To(true), AllowWatchBookmarks: true},
			"resourceVersionMatch", "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"},
		{"exact match", true, metav1.ListOptions{SendInitialEvents: ptr.To(true), ResourceVersion: "1",
			ResourceVersionMatch: metav1.ResourceVersionMatchExact, AllowWatchBookmarks: true},
			"resourceVersionMatch", `Unsupported value: "Exact": supported values: "NotOlderThan"`},
		{"match without initial events", true, metav1.ListOptions{ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan},
			"resourceVersionMatch", "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"},
		{"list", false, metav1.ListOptions{SendInitialEvents: ptr.To(true)},
			"sendInitialEvents", "sendInitialEvents is forbidden for list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.watch {
				var w watch.Interface
				w, err = cms.Watch(ctx, tc.opts)
				if err == nil {
					w.Stop()
				}
			} else {
				_, err = cms.List(ctx, tc.opts)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("got %v, want 422 Invalid", err)
			}
			st := err.(apierrors.APIStatus).Status()
			if !strings.Contains(st.Message, tc.msg) || st.Details == nil || len(st.Details.Causes) == 0 ||
				st.Details.Causes[0].Field != tc.field {
				t.Fatalf("status %+v, want message with %q and cause field %q", st, tc.msg, tc.field)
			}
		})
	}
}
