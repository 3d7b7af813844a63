package apiserver

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestEncodeUnstructuredJSON checks that a custom object is written as
// the JSON serializer writes it, with values encoding/json escapes or
// rewrites.
func TestEncodeUnstructuredJSON(t *testing.T) {
	s, err := New(Config{Storage: untouchable{t: t}, Kinds: testKinds, Authenticator: tokenAuth{}})
	if err != nil {
		t.Fatal(err)
	}
	info, ok := s.serializerFor(mediaJSON)
	if !ok {
		t.Fatal("no JSON serializer")
	}
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w"}, "s": "<a href=\"x\">&amp;</a>", "sep": "a\u2028b\u2029", "bad": "a\xffb",
		"n": []any{int64(-1), 1.5, 1e21, 1e-7, nil, true, map[string]any{}}, "empty": []any{}, "ctl": "\x00\x1f\t\n"}}
	var want, got strings.Builder
	if err := info.Serializer.Encode(u, &want); err != nil {
		t.Fatal(err)
	}
	if err := s.encode(output{info: info}, u, schema.GroupVersion{Group: "example.com", Version: "v1"}, &got); err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Errorf("encoded\n%q\nwant\n%q", got.String(), want.String())
	}
}
