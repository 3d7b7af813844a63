package store

import (
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
)

// Matches reports whether an object with the given labels and fields is
// selected by the label and field selectors; nil selectors match everything.
// Backends share it so lists and watches filter identically.
func Matches(label labels.Selector, field fields.Selector, objLabels, objFields map[string]string) bool {
	if label != nil && !label.Empty() && !label.Matches(labels.Set(objLabels)) {
		return false
	}
	if field != nil && !field.Empty() && !field.Matches(fields.Set(objFields)) {
		return false
	}
	return true
}

// FilterEvent applies a filtered watch's selectors to one change, turning
// selector transitions into Added or Deleted as documented on [Event]. It
// reports false when the watch must not see the change at all.
func FilterEvent(label labels.Selector, field fields.Selector, ev Event) (Event, bool) {
	if (label == nil || label.Empty()) && (field == nil || field.Empty()) {
		return ev, true
	}
	switch ev.Type {
	case Added, Deleted:
		return ev, Matches(label, field, ev.Object.Labels, ev.Object.Fields)
	}
	cur := Matches(label, field, ev.Object.Labels, ev.Object.Fields)
	prev := ev.Prev != nil && Matches(label, field, ev.Prev.Labels, ev.Prev.Fields)
	switch {
	case cur && prev:
		return ev, true
	case cur:
		return Event{Type: Added, Object: ev.Object}, true
	case prev:
		old := *ev.Prev
		old.Revision = ev.Object.Revision
		return Event{Type: Deleted, Object: old, Prev: ev.Prev}, true
	}
	return Event{}, false
}
