package customresource

import "testing"

// BenchmarkWritePath measures what a create of a custom object costs in
// this package: prune, default, validate (schema, list types, CEL).
func BenchmarkWritePath(b *testing.B) {
	k := widgetKinds(b)["v1"]
	in := obj(b, validWidget)
	b.ReportAllocs()
	for b.Loop() {
		u := in.DeepCopy()
		k.Prune(u)
		k.Default(u)
		if errs := k.Validate(u); len(errs) != 0 {
			b.Fatal(errs)
		}
	}
}

// BenchmarkUpdatePath measures an update's validation with ratcheting.
func BenchmarkUpdatePath(b *testing.B) {
	k := widgetKinds(b)["v1"]
	old := obj(b, validWidget)
	in := obj(b, validWidget)
	in.SetLabels(map[string]string{"a": "b"})
	b.ReportAllocs()
	for b.Loop() {
		u := in.DeepCopy()
		k.Prune(u)
		k.Default(u)
		if errs := k.ValidateUpdate(u, old); len(errs) != 0 {
			b.Fatal(errs)
		}
	}
}

// BenchmarkKinds measures building the kinds of a two-version CRD, which
// happens at every change of the definition.
func BenchmarkKinds(b *testing.B) {
	crd := loadCRD(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Kinds(crd); err != nil {
			b.Fatal(err)
		}
	}
}
