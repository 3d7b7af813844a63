package registry

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// eventsV1Kind serves events.k8s.io/v1 Events as a view of core/v1 Events.
var eventsV1Kind = &Kind{
	GVK:        eventsv1.SchemeGroupVersion.WithKind("Event"),
	Resource:   "events",
	Singular:   "event",
	Namespaced: true,
	ShortNames: []string{"ev"},
	StoredAs:   corev1.SchemeGroupVersion.WithKind("Event"),
	ToStorage: func(obj runtime.Object) (runtime.Object, error) {
		switch e := obj.(type) {
		case *eventsv1.Event:
			return eventToCore(e), nil
		case *corev1.Event:
			return e, nil
		}
		return nil, fmt.Errorf("convert %T to a core/v1 Event: unexpected type", obj)
	},
	FromStorage: func(obj runtime.Object) (runtime.Object, error) {
		switch e := obj.(type) {
		case *corev1.Event:
			return eventFromCore(e), nil
		case *eventsv1.Event:
			return e, nil
		}
		return nil, fmt.Errorf("convert %T to an events.k8s.io/v1 Event: unexpected type", obj)
	},
	Validate: func(obj runtime.Object) field.ErrorList { return validateEventsV1(asEventsV1(obj)) },
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		return validateEventsV1Update(asCoreEvent(obj), asCoreEvent(old))
	},
	Fields: func(obj runtime.Object) fields.Set { return eventFields(asCoreEvent(obj)) },
	FieldLabels: []string{"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
		"involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
		"reportingComponent", "source", "type"},
	FieldAliases: map[string]string{
		"regarding.kind":            "involvedObject.kind",
		"regarding.namespace":       "involvedObject.namespace",
		"regarding.name":            "involvedObject.name",
		"regarding.uid":             "involvedObject.uid",
		"regarding.apiVersion":      "involvedObject.apiVersion",
		"regarding.resourceVersion": "involvedObject.resourceVersion",
		"regarding.fieldPath":       "involvedObject.fieldPath",
		"reportingController":       "reportingComponent",
	},
	// The table is the core/v1 Event table.
	Columns: eventKind.Columns,
	Cells: func(obj runtime.Object, now time.Time) []any {
		return eventCells(asCoreEvent(obj), now)
	},
}

// eventToCore maps an events.k8s.io/v1 Event onto core/v1 fields.
func eventToCore(in *eventsv1.Event) *corev1.Event {
	out := &corev1.Event{
		TypeMeta:            metav1.TypeMeta{APIVersion: "v1", Kind: "Event"},
		ObjectMeta:          *in.ObjectMeta.DeepCopy(),
		InvolvedObject:      in.Regarding,
		Reason:              in.Reason,
		Message:             in.Note,
		Source:              in.DeprecatedSource,
		FirstTimestamp:      in.DeprecatedFirstTimestamp,
		LastTimestamp:       in.DeprecatedLastTimestamp,
		Count:               in.DeprecatedCount,
		Type:                in.Type,
		EventTime:           in.EventTime,
		Action:              in.Action,
		ReportingController: in.ReportingController,
		ReportingInstance:   in.ReportingInstance,
	}
	if in.Related != nil {
		out.Related = in.Related.DeepCopy()
	}
	if in.Series != nil {
		out.Series = &corev1.EventSeries{Count: in.Series.Count, LastObservedTime: in.Series.LastObservedTime}
	}
	return out
}

// eventFromCore maps a core/v1 Event onto events.k8s.io/v1 fields.
func eventFromCore(in *corev1.Event) *eventsv1.Event {
	out := &eventsv1.Event{
		TypeMeta:                 metav1.TypeMeta{APIVersion: eventsv1.SchemeGroupVersion.String(), Kind: "Event"},
		ObjectMeta:               *in.ObjectMeta.DeepCopy(),
		EventTime:                in.EventTime,
		ReportingController:      in.ReportingController,
		ReportingInstance:        in.ReportingInstance,
		Action:                   in.Action,
		Reason:                   in.Reason,
		Regarding:                in.InvolvedObject,
		Note:                     in.Message,
		Type:                     in.Type,
		DeprecatedSource:         in.Source,
		DeprecatedFirstTimestamp: in.FirstTimestamp,
		DeprecatedLastTimestamp:  in.LastTimestamp,
		DeprecatedCount:          in.Count,
	}
	if in.Related != nil {
		out.Related = in.Related.DeepCopy()
	}
	if in.Series != nil {
		out.Series = &eventsv1.EventSeries{Count: in.Series.Count, LastObservedTime: in.Series.LastObservedTime}
	}
	return out
}

func asEventsV1(obj runtime.Object) *eventsv1.Event {
	if e, ok := obj.(*corev1.Event); ok {
		return eventFromCore(e)
	}
	return obj.(*eventsv1.Event)
}

func asCoreEvent(obj runtime.Object) *corev1.Event {
	if e, ok := obj.(*eventsv1.Event); ok {
		return eventToCore(e)
	}
	return obj.(*corev1.Event)
}

// validateEventsV1 checks an Event created through events.k8s.io/v1: the
// deprecated fields must be unset.
func validateEventsV1(e *eventsv1.Event) field.ErrorList {
	var errs field.ErrorList
	if e.EventTime.IsZero() {
		errs = append(errs, field.Required(field.NewPath("eventTime"), ""))
	}
	if e.Type != corev1.EventTypeNormal && e.Type != corev1.EventTypeWarning {
		errs = append(errs, field.Invalid(field.NewPath("type"), "", fmt.Sprintf("has invalid value: %v", e.Type)))
	}
	if !e.DeprecatedFirstTimestamp.IsZero() {
		errs = append(errs, field.Invalid(field.NewPath("deprecatedFirstTimestamp"), "", "needs to be unset"))
	}
	if !e.DeprecatedLastTimestamp.IsZero() {
		errs = append(errs, field.Invalid(field.NewPath("deprecatedLastTimestamp"), "", "needs to be unset"))
	}
	if e.DeprecatedCount != 0 {
		errs = append(errs, field.Invalid(field.NewPath("deprecatedCount"), "", "needs to be unset"))
	}
	if e.DeprecatedSource.Component != "" || e.DeprecatedSource.Host != "" {
		errs = append(errs, field.Invalid(field.NewPath("deprecatedSource"), "", "needs to be unset"))
	}
	if e.ReportingController == "" {
		errs = append(errs, field.Required(field.NewPath("reportingController"), ""))
	} else {
		for _, m := range validation.IsQualifiedName(e.ReportingController) {
			errs = append(errs, field.Invalid(field.NewPath("reportingController"), e.ReportingController, m))
		}
	}
	for name, v := range map[string]string{"reportingInstance": e.ReportingInstance, "action": e.Action, "reason": e.Reason} {
		if v == "" {
			errs = append(errs, field.Required(field.NewPath(name), ""))
		} else if len(v) > 128 {
			errs = append(errs, field.Invalid(field.NewPath(name), "", "can have at most 128 characters"))
		}
	}
	if len(e.Note) > 1024 {
		errs = append(errs, field.Invalid(field.NewPath("note"), "", "can have at most 1024 characters"))
	}
	if e.Series != nil {
		if e.Series.Count < 2 {
			errs = append(errs, field.Invalid(field.NewPath("series", "count"), "", "should be at least 2"))
		}
		if e.Series.LastObservedTime.IsZero() {
			errs = append(errs, field.Required(field.NewPath("series", "lastObservedTime"), ""))
		}
	}
	return errs
}

// validateEventsV1Update checks an update written through events.k8s.io/v1
// as upstream does: the new event passes the checks core/v1 writes get (an
// event without eventTime, as core/v1 clients write them, needs only its
// namespace to agree with the object it is about), a changed series is
// checked again, and what the event reports cannot change.
func validateEventsV1Update(e, old *corev1.Event) field.ErrorList {
	errs := legacyValidateEvent(e)
	if !apiequality.Semantic.DeepEqual(e.Series, old.Series) && e.Series != nil {
		if e.Series.Count < 2 {
			errs = append(errs, field.Invalid(field.NewPath("series.count"), "", "should be at least 2"))
		}
		if e.Series.LastObservedTime.IsZero() {
			errs = append(errs, field.Required(field.NewPath("series.lastObservedTime"), ""))
		}
	}
	for _, f := range []struct {
		name     string
		cur, was any
	}{
		{"involvedObject", e.InvolvedObject, old.InvolvedObject},
		{"reason", e.Reason, old.Reason},
		{"message", e.Message, old.Message},
		{"source", e.Source, old.Source},
		{"firstTimestamp", e.FirstTimestamp, old.FirstTimestamp},
		{"lastTimestamp", e.LastTimestamp, old.LastTimestamp},
		{"count", e.Count, old.Count},
		{"type", e.Type, old.Type},
		{"eventTime", e.EventTime, old.EventTime},
		{"action", e.Action, old.Action},
		{"related", e.Related, old.Related},
		{"reportingController", e.ReportingController, old.ReportingController},
		{"reportingInstance", e.ReportingInstance, old.ReportingInstance},
	} {
		errs = append(errs, metavalidation.ValidateImmutableField(f.cur, f.was, field.NewPath(f.name))...)
	}
	return errs
}

// legacyValidateEvent is what every Event write must pass upstream, through
// either API: events with an eventTime name who reported what, events
// without one only agree with their object's namespace.
func legacyValidateEvent(e *corev1.Event) field.ErrorList {
	var errs field.ErrorList
	nsPath := field.NewPath("involvedObject", "namespace")
	if e.EventTime.IsZero() {
		if e.InvolvedObject.Namespace == "" {
			if e.Namespace != metav1.NamespaceNone && e.Namespace != metav1.NamespaceDefault {
				errs = append(errs, field.Invalid(nsPath, e.InvolvedObject.Namespace, "does not match event.namespace"))
			}
		} else if e.Namespace != e.InvolvedObject.Namespace {
			errs = append(errs, field.Invalid(nsPath, e.InvolvedObject.Namespace, "does not match event.namespace"))
		}
		return errs
	}
	if e.InvolvedObject.Namespace == "" && e.Namespace != metav1.NamespaceDefault && e.Namespace != metav1.NamespaceSystem {
		errs = append(errs, field.Invalid(nsPath, e.InvolvedObject.Namespace, "does not match event.namespace"))
	}
	if e.ReportingController == "" {
		errs = append(errs, field.Required(field.NewPath("reportingController"), ""))
	}
	for _, m := range validation.IsQualifiedName(e.ReportingController) {
		errs = append(errs, field.Invalid(field.NewPath("reportingController"), e.ReportingController, m))
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"reportingInstance", e.ReportingInstance, 128}, {"action", e.Action, 128}, {"reason", e.Reason, 128}} {
		if f.v == "" {
			errs = append(errs, field.Required(field.NewPath(f.name), ""))
		}
		if len(f.v) > f.max {
			errs = append(errs, field.Invalid(field.NewPath(f.name), "", fmt.Sprintf("can have at most %d characters", f.max)))
		}
	}
	if len(e.Message) > 1024 {
		errs = append(errs, field.Invalid(field.NewPath("message"), "", "can have at most 1024 characters"))
	}
	return errs
}
