package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tether-edge/tether/store"
)

// TestWrittenStateMatchesDecode checks that the state a create hands to
// the decode cache is the one decoding the stored bytes gives, defaults on
// read included, and that values whose encoding does not read back as
// themselves are left to the decoder.
func TestWrittenStateMatchesDecode(t *testing.T) {
	s, reg, _ := customFixture(t)
	reg.SetCustom(widgetOwner, widgetKinds("blue"))
	k1, k2 := widgetKind(t, reg, "v1"), widgetKind(t, reg, "v2")
	for name, spec := range map[string]map[string]any{
		"strings":   {"color": "red", "data": map[string]any{"a": "x", "b": "y"}},
		"defaulted": {"size": int64(3)},
		"numbers": {"i": int64(-7), "f": 1.5, "whole": float64(4), "big": 1e21, "huge": 1e20, "negzero": math.Copysign(0, -1),
			"tiny": 1e-7, "max": float64(math.MaxInt64)},
		"nesting": {"list": []any{map[string]any{"x": nil}, []any{}, true, false, nil}, "empty": map[string]any{},
			"nilmap": map[string]any(nil), "nilslice": []any(nil)},
	} {
		t.Run(name, func(t *testing.T) {
			u := widget("v1", "w-"+name, spec)
			u.SetNamespace("default")
			u.SetLabels(map[string]string{"app": "x"})
			got, gotSame, ok := s.writtenState(k1, u)
			if !ok {
				t.Fatal("writtenState: not ok")
			}
			enc, err := s.encode(k1, u)
			if err != nil {
				t.Fatal(err)
			}
			enc.Revision = 5
			want, wantSame, err := s.decodeReporting(k1, enc)
			if err != nil {
				t.Fatal(err)
			}
			asU(t, got).SetResourceVersion("5")
			if !reflect.DeepEqual(asU(t, got).Object, asU(t, want).Object) {
				t.Errorf("written state\n%#v\ndecoded\n%#v", asU(t, got).Object, asU(t, want).Object)
			}
			if gotSame != wantSame {
				t.Errorf("same: written %v, decoded %v", gotSame, wantSame)
			}
		})
	}
	for name, v := range map[string]any{
		"invalid UTF-8 value": "a\xffb",
		"int":                 7,
		"int32":               int32(7),
		"string map":          map[string]string{"a": "b"},
	} {
		u := widget("v1", "w", map[string]any{"v": v})
		if _, _, ok := s.writtenState(k1, u); ok {
			t.Errorf("%s: written state taken, want a decode", name)
		}
	}
	u := widget("v1", "w", map[string]any{"a\xff": "b"})
	if _, _, ok := s.writtenState(k1, u); ok {
		t.Error("invalid UTF-8 key: written state taken, want a decode")
	}
	if _, _, ok := s.writtenState(k2, widget("v2", "w", map[string]any{})); ok {
		t.Error("a view's object: written state taken, want a decode")
	}
}

// TestCustomCreateReadsBack checks what a custom create returns and what a
// watch of the kind receives when the create hands its state to the
// decode cache: the stored object, defaulted on read, with its
// resourceVersion, each caller with its own copy.
func TestCustomCreateReadsBack(t *testing.T) {
	s, reg, _ := customFixture(t)
	reg.SetCustom(widgetOwner, widgetKinds("blue"))
	k := widgetKind(t, reg, "v1")
	ctx := context.Background()
	w, err := s.Watch(ctx, k, "default", WatchOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	out, err := s.Create(ctx, k, "default", widget("v1", "a", map[string]any{"n": 2.0, "f": 0.5}), Options{FieldManager: "test"})
	if err != nil {
		t.Fatal(err)
	}
	got := asU(t, out)
	if n, f, c := nested(got, "spec", "n"), nested(got, "spec", "f"), nested(got, "spec", "color"); n != int64(2) || f != 0.5 || c != "blue" {
		t.Errorf("created spec n=%#v f=%#v color=%#v, want 2 (int64), 0.5, blue", n, f, c)
	}
	if got.GetResourceVersion() == "" || len(got.GetManagedFields()) != 1 {
		t.Errorf("created: resourceVersion %q, managedFields %v", got.GetResourceVersion(), got.GetManagedFields())
	}
	_ = unstructured.SetNestedField(got.Object, "changed", "spec", "color")
	ev := <-w.ResultChan()
	seen := asU(t, ev.Object)
	if seen.GetResourceVersion() != got.GetResourceVersion() || nested(seen, "spec", "color") != "blue" || nested(seen, "spec", "n") != int64(2) {
		t.Errorf("watched %v, want the created object as stored", seen.Object)
	}
	read, err := s.Get(ctx, k, "default", "a")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(asU(t, read).Object, seen.Object) {
		t.Errorf("read\n%v\nwatched\n%v", asU(t, read).Object, seen.Object)
	}
	// An object the defaults on read leave as stored is known to be so,
	// for lists to send as stored.
	out, err = s.Create(ctx, k, "default", widget("v1", "b", map[string]any{"color": "red"}), Options{FieldManager: "test"})
	if err != nil {
		t.Fatal(err)
	}
	rv, _ := strconv.ParseInt(asU(t, out).GetResourceVersion(), 10, 64)
	o := store.Object{Key: s.key(k, "default", "b"), Revision: rv}
	if u := s.rdefaults.unchanged(k, []store.Object{o}); !u[0] {
		t.Error("created object left as stored by the defaults on read: not noted")
	}
}

// TestMarshalUnstructured checks that marshal writes what json.Marshal
// writes, for unstructured objects with values encoding/json escapes or
// rewrites.
func TestMarshalUnstructured(t *testing.T) {
	for _, u := range []*unstructured.Unstructured{
		{Object: map[string]any{"kind": "A", "s": "<a href=\"x\">&amp;</a>", "sep": "a\u2028b\u2029", "bad": "a\xffb",
			"n": []any{int64(-1), 1.5, 1e21, 1e-7, nil, true, map[string]any{}}, "empty": []any{}, "ctl": "\x00\x1f\t\n"}},
		{Object: map[string]any{}},
		{},
	} {
		want, werr := json.Marshal(u)
		got, gerr := marshal(u)
		if (werr != nil) != (gerr != nil) || !bytes.Equal(got, want) {
			t.Errorf("marshal %v:\n got %q, %v\nwant %q, %v", u.Object, got, gerr, want, werr)
		}
	}
}
