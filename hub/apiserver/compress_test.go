package apiserver

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

func TestAcceptsGzip(t *testing.T) {
	for in, want := range map[string]bool{
		"":                   false,
		"gzip":               true,
		"deflate, gzip":      true,
		"GZIP;q=0.5":         true,
		"gzip;q=0":           false,
		"br, identity":       false,
		"gzipx":              false,
		"identity, gzip;q=1": true,
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if in != "" {
			r.Header.Set("Accept-Encoding", in)
		}
		if got := acceptsGzip(r); got != want {
			t.Errorf("Accept-Encoding %q: %v, want %v", in, got, want)
		}
	}
}

// Large responses go out gzipped to clients that accept it, as
// kube-apiserver sends them; the content is the same.
func TestLargeResponsesCompressed(t *testing.T) {
	stg, quiet := newTestStorage(t)
	ctx := context.Background()
	var cms *registry.Kind
	for _, k := range registry.All() {
		if k.GVK.Group == "" && k.Resource == "configmaps" {
			cms = k
		}
	}
	big := string(bytes.Repeat([]byte("x"), 60<<10))
	for i := range 3 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("c", i)}, Data: map[string]string{"k": big}}
		if _, err := stg.Create(ctx, cms, "default", cm, storage.Options{FieldManager: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := New(Config{Storage: stg, Kinds: registry.All(), Authenticator: tokenAuth{}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	typed, err := New(Config{Storage: typedOnly{stg}, Kinds: registry.All(), Authenticator: tokenAuth{}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	get := func(h http.Handler, path, accept, encoding string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("Authorization", "Bearer good")
		r.Header.Set("Accept", accept)
		if encoding != "" {
			r.Header.Set("Accept-Encoding", encoding)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, c := range []struct {
		name, path, accept string
		h                  http.Handler
	}{
		{"list from stored JSON", "/api/v1/namespaces/default/configmaps", "application/json", srv.Handler()},
		{"typed list", "/api/v1/namespaces/default/configmaps", "application/json", typed.Handler()},
		{"yaml list", "/api/v1/namespaces/default/configmaps", "application/yaml", srv.Handler()},
	} {
		plain := get(c.h, c.path, c.accept, "")
		if plain.Code != http.StatusOK || plain.Header().Get("Content-Encoding") != "" {
			t.Fatalf("%s without gzip: %d, Content-Encoding %q", c.name, plain.Code, plain.Header().Get("Content-Encoding"))
		}
		if n, _ := strconv.Atoi(plain.Header().Get("Content-Length")); n != plain.Body.Len() || n < gzipThreshold {
			t.Fatalf("%s: Content-Length %q for a body of %d bytes", c.name, plain.Header().Get("Content-Length"), plain.Body.Len())
		}
		zipped := get(c.h, c.path, c.accept, "gzip")
		if zipped.Code != http.StatusOK || zipped.Header().Get("Content-Encoding") != "gzip" || zipped.Header().Get("Content-Length") != "" {
			t.Fatalf("%s with gzip: %d, Content-Encoding %q, Content-Length %q", c.name, zipped.Code,
				zipped.Header().Get("Content-Encoding"), zipped.Header().Get("Content-Length"))
		}
		if zipped.Body.Len() > plain.Body.Len()/10 {
			t.Errorf("%s: %d bytes gzipped from %d", c.name, zipped.Body.Len(), plain.Body.Len())
		}
		zr, err := gzip.NewReader(zipped.Body)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(body, plain.Body.Bytes()) {
			t.Errorf("%s: gunzipped body differs from the plain one", c.name)
		}
	}
	// Small responses stay plain.
	one := get(srv.Handler(), "/api/v1/namespaces/default/configmaps/c0", "application/json", "gzip")
	if one.Code != http.StatusOK || one.Header().Get("Content-Encoding") != "" {
		t.Errorf("GET of one object: %d, Content-Encoding %q", one.Code, one.Header().Get("Content-Encoding"))
	}
}
