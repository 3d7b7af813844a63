package apiextensions

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func widgetCRD() *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com",
			Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}}},
					},
				}},
			}},
		},
	}
}

// prepared runs what storage runs before validating a create.
func prepared(crd *apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.CustomResourceDefinition {
	k := Kinds()[0]
	k.Default(crd)
	if err := k.Mutate(context.Background(), nil, crd, nil); err != nil {
		panic(err)
	}
	k.PrepareForCreate(crd)
	return crd
}

func TestKindAcceptsAStructuralDefinition(t *testing.T) {
	crd := prepared(widgetCRD())
	if errs := Kinds()[0].Validate(crd); len(errs) != 0 {
		t.Fatalf("valid definition refused: %v", errs)
	}
	if got := crd.Status.StoredVersions; len(got) != 1 || got[0] != "v1" {
		t.Errorf("storedVersions = %v, want [v1]", got)
	}
	if !hasFinalizer(crd) {
		t.Errorf("finalizers = %v, want the cleanup finalizer", crd.Finalizers)
	}
	// kubectl wait --for=condition=... fails on a null list.
	if b, err := json.Marshal(crd.Status); err != nil || !strings.Contains(string(b), `"conditions":[]`) {
		t.Errorf("status of a new definition = %s (%v), want an empty conditions list", b, err)
	}
	if crd.Spec.Conversion == nil || crd.Spec.Conversion.Strategy != apiextensionsv1.NoneConverter {
		t.Errorf("conversion not defaulted to None: %+v", crd.Spec.Conversion)
	}
}

func TestKindRefusesBadDefinitions(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(*apiextensionsv1.CustomResourceDefinition)
		field string
		msg   string
	}{
		{"name not plural.group", func(c *apiextensionsv1.CustomResourceDefinition) { c.Name = "gadgets.example.com" },
			"metadata.name", nameMismatch},
		{"non-structural schema", func(c *apiextensionsv1.CustomResourceDefinition) {
			c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"] = apiextensionsv1.JSONSchemaProps{Type: "object",
				Properties: map[string]apiextensionsv1.JSONSchemaProps{"size": {}}}
		}, "spec.validation.openAPIV3Schema.properties[spec].properties[size].type", "Required value: must not be empty for specified object fields"},
		{"conversion webhook between versions", func(c *apiextensionsv1.CustomResourceDefinition) {
			v2 := c.Spec.Versions[0]
			v2.Name, v2.Storage = "v2", false
			c.Spec.Versions = append(c.Spec.Versions, v2)
			port := int32(443)
			c.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter,
				Webhook: &apiextensionsv1.WebhookConversion{ConversionReviewVersions: []string{"v1"},
					ClientConfig: &apiextensionsv1.WebhookClientConfig{Service: &apiextensionsv1.ServiceReference{Namespace: "ns", Name: "conv", Port: &port}}}}
		}, "spec.conversion.strategy", "conversion webhooks are not supported by this API server"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			crd := widgetCRD()
			c.edit(crd)
			errs := Kinds()[0].Validate(prepared(crd))
			if !has(errs, c.field, c.msg) {
				t.Fatalf("errors %v lack %s: %s", errs, c.field, c.msg)
			}
		})
	}
}

func TestKindKeepsNamesOnceEstablished(t *testing.T) {
	old := prepared(widgetCRD())
	old.Status.Conditions = []apiextensionsv1.CustomResourceDefinitionCondition{{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue}}
	obj := old.DeepCopy()
	obj.Spec.Scope = apiextensionsv1.ClusterScoped
	if errs := Kinds()[0].ValidateUpdate(obj, old); !has(errs, "spec.scope", "field is immutable") {
		t.Fatalf("scope change allowed: %v", errs)
	}
}

// An invalid caBundle is refused once the definition is established
// (upstream lets a definition that never was established keep one).
func TestKindRefusesAnInvalidCABundleOnceEstablished(t *testing.T) {
	old := prepared(widgetCRD())
	old.Status.Conditions = []apiextensionsv1.CustomResourceDefinitionCondition{{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue}}
	obj := old.DeepCopy()
	url := "https://conv.example.com"
	obj.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter,
		Webhook: &apiextensionsv1.WebhookConversion{ConversionReviewVersions: []string{"v1"},
			ClientConfig: &apiextensionsv1.WebhookClientConfig{URL: &url, CABundle: []byte("not a certificate")}}}
	if errs := Kinds()[0].ValidateUpdate(obj, old); !has(errs, "spec.conversion.webhookClientConfig.caBundle", "unable to load root certificates") {
		t.Fatalf("invalid caBundle allowed: %v", errs)
	}
}

func has(errs field.ErrorList, path, msg string) bool {
	for _, e := range errs {
		if e.Field == path && strings.Contains(e.Error(), msg) {
			return true
		}
	}
	return false
}
