package registry

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestNewSchemeRecognizesServedTypes(t *testing.T) {
	s, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, gvk := range []schema.GroupVersionKind{
		{Version: "v1", Kind: "Pod"},
		{Group: "apps", Version: "v1", Kind: "Deployment"},
		{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"},
		{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"},
		{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingWebhookConfiguration"},
	} {
		if !s.Recognizes(gvk) {
			t.Errorf("scheme does not recognize %s", gvk)
		}
	}
	for _, k := range All() {
		if !s.Recognizes(k.GVK) {
			t.Errorf("scheme does not recognize served kind %s", k.GVK)
		}
	}
}
