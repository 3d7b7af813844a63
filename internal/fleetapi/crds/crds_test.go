package crds

import (
	"context"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestDefinitionsValid checks the definitions with the validation
// kube-apiserver applies to a created CustomResourceDefinition.
func TestDefinitionsValid(t *testing.T) {
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 {
		t.Fatalf("%d definitions, want 3", len(all))
	}
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := apiextensions.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, crd := range all {
		scheme.Default(crd)
		internal := &apiextensions.CustomResourceDefinition{}
		if err := scheme.Convert(crd, internal, nil); err != nil {
			t.Fatal(err)
		}
		if errs := validation.ValidateCustomResourceDefinition(context.Background(), internal); len(errs) > 0 {
			t.Errorf("%s: %v", crd.Name, errs.ToAggregate())
		}
	}
}
