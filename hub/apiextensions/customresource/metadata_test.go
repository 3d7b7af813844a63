package customresource

import (
	"math/rand/v2"
	"reflect"
	"testing"

	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// roundTrip does what coerce does to metadata without the shortcut.
func roundTrip(t *testing.T, metadata any, drop, track bool) (out any, unknown []string, err error) {
	t.Helper()
	obj := map[string]any{"metadata": runtime.DeepCopyJSONValue(metadata)}
	om, found, unknown, err := schemaobjectmeta.GetObjectMetaWithOptions(obj, schemaobjectmeta.ObjectMetaOptions{
		DropMalformedFields: drop, ReturnUnknownFieldPaths: track})
	if err != nil || !found {
		return nil, unknown, err
	}
	if err := schemaobjectmeta.SetObjectMeta(obj, om); err != nil {
		return nil, nil, err
	}
	return obj["metadata"], unknown, nil
}

// TestRoundTripsAsIs checks, over metadata built at random from valid and
// invalid parts, that metadata roundTripsAsIs accepts comes out of the
// ObjectMeta round trip unchanged with no unknown field, whatever the
// options, converts to ObjectMeta (validation's check), and that the round trip's own output of common metadata is
// accepted.
func TestRoundTripsAsIs(t *testing.T) {
	entry := func(r *rand.Rand) any {
		e := map[string]any{}
		pick(r, e, "manager", "kubectl", "", int64(3))
		pick(r, e, "operation", "Update", "Apply", "")
		pick(r, e, "apiVersion", "example.com/v1", 1.5)
		pick(r, e, "time", "2024-01-02T03:04:05Z", "2024-01-02T03:04:05.123Z", "2024-01-02T04:04:05+01:00", nil, "x")
		pick(r, e, "fieldsType", "FieldsV1", "")
		pick(r, e, "fieldsV1", map[string]any{}, map[string]any{"f:spec": map[string]any{".": map[string]any{}, "f:a": map[string]any{}}},
			map[string]any{"f:a": int64(1)}, map[string]any{"f:a": nil}, nil, map[string]any(nil), "x", map[string]any{"f:\xff": map[string]any{}})
		pick(r, e, "subresource", "status", "", nil)
		rare(r, e, "bogus", "x")
		return e
	}
	parts := func(r *rand.Rand) map[string]any {
		m := map[string]any{}
		for _, k := range []string{"name", "generateName", "namespace", "selfLink", "uid", "resourceVersion"} {
			pick(r, m, k, "a-b", "", int64(5), nil, "a\xffb", true)
		}
		pick(r, m, "generation", int64(1), int64(7), int64(0), float64(2), "1", nil, int64(-3))
		pick(r, m, "creationTimestamp", "2024-01-02T03:04:05Z", "2024-01-02T03:04:05.5Z", "2024-01-02T04:04:05+01:00",
			"0001-01-01T00:00:00Z", "", nil, int64(5), "garbage")
		for _, k := range []string{"labels", "annotations"} {
			pick(r, m, k, map[string]any{}, map[string]any{"a": "b", "c": ""}, map[string]any{"a": int64(1)}, nil,
				map[string]any(nil), map[string]any{"a\xff": "b"}, map[string]any{"a": nil}, []any{"a"})
		}
		pick(r, m, "finalizers", []any{}, []any{"a/b"}, []any{int64(1)}, nil, []any{"a\xff"}, []any{nil}, "a")
		mfs := []any{[]any{}, nil, []any{nil}, []any{map[string]any{}}, "x"}
		for range 3 {
			mfs = append(mfs, []any{entry(r)}, []any{entry(r), entry(r)})
		}
		pick(r, m, "managedFields", mfs...)
		rare(r, m, "ownerReferences", []any{map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}})
		rare(r, m, "deletionTimestamp", "2024-01-02T03:04:05Z")
		rare(r, m, "unknownField", "x")
		return m
	}
	r := rand.New(rand.NewPCG(1, 2))
	accepted := 0
	for range 20000 {
		m := parts(r)
		if !roundTripsAsIs(m) {
			continue
		}
		accepted++
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &metav1.ObjectMeta{}); err != nil {
			t.Fatalf("accepted %#v\nas ObjectMeta: %v", m, err)
		}
		for _, opts := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			out, unknown, err := roundTrip(t, m, opts[0], opts[1])
			if err != nil || len(unknown) > 0 || !reflect.DeepEqual(out, m) {
				t.Fatalf("accepted %#v\nround trip (drop %v, track %v): %#v, unknown %v, err %v", m, opts[0], opts[1], out, unknown, err)
			}
		}
	}
	t.Logf("%d of 20000 accepted", accepted)
	if accepted < 200 {
		t.Errorf("only %d of the random metadata accepted: the test covers too little", accepted)
	}
	if roundTripsAsIs(nil) || roundTripsAsIs("x") || roundTripsAsIs(map[string]any(nil)) {
		t.Error("accepted metadata that is not an object")
	}

	// What a create stores: the round trip's own output is accepted.
	stored := map[string]any{"name": "w", "namespace": "default", "uid": "0c6d", "generation": int64(1),
		"creationTimestamp": "2024-01-02T03:04:05Z", "labels": map[string]any{"app": "x"}, "finalizers": []any{"example.com/f"},
		"managedFields": []any{map[string]any{"manager": "kubectl", "operation": "Update", "apiVersion": "example.com/v1",
			"time": "2024-01-02T03:04:05Z", "fieldsType": "FieldsV1",
			"fieldsV1": map[string]any{"f:spec": map[string]any{".": map[string]any{}, "f:color": map[string]any{}}}}}}
	out, _, err := roundTrip(t, stored, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if !roundTripsAsIs(out) {
		t.Errorf("round trip output not accepted: %#v", out)
	}
}

// pick sets m[key] to one of values, or leaves key out, at random: the
// first value, a valid one, more often than the others.
func pick(r *rand.Rand, m map[string]any, key string, values ...any) {
	switch n := r.IntN(20); {
	case n < 9:
	case n < 18:
		m[key] = runtime.DeepCopyJSONValue(values[0])
	default:
		m[key] = runtime.DeepCopyJSONValue(values[r.IntN(len(values))])
	}
}

// rare sets m[key] to value once in twenty times.
func rare(r *rand.Rand, m map[string]any, key string, value any) {
	if r.IntN(20) == 0 {
		m[key] = runtime.DeepCopyJSONValue(value)
	}
}

// TestDefaultOnReadMetadata checks the metadata an object read from
// storage ends with, with and without the shortcut: a missing generation
// becomes 1 (in a map of its own: the map read stays as it was), unknown
// and malformed fields are dropped, metadata already in form is kept.
func TestDefaultOnReadMetadata(t *testing.T) {
	k := widgetKinds(t)["v1"]
	for _, c := range []struct{ in, want string }{
		{"{name: w, namespace: default}", "{name: w, namespace: default, generation: 1}"},
		{"{name: w, namespace: default, generation: 3, labels: {a: b}}", "{name: w, namespace: default, generation: 3, labels: {a: b}}"},
		{"{name: w, namespace: default, bogus: x, labels: {}}", "{name: w, namespace: default, generation: 1}"},
		{"{name: w, namespace: default, generation: 2, labels: 5}", "{name: w, namespace: default, generation: 2}"},
	} {
		u := obj(t, "apiVersion: example.tether.dev/v1\nkind: Widget\nmetadata: "+c.in+"\nspec: {image: nginx}\n")
		read := u.Object["metadata"]
		before := runtime.DeepCopyJSONValue(read)
		k.DefaultOnRead(u)
		want := obj(t, "apiVersion: example.tether.dev/v1\nkind: Widget\nmetadata: "+c.want+"\nspec: {image: nginx}\n")
		if !reflect.DeepEqual(u.Object["metadata"], want.Object["metadata"]) {
			t.Errorf("%s: metadata %v, want %v", c.in, u.Object["metadata"], want.Object["metadata"])
		}
		if !reflect.DeepEqual(read, before) {
			t.Errorf("%s: the metadata map read changed to %v", c.in, read)
		}
	}
}
