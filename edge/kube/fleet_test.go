package kube

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// TestImageStagingsAsJSON: custom resources have no protobuf, so the
// client asks for and decodes JSON.
func TestImageStagingsAsJSON(t *testing.T) {
	var accept string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accept = r.Header.Get("Accept")
		if r.URL.Path != "/apis/fleet.tether.io/v1alpha1/imagestagings" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"apiVersion":"fleet.tether.io/v1alpha1","kind":"ImageStagingList","metadata":{"resourceVersion":"7"},
			"items":[{"apiVersion":"fleet.tether.io/v1alpha1","kind":"ImageStaging","metadata":{"name":"pos"},
			"spec":{"images":["r/app:v1"],"bandwidthLimit":"128Ki","window":{"start":"01:00","duration":"4h"}}}]}`))
	}))
	defer srv.Close()
	c, err := New(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{
		AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json", ContentType: "application/vnd.kubernetes.protobuf"}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.ImageStagings().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if accept != "application/json" {
		t.Errorf("Accept %q, want application/json", accept)
	}
	if l.ResourceVersion != "7" || len(l.Items) != 1 || l.Items[0].Name != "pos" || l.Items[0].Spec.BandwidthLimit.Value() != 128<<10 ||
		l.Items[0].Spec.Window.Duration.Hours() != 4 {
		t.Errorf("list %+v", l)
	}
}
