package customresource

import (
	"os"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/tether-edge/tether/hub/registry"
)

// loadCRD reads the test CustomResourceDefinition.
func loadCRD(t testing.TB) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	data, err := os.ReadFile("testdata/widgets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatal(err)
	}
	return crd
}

// widgetKinds returns the kinds of the test CRD by version.
func widgetKinds(t testing.TB) map[string]*registry.Kind {
	t.Helper()
	kinds, err := Kinds(loadCRD(t))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*registry.Kind{}
	for _, k := range kinds {
		out[k.GVK.Version] = k
	}
	return out
}

// obj parses a YAML object as the API server decodes a JSON body.
func obj(t testing.TB, s string) *unstructured.Unstructured {
	t.Helper()
	data, err := yaml.YAMLToJSON([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		t.Fatal(err)
	}
	return u
}
