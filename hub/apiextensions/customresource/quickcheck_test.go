package customresource

import (
	"math/rand/v2"
	"testing"

	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
)

// TestQuickCheckNeverPassesWhatTheValidatorRefuses checks quickCheck
// against the validator on many values per schema: "valid" only where the
// validator finds nothing, and often enough there.
func TestQuickCheckNeverPassesWhatTheValidatorRefuses(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for name, src := range allTestSchemas(t) {
		_, openAPI, validator := testSchema(t, name, src)
		q := newQuickCheck(openAPI)
		var passed, refused, validN int
		for i := range 4000 {
			// Half the values follow the schema closely.
			noise := []int{20, 150}[i%2]
			v := valueFor(r, openAPI, noise, 0)
			errs := apiservervalidation.ValidateCustomResource(nil, v, validator)
			if q.valid(v) {
				passed++
				if len(errs) > 0 {
					t.Fatalf("%s: quickCheck passes %#v, the validator finds %v", name, v, errs)
				}
			} else if len(errs) > 0 {
				refused++
			}
			if len(errs) == 0 {
				validN++
			}
		}
		t.Logf("%s: %d values passed, %d refused, %d valid", name, passed, refused, validN)
		if passed < 100 || refused < 100 {
			t.Errorf("%s: %d values passed, %d refused, %d valid: the values do not exercise both answers", name, passed, refused, validN)
		}
	}
}

// TestQuickCheckPassesPlainObjects checks that objects of the usual form
// skip the validator.
func TestQuickCheckPassesPlainObjects(t *testing.T) {
	_, openAPI, _ := testSchema(t, "record", walkSchemas["record"])
	q := newQuickCheck(openAPI)
	record := obj(t, `
apiVersion: bench.tether.dev/v1
kind: Record
metadata: {name: a, namespace: b, labels: {x: y}}
spec: {data: {a: b, c: d}}
`)
	if !q.valid(record.Object) {
		t.Error("quickCheck does not pass a valid record")
	}
	record.Object["spec"].(map[string]any)["data"].(map[string]any)["n"] = int64(1)
	if q.valid(record.Object) {
		t.Error("quickCheck passes a number where the schema wants a string")
	}
	// The test CRD's v1 schema has bounds, formats and enums: quickCheck
	// leaves those nodes to the validator, yet passes objects without
	// such values.
	_, openAPI, _ = testSchema(t, "widget-v1", allTestSchemas(t)["widget-v1"])
	q = newQuickCheck(openAPI)
	if !q.valid(obj(t, `{apiVersion: example.tether.dev/v1, kind: Widget, metadata: {name: a}, spec: {image: x}}`).Object) {
		t.Error("quickCheck does not pass a widget with an image alone")
	}
	if q.valid(obj(t, `{apiVersion: example.tether.dev/v1, kind: Widget, metadata: {name: a}, spec: {image: x, replicas: 2}}`).Object) {
		t.Error("quickCheck passes spec.replicas, whose schema has bounds and a format")
	}
}
