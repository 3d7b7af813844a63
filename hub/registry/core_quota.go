package registry

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var supportedQuotaScopes = sets.New[string](string(corev1.ResourceQuotaScopeTerminating), string(corev1.ResourceQuotaScopeNotTerminating),
	string(corev1.ResourceQuotaScopeBestEffort), string(corev1.ResourceQuotaScopeNotBestEffort),
	string(corev1.ResourceQuotaScopePriorityClass), string(corev1.ResourceQuotaScopeCrossNamespacePodAffinity),
	string(corev1.ResourceQuotaScopeVolumeAttributesClass))

var resourceQuotaKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("ResourceQuota"),
	Resource:   "resourcequotas",
	Singular:   "resourcequota",
	Namespaced: true,
	ShortNames: []string{"quota"},
	HasStatus:  true,
	Validate: func(obj runtime.Object) field.ErrorList {
		q := obj.(*corev1.ResourceQuota)
		sp := field.NewPath("spec")
		errs := validateQuotaList(q.Spec.Hard, sp.Child("hard"))
		for i, s := range q.Spec.Scopes {
			if !supportedQuotaScopes.Has(string(s)) {
				errs = append(errs, field.NotSupported(sp.Child("scopes").Index(i), s, sets.List(supportedQuotaScopes)))
			}
		}
		if sel := q.Spec.ScopeSelector; sel != nil {
			for i, e := range sel.MatchExpressions {
				p := sp.Child("scopeSelector", "matchExpressions").Index(i)
				if !supportedQuotaScopes.Has(string(e.ScopeName)) {
					errs = append(errs, field.NotSupported(p.Child("scopeName"), e.ScopeName, sets.List(supportedQuotaScopes)))
				}
				switch e.Operator {
				case corev1.ScopeSelectorOpIn, corev1.ScopeSelectorOpNotIn:
					if len(e.Values) == 0 {
						errs = append(errs, field.Required(p.Child("values"), "must be at least one value when `operator` is 'In' or 'NotIn' for scope selector"))
					}
				case corev1.ScopeSelectorOpExists, corev1.ScopeSelectorOpDoesNotExist:
					if len(e.Values) != 0 {
						errs = append(errs, field.Invalid(p.Child("values"), e.Values, "must be no value when `operator` is 'Exist' or 'DoesNotExist' for scope selector"))
					}
				default:
					errs = append(errs, field.NotSupported(p.Child("operator"), e.Operator, []string{"DoesNotExist", "Exists", "In", "NotIn"}))
				}
			}
		}
		return errs
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		q := obj.(*corev1.ResourceQuota)
		errs := validateQuotaList(q.Status.Hard, field.NewPath("status", "hard"))
		return append(errs, validateQuotaList(q.Status.Used, field.NewPath("status", "used"))...)
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		ageColumn,
		column("Request", "string", 0, "Request represents a minimum amount of cpu/memory that a container may consume."),
		column("Limit", "string", 0, "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		q := obj.(*corev1.ResourceQuota)
		names := make([]string, 0, len(q.Status.Hard))
		for n := range q.Status.Hard {
			names = append(names, string(n))
		}
		sort.Strings(names)
		var req, lim []string
		for _, n := range names {
			used := q.Status.Used[corev1.ResourceName(n)]
			hard := q.Status.Hard[corev1.ResourceName(n)]
			s := fmt.Sprintf("%s: %s/%s", n, used.String(), hard.String())
			if parts := strings.Split(n, "."); len(parts) > 1 && parts[0] == "limits" {
				lim = append(lim, s)
			} else {
				req = append(req, s)
			}
		}
		return []any{q.Name, age(q.CreationTimestamp, now), strings.Join(req, ", "), strings.Join(lim, ", ")}
	},
}

func validateQuotaList(list corev1.ResourceList, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for name, q := range list {
		p := path.Key(string(name))
		for _, msg := range validation.IsQualifiedName(string(name)) {
			errs = append(errs, field.Invalid(p, name, msg))
		}
		if q.Sign() < 0 {
			errs = append(errs, field.Invalid(p, q.String(), "must be greater than or equal to 0"))
		}
	}
	return errs
}

var supportedLimitTypes = sets.New[string](string(corev1.LimitTypePod), string(corev1.LimitTypeContainer), string(corev1.LimitTypePersistentVolumeClaim))

var limitRangeKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("LimitRange"),
	Resource:   "limitranges",
	Singular:   "limitrange",
	Namespaced: true,
	ShortNames: []string{"limits"},
	Default: func(obj runtime.Object) {
		lr := obj.(*corev1.LimitRange)
		for i := range lr.Spec.Limits {
			item := &lr.Spec.Limits[i]
			if item.Type != corev1.LimitTypeContainer {
				continue
			}
			if item.Default == nil {
				item.Default = corev1.ResourceList{}
			}
			if item.DefaultRequest == nil {
				item.DefaultRequest = corev1.ResourceList{}
			}
			for k, v := range item.Max {
				if _, ok := item.Default[k]; !ok {
					item.Default[k] = v.DeepCopy()
				}
			}
			for k, v := range item.Default {
				if _, ok := item.DefaultRequest[k]; !ok {
					item.DefaultRequest[k] = v.DeepCopy()
				}
			}
			for k, v := range item.Min {
				if _, ok := item.DefaultRequest[k]; !ok {
					item.DefaultRequest[k] = v.DeepCopy()
				}
			}
		}
	},
	Validate: func(obj runtime.Object) field.ErrorList { return validateLimitRange(obj.(*corev1.LimitRange)) },
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Created At", "date", 0, "CreationTimestamp is a timestamp representing the server time when this object was created."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		lr := obj.(*corev1.LimitRange)
		return []any{lr.Name, lr.CreationTimestamp.UTC().Format(time.RFC3339)}
	},
}

func validateLimitRange(lr *corev1.LimitRange) field.ErrorList {
	var errs field.ErrorList
	seen := sets.New[string]()
	for i, item := range lr.Spec.Limits {
		p := field.NewPath("spec", "limits").Index(i)
		if !supportedLimitTypes.Has(string(item.Type)) {
			errs = append(errs, field.NotSupported(p.Child("type"), item.Type, sets.List(supportedLimitTypes)))
		}
		if seen.Has(string(item.Type)) {
			errs = append(errs, field.Duplicate(p.Child("type"), item.Type))
		}
		seen.Insert(string(item.Type))
		for _, l := range []struct {
			name string
			list corev1.ResourceList
		}{{"max", item.Max}, {"min", item.Min}, {"default", item.Default}, {"defaultRequest", item.DefaultRequest}, {"maxLimitRequestRatio", item.MaxLimitRequestRatio}} {
			errs = append(errs, validateQuotaList(l.list, p.Child(l.name))...)
		}
		if item.Type == corev1.LimitTypePod {
			if len(item.Default) > 0 {
				errs = append(errs, field.Forbidden(p.Child("default"), "may not be specified when `type` is 'Pod'"))
			}
			if len(item.DefaultRequest) > 0 {
				errs = append(errs, field.Forbidden(p.Child("defaultRequest"), "may not be specified when `type` is 'Pod'"))
			}
		}
		if item.Type == corev1.LimitTypePersistentVolumeClaim {
			_, minOK := item.Min[corev1.ResourceStorage]
			_, maxOK := item.Max[corev1.ResourceStorage]
			if !minOK && !maxOK {
				errs = append(errs, field.Required(p.Child("limits"), "either minimum or maximum storage value is required, but neither was provided"))
			}
		}
		for k, minQ := range item.Min {
			if maxQ, ok := item.Max[k]; ok && minQ.Cmp(maxQ) > 0 {
				errs = append(errs, field.Invalid(p.Child("min").Key(string(k)), minQ.String(), fmt.Sprintf("min value %s is greater than max value %s", minQ.String(), maxQ.String())))
			}
		}
		for k, d := range item.Default {
			if minQ, ok := item.Min[k]; ok && minQ.Cmp(d) > 0 {
				errs = append(errs, field.Invalid(p.Child("default").Key(string(k)), d.String(), fmt.Sprintf("min value %s is greater than default value %s", minQ.String(), d.String())))
			}
			if maxQ, ok := item.Max[k]; ok && d.Cmp(maxQ) > 0 {
				errs = append(errs, field.Invalid(p.Child("default").Key(string(k)), d.String(), fmt.Sprintf("default value %s is greater than max value %s", d.String(), maxQ.String())))
			}
		}
		for k, r := range item.DefaultRequest {
			if minQ, ok := item.Min[k]; ok && minQ.Cmp(r) > 0 {
				errs = append(errs, field.Invalid(p.Child("defaultRequest").Key(string(k)), r.String(), fmt.Sprintf("min value %s is greater than default request value %s", minQ.String(), r.String())))
			}
			if maxQ, ok := item.Max[k]; ok && r.Cmp(maxQ) > 0 {
				errs = append(errs, field.Invalid(p.Child("defaultRequest").Key(string(k)), r.String(), fmt.Sprintf("default request value %s is greater than max value %s", r.String(), maxQ.String())))
			}
			if d, ok := item.Default[k]; ok && r.Cmp(d) > 0 {
				errs = append(errs, field.Invalid(p.Child("defaultRequest").Key(string(k)), r.String(), fmt.Sprintf("default request value %s is greater than default limit value %s", r.String(), d.String())))
			}
		}
		for k, ratio := range item.MaxLimitRequestRatio {
			if ratio.Cmp(resource.MustParse("1")) < 0 {
				errs = append(errs, field.Invalid(p.Child("maxLimitRequestRatio").Key(string(k)), ratio.String(), fmt.Sprintf("ratio %s is less than 1", ratio.String())))
			}
		}
	}
	return errs
}

// eventFields returns an event's selectable fields; events.k8s.io/v1 Events
// select on the same ones, as upstream.
func eventFields(e *corev1.Event) fields.Set {
	return fields.Set{
		"involvedObject.kind":            e.InvolvedObject.Kind,
		"involvedObject.namespace":       e.InvolvedObject.Namespace,
		"involvedObject.name":            e.InvolvedObject.Name,
		"involvedObject.uid":             string(e.InvolvedObject.UID),
		"involvedObject.apiVersion":      e.InvolvedObject.APIVersion,
		"involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
		"involvedObject.fieldPath":       e.InvolvedObject.FieldPath,
		"reason":                         e.Reason,
		"reportingComponent":             e.ReportingController,
		"source":                         e.Source.Component,
		"type":                           e.Type,
	}
}
