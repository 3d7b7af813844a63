package sitedigest

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestRoundTrip(t *testing.T) {
	d := Digest{Site: "shop-12", Members: []Member{
		{Node: "b", State: Dead, Incarnation: 3},
		{Node: "a", State: Alive, Incarnation: 1},
		{Node: "b", State: Alive, Incarnation: 4},
		{Node: "a", State: Suspect, Incarnation: 1},
	}}
	d.Normalize()
	want := []Member{{Node: "a", State: Suspect, Incarnation: 1}, {Node: "b", State: Alive, Incarnation: 4}}
	if len(d.Members) != 2 || d.Members[0] != want[0] || d.Members[1] != want[1] {
		t.Fatalf("normalized = %+v, want %+v", d.Members, want)
	}
	b, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(d) {
		t.Fatalf("round trip = %+v, want %+v", got, d)
	}
}

func TestRejects(t *testing.T) {
	good, _ := Digest{Site: "s", Members: []Member{{Node: "n1", State: Alive}}}.Marshal()
	for name, b := range map[string][]byte{
		"empty":    nil,
		"version":  append([]byte{9}, good[1:]...),
		"trailing": append(append([]byte{}, good...), 0),
		"short":    good[:len(good)-2],
		"state":    {1, 1, 's', 1, 2, 'n', '1', 7, 0},
		"unsorted": {1, 1, 's', 2, 1, 'b', 1, 0, 1, 'a', 1, 0},
		"node":     {1, 1, 's', 1, 2, 'N', '!', 1, 0},
		"site":     {1, 0, 0},
	} {
		if _, err := Unmarshal(b); err == nil {
			t.Errorf("%s: decoded, want an error", name)
		}
	}
	if _, err := (Digest{Site: "s", Members: []Member{{Node: "b", State: Alive}, {Node: "a", State: Alive}}}).Marshal(); err == nil {
		t.Error("unsorted digest marshalled")
	}
}

func FuzzUnmarshal(f *testing.F) {
	good, _ := Digest{Site: "s", Members: []Member{{Node: "n1", State: Alive, Incarnation: 2}}}.Marshal()
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Unmarshal(b)
		if err != nil {
			return
		}
		again, err := d.Marshal()
		if err != nil {
			t.Fatalf("decoded digest does not encode: %v", err)
		}
		if d2, err := Unmarshal(again); err != nil || !d2.Equal(d) {
			t.Fatalf("re-encoded digest differs: %v", err)
		}
	})
}

func TestKeySecretName(t *testing.T) {
	a, b := KeySecretName("Shop_12"), KeySecretName("shop-12")
	if a == b {
		t.Fatalf("sites differing in case share the Secret %s", a)
	}
	if errs := validation.IsDNS1123Subdomain(a); len(errs) > 0 {
		t.Fatalf("%s: %v", a, errs)
	}
}
