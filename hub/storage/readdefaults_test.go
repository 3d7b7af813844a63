package storage

import (
	"reflect"
	"testing"
)

// TestJSONEqual holds jsonEqual to reflect.DeepEqual on the values of
// unstructured objects, including the nil and empty maps and slices
// DeepEqual tells apart, mixed number types and values of other types.
func TestJSONEqual(t *testing.T) {
	values := []any{
		nil, "", "a", int64(1), int64(2), float64(1), float64(2), true, false, int(1),
		map[string]any(nil), map[string]any{}, map[string]any{"a": int64(1)}, map[string]any{"a": float64(1)},
		map[string]any{"a": nil}, map[string]any{"b": nil},
		map[string]any{"a": map[string]any{"b": []any{"x", int64(1)}}},
		map[string]any{"a": map[string]any{"b": []any{"x", int64(2)}}},
		[]any(nil), []any{}, []any{"a"}, []any{"a", "b"}, []any{map[string]any{}}, []any{map[string]any(nil)},
		[]string{"a"}, map[string]string{"a": "b"},
	}
	for i, a := range values {
		for j, b := range values {
			if got, want := jsonEqual(a, b), reflect.DeepEqual(a, b); got != want {
				t.Errorf("jsonEqual(%#v, %#v) [%d, %d] = %v, reflect.DeepEqual says %v", a, b, i, j, got, want)
			}
		}
	}
}
