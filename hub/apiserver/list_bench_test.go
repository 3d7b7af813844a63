package apiserver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

func listBenchPod(i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i), Namespace: "default",
			Labels: map[string]string{"app": "bench", "shard": fmt.Sprint(i % 16)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "registry.example/app:1.0", Command: []string{"/app", "--serve"},
			Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}},
		}}},
	}
}

// BenchmarkListPods lists 10,000 pods through the handler, backed by a
// real storage over a real SQLite file: as JSON (kubectl's list, spliced
// from the stored bytes), as protobuf (client-go's typed clients) from
// the item encodings kept (warm), from items encoded afresh for every
// list (cold: a storage that keeps none), and through typed objects, as
// every protobuf list was answered before the item encodings.
func BenchmarkListPods(b *testing.B) {
	st, err := sqlite.Open(sqlite.Config{Path: filepath.Join(b.TempDir(), "db")})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	stg, err := storage.New(storage.Config{Store: st, Kinds: registry.All(), Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := stg.Bootstrap(ctx, storage.BootstrapConfig{AdvertiseAddress: "192.0.2.10"}); err != nil {
		b.Fatal(err)
	}
	createDefaultAccount(b, stg)
	cold, err := storage.New(storage.Config{Store: st, Kinds: registry.All(), Logger: quiet, ListCacheBytes: -1})
	if err != nil {
		b.Fatal(err)
	}
	var pods *registry.Kind
	for _, k := range registry.All() {
		if k.GVK.Group == "" && k.Resource == "pods" {
			pods = k
		}
	}
	const n = 10000
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > n {
					return
				}
				if _, err := stg.Create(ctx, pods, "default", listBenchPod(i), storage.Options{FieldManager: "bench"}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, c := range []struct {
		name, accept string
		api          storage.API
	}{
		{"json", "application/json", stg},
		{"protobuf", mediaProtobuf, stg},
		{"protobuf-cold", mediaProtobuf, cold},
		{"protobuf-typed", mediaProtobuf, typedOnly{stg}},
	} {
		s, err := New(Config{Storage: c.api, Kinds: registry.All(), Authenticator: tokenAuth{}, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		h := s.Handler()
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				r := httptest.NewRequest(http.MethodGet, "/api/v1/namespaces/default/pods", nil)
				r.Header.Set("Authorization", "Bearer good")
				r.Header.Set("Accept", c.accept)
				w := &discardWriter{header: http.Header{}}
				h.ServeHTTP(w, r)
				if w.code != http.StatusOK || w.n < n*300 {
					b.Fatalf("list: %d, %d bytes", w.code, w.n)
				}
			}
		})
	}
}

// discardWriter is a ResponseWriter that counts the body and drops it, so
// the benchmark measures the server's work and not a recorder's growth.
type discardWriter struct {
	header http.Header
	code   int
	n      int
}

func (w *discardWriter) Header() http.Header { return w.header }
func (w *discardWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *discardWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.n += len(p)
	return len(p), nil
}
