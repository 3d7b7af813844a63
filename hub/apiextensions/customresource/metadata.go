package customresource

import (
	"time"
	"unicode/utf8"
)

// Coercing a custom object reads its metadata as metav1.ObjectMeta and
// writes that back (schemaobjectmeta.GetObjectMetaWithOptions, then
// SetObjectMeta), as upstream's decoder does on every write and read. For
// metadata already in the form that round trip writes, it changes
// nothing and reports no unknown field, yet it costs a JSON encoding and
// decoding and a reflective conversion of every managedFields entry.
// roundTripsAsIs recognizes the common such metadata, so that coerce can
// leave it as it is.

// roundTripsAsIs reports whether metadata is known to come out of the
// ObjectMeta round trip unchanged, with no unknown or malformed field:
// only fields of ObjectMeta, each of the type and in the form the round
// trip writes (strings not empty, valid UTF-8; generation an int64 not
// zero; timestamps in RFC 3339 UTC; maps and lists not empty). Anything
// else, including fields that are merely rare (ownerReferences,
// deletionTimestamp), is false: the caller does the round trip.
func roundTripsAsIs(metadata any) bool {
	m, ok := metadata.(map[string]any)
	if !ok || m == nil {
		return false
	}
	for key, v := range m {
		switch key {
		case "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion":
			if !nonEmptyString(v) {
				return false
			}
		case "generation":
			if n, ok := v.(int64); !ok || n == 0 {
				return false
			}
		case "creationTimestamp":
			if !canonicalTime(v) {
				return false
			}
		case "labels", "annotations":
			if !stringMap(v) {
				return false
			}
		case "finalizers":
			l, ok := v.([]any)
			if !ok || len(l) == 0 {
				return false
			}
			for _, f := range l {
				if s, ok := f.(string); !ok || !utf8.ValidString(s) {
					return false
				}
			}
		case "managedFields":
			l, ok := v.([]any)
			if !ok || len(l) == 0 {
				return false
			}
			for _, e := range l {
				if !managedFieldsEntryAsIs(e) {
					return false
				}
			}
		default:
			return false
		}
	}
	return true
}

// managedFieldsEntryAsIs is roundTripsAsIs for one managedFields entry.
func managedFieldsEntryAsIs(entry any) bool {
	e, ok := entry.(map[string]any)
	if !ok || e == nil {
		return false
	}
	for key, v := range e {
		switch key {
		case "manager", "operation", "apiVersion", "fieldsType", "subresource":
			if !nonEmptyString(v) {
				return false
			}
		case "time":
			if !canonicalTime(v) {
				return false
			}
		case "fieldsV1":
			// A field set: objects all the way down, which the round
			// trip passes through JSON unchanged.
			if !fieldSet(v, 0) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

func nonEmptyString(v any) bool {
	s, ok := v.(string)
	return ok && s != "" && utf8.ValidString(s)
}

// canonicalTime reports a timestamp metav1.Time reads and writes back as
// it is: RFC 3339 in UTC, whole seconds, not the zero time.
func canonicalTime(v any) bool {
	s, ok := v.(string)
	if !ok {
		return false
	}
	t, err := time.Parse(time.RFC3339, s)
	return err == nil && !t.IsZero() && t.UTC().Format(time.RFC3339) == s
}

// stringMap reports a map of strings that is not empty.
func stringMap(v any) bool {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		return false
	}
	for k, s := range m {
		if s, ok := s.(string); !ok || !utf8.ValidString(s) || !utf8.ValidString(k) {
			return false
		}
	}
	return true
}

// maxFieldSetDepth bounds fieldSet's recursion; deeper sets take the
// round trip.
const maxFieldSetDepth = 64

// fieldSet reports a non-nil object whose values are all such objects,
// with UTF-8 keys.
func fieldSet(v any, depth int) bool {
	m, ok := v.(map[string]any)
	if !ok || m == nil || depth > maxFieldSetDepth {
		return false
	}
	for k, c := range m {
		if !utf8.ValidString(k) || !fieldSet(c, depth+1) {
			return false
		}
	}
	return true
}
