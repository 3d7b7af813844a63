// Package aggregator serves API aggregation as kube-apiserver's aggregator
// does: the apiregistration.k8s.io/v1 APIService kind, the Local
// APIServices of every group/version the hub serves itself, the proxy that
// sends requests for a group/version registered with a Service to that
// Service (through the tunnel of the node its pod runs on, with the
// caller's identity in front-proxy headers), the availability controller
// that probes those Services, and the merging of their groups into the
// hub's discovery documents.
package aggregator

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kube-aggregator/pkg/apis/apiregistration"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/kube-aggregator/pkg/apis/apiregistration/validation"
	"k8s.io/kube-aggregator/pkg/client/applyconfiguration"

	"github.com/tether-edge/tether/hub/registry"
)

// Kinds returns the kinds this package serves: apiregistration.k8s.io/v1
// APIService, with upstream's defaults, validation, status subresource and
// table.
func Kinds() []*registry.Kind {
	return []*registry.Kind{apiServiceKind()}
}

var objectMetaDocs = metav1.ObjectMeta{}.SwaggerDoc()

func apiServiceKind() *registry.Kind {
	var tc managedfields.TypeConverter
	if sch, err := registry.NewScheme(); err == nil {
		tc = applyconfiguration.NewTypeConverter(sch)
	}
	return &registry.Kind{
		TypeConverter: tc,
		GVK:           apiregistrationv1.SchemeGroupVersion.WithKind("APIService"),
		Resource:      "apiservices",
		Singular:      "apiservice",
		Categories:    []string{"api-extensions"},
		HasStatus:     true,
		Default: func(obj runtime.Object) {
			apiregistrationv1.SetObjectDefaults_APIService(obj.(*apiregistrationv1.APIService))
		},
		NameRule: pathSegmentName,
		Validate: func(obj runtime.Object) field.ErrorList {
			in, err := toInternal(obj)
			if err != nil {
				return field.ErrorList{field.InternalError(nil, err)}
			}
			return withCABundle(specErrors(validation.ValidateAPIService(context.Background(), in)), obj)
		},
		ValidateUpdate: func(obj, _ runtime.Object) field.ErrorList {
			in, err := toInternal(obj)
			if err != nil {
				return field.ErrorList{field.InternalError(nil, err)}
			}
			return withCABundle(specErrors(validation.ValidateAPIService(context.Background(), in)), obj)
		},
		ValidateStatusUpdate: func(obj, _ runtime.Object) field.ErrorList {
			in, err := toInternal(obj)
			if err != nil {
				return field.ErrorList{field.InternalError(nil, err)}
			}
			return validation.ValidateAPIServiceStatus(&in.Status, field.NewPath("status"))
		},
		Columns: []metav1.TableColumnDefinition{
			{Name: "Name", Type: "string", Format: "name", Description: objectMetaDocs["name"]},
			{Name: "Service", Type: "string", Description: "The reference to the service that hosts this API endpoint."},
			{Name: "Available", Type: "string", Description: "Whether this service is available."},
			{Name: "Age", Type: "string", Description: objectMetaDocs["creationTimestamp"]},
		},
		Cells: func(obj runtime.Object, now time.Time) []any {
			s := obj.(*apiregistrationv1.APIService)
			return []any{s.Name, serviceCell(s), availableCell(s), age(s.CreationTimestamp, now)}
		},
	}
}

// pathSegmentName accepts what upstream accepts as an APIService name
// before comparing it with spec: a valid path segment. The comparison with
// <version>.<group> is Validate's.
func pathSegmentName(name string, _ bool) []string {
	switch name {
	case ".", "..":
		return []string{fmt.Sprintf(`may not be '%s'`, name)}
	}
	for _, bad := range []string{"/", "%"} {
		if strings.Contains(name, bad) {
			return []string{fmt.Sprintf(`may not contain '%s'`, bad)}
		}
	}
	return nil
}

// specErrors keeps, of the library's errors, those about spec and the
// name's agreement with it: the generic code has checked the rest of
// metadata already.
func specErrors(errs field.ErrorList) field.ErrorList {
	var out field.ErrorList
	for _, e := range errs {
		if strings.HasPrefix(e.Field, "metadata.") && !(e.Field == "metadata.name" && strings.HasPrefix(e.Detail, "must be `spec.version")) {
			continue
		}
		out = append(out, e)
	}
	return out
}

// withCABundle adds a check upstream leaves to the proxy's first use: a
// caBundle must hold at least one PEM certificate.
func withCABundle(errs field.ErrorList, obj runtime.Object) field.ErrorList {
	s := obj.(*apiregistrationv1.APIService)
	if s.Spec.Service == nil || len(s.Spec.CABundle) == 0 {
		return errs
	}
	if !x509.NewCertPool().AppendCertsFromPEM(s.Spec.CABundle) {
		errs = append(errs, field.Invalid(field.NewPath("spec", "caBundle"), fmt.Sprintf("%d bytes", len(s.Spec.CABundle)), "must contain at least one PEM-encoded certificate"))
	}
	return errs
}

func toInternal(obj runtime.Object) (*apiregistration.APIService, error) {
	out := &apiregistration.APIService{}
	if err := apiregistrationv1.Convert_v1_APIService_To_apiregistration_APIService(obj.(*apiregistrationv1.APIService), out, nil); err != nil {
		return nil, fmt.Errorf("convert apiservice: %w", err)
	}
	return out, nil
}

func serviceCell(s *apiregistrationv1.APIService) string {
	if s.Spec.Service == nil {
		return "Local"
	}
	return s.Spec.Service.Namespace + "/" + s.Spec.Service.Name
}

func availableCell(s *apiregistrationv1.APIService) string {
	for _, c := range s.Status.Conditions {
		if c.Type != apiregistrationv1.Available {
			continue
		}
		if c.Status != apiregistrationv1.ConditionTrue && c.Reason != "" {
			return fmt.Sprintf("%s (%s)", c.Status, c.Reason)
		}
		return string(c.Status)
	}
	return string(apiregistrationv1.ConditionUnknown)
}

// age renders the time since t as kubectl's AGE column does.
func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}
