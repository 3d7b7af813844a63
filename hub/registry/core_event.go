package registry

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var eventKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("Event"),
	Resource:   "events",
	Singular:   "event",
	Namespaced: true,
	ShortNames: []string{"ev"},
	Validate:   func(obj runtime.Object) field.ErrorList { return validateEvent(obj.(*corev1.Event)) },
	Fields:     func(obj runtime.Object) fields.Set { return eventFields(obj.(*corev1.Event)) },
	FieldLabels: []string{"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
		"involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
		"reason", "reportingComponent", "source", "type"},
	Columns: []metav1.TableColumnDefinition{
		column("Last Seen", "string", 0, "The time at which the most recent occurrence of this event was recorded."),
		column("Type", "string", 0, "Type of this event (Normal, Warning), new types could be added in the future."),
		column("Reason", "string", 0, "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
		column("Object", "string", 0, "The object that this event is about."),
		column("Subobject", "string", 1, "The field of the object this event is about, if any."),
		column("Source", "string", 1, "The component reporting this event."),
		column("Message", "string", 0, "A human-readable description of the status of this operation."),
		column("First Seen", "string", 1, "The time at which the event was first recorded."),
		column("Count", "string", 1, "The number of times this event has occurred."),
		{Name: "Name", Type: "string", Format: "name", Priority: 1, Description: nameColumn.Description},
	},
	Cells: func(obj runtime.Object, now time.Time) []any { return eventCells(obj.(*corev1.Event), now) },
}

func validateEvent(e *corev1.Event) field.ErrorList {
	var errs field.ErrorList
	nsPath := field.NewPath("involvedObject", "namespace")
	if e.EventTime.IsZero() {
		if e.InvolvedObject.Namespace == "" {
			if e.Namespace != "" && e.Namespace != metav1.NamespaceDefault {
				errs = append(errs, field.Invalid(nsPath, e.InvolvedObject.Namespace, "does not match event.namespace"))
			}
		} else if e.Namespace != e.InvolvedObject.Namespace {
			errs = append(errs, field.Invalid(nsPath, e.InvolvedObject.Namespace, "does not match event.namespace"))
		}
	} else {
		if e.InvolvedObject.Namespace == "" && e.Namespace != metav1.NamespaceDefault && e.Namespace != metav1.NamespaceSystem {
			errs = append(errs, field.Invalid(nsPath, e.InvolvedObject.Namespace, "does not match event.namespace"))
		}
		if e.ReportingController == "" {
			errs = append(errs, field.Required(field.NewPath("reportingComponent"), ""))
		}
		for _, msg := range validation.IsQualifiedName(e.ReportingController) {
			errs = append(errs, field.Invalid(field.NewPath("reportingComponent"), e.ReportingController, msg))
		}
		lengths := []struct {
			name, val string
			max       int
		}{{"reportingInstance", e.ReportingInstance, 128}, {"action", e.Action, 128}, {"reason", e.Reason, 128}}
		for _, l := range lengths {
			if l.val == "" {
				errs = append(errs, field.Required(field.NewPath(l.name), ""))
			}
			if len(l.val) > l.max {
				errs = append(errs, field.Invalid(field.NewPath(l.name), "", fmt.Sprintf("can have at most %d characters", l.max)))
			}
		}
		if len(e.Message) > 1024 {
			errs = append(errs, field.Invalid(field.NewPath("message"), "", "can have at most 1024 characters"))
		}
	}
	for _, msg := range validation.IsDNS1123Subdomain(e.Namespace) {
		errs = append(errs, field.Invalid(field.NewPath("namespace"), e.Namespace, msg))
	}
	return errs
}

func microAge(t metav1.MicroTime, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return age(metav1.NewTime(t.Time), now)
}

func eventCells(e *corev1.Event, now time.Time) []any {
	first := age(e.FirstTimestamp, now)
	if e.FirstTimestamp.IsZero() {
		first = microAge(e.EventTime, now)
	}
	last := age(e.LastTimestamp, now)
	if e.LastTimestamp.IsZero() {
		last = first
	}
	count := e.Count
	if e.Series != nil {
		last = microAge(e.Series.LastObservedTime, now)
		count = e.Series.Count
	} else if count == 0 {
		count = 1
	}
	target := strings.ToLower(e.InvolvedObject.Kind)
	if e.InvolvedObject.Name != "" {
		target += "/" + e.InvolvedObject.Name
	}
	component := e.Source.Component
	if component == "" {
		component = e.ReportingController
	}
	host := e.Source.Host
	if host == "" {
		host = e.ReportingInstance
	}
	source := ""
	if component != "" {
		source = component
		if host != "" {
			source += ", " + host
		}
	}
	return []any{last, e.Type, e.Reason, target, e.InvolvedObject.FieldPath, source,
		strings.TrimSpace(e.Message), first, int64(count), e.Name}
}
