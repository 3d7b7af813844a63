package customresource

import (
	"reflect"
	"sort"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// TestCELViolationRendering shows how a failed x-kubernetes-validations
// rule reads, as kube-apiserver v1.37 renders it: the value is left out
// for objects and lists and printed for scalars.
func TestCELViolationRendering(t *testing.T) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict([]byte(`
metadata: {name: gauges.example.tether.dev}
spec:
  group: example.tether.dev
  scope: Namespaced
  names: {plural: gauges, singular: gauge, kind: Gauge, listKind: GaugeList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - {rule: self.max >= self.min, message: max below min}
            properties:
              min: {type: integer}
              max: {type: integer}
              unit:
                type: string
                x-kubernetes-validations: [{rule: self != 'none', message: needs a unit}]
              marks:
                type: array
                items: {type: string}
                x-kubernetes-validations: [{rule: size(self) < 2, message: at most one mark}]
`), crd); err != nil {
		t.Fatal(err)
	}
	ks, err := Kinds(crd)
	if err != nil {
		t.Fatal(err)
	}
	u := obj(t, `apiVersion: example.tether.dev/v1
kind: Gauge
metadata: {name: g, namespace: default}
spec: {min: 3, max: 1, unit: none, marks: [a, b]}
`)
	var got []string
	for _, e := range ks[0].Validate(u) {
		got = append(got, e.Error())
	}
	sort.Strings(got) // the validator walks properties in map order
	want := []string{ // sorted
		"spec.marks: Invalid value: at most one mark",
		`spec.unit: Invalid value: "none": needs a unit`,
		"spec: Invalid value: max below min",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("errors:\n%q\nwant\n%q", got, want)
	}
}
