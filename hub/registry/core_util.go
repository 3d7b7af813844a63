package registry

import (
	"encoding/json"
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// countSet counts the non-nil pointer fields of a struct value, which is how
// volume sources say which kind they are.
func countSet(v any) int {
	rv := reflect.ValueOf(v)
	n := 0
	for i := 0; i < rv.NumField(); i++ {
		if f := rv.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			n++
		}
	}
	return n
}

// validateLabelSelector checks a label selector as upstream does.
func validateLabelSelector(s *metav1.LabelSelector, path *field.Path) field.ErrorList {
	return metav1validation.ValidateLabelSelector(s, metav1validation.LabelSelectorValidationOptions{}, path)
}
