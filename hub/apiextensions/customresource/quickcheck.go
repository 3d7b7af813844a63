package customresource

import (
	"slices"
	"unicode/utf8"

	"k8s.io/kube-openapi/pkg/validation/spec"
)

// kube-openapi's schema validator, which checks a custom object against
// the OpenAPI schema of its version, builds a validator for every value
// it visits, eight checks each, and a result for each check: for a small
// object that is most of what validating a create costs. Most objects are
// valid, and most schemas use few keywords. quickCheck answers, without
// allocating, "valid" for an object that meets a schema of such keywords;
// for anything else (a keyword it does not know, a value it would refuse,
// a Go type decoding does not make) it answers "not known", and the
// validator runs and reports as before. It never answers "valid" for an
// object the validator refuses.
//
// The keywords it knows are those whose checks read the value alone: type
// (with nullable), properties, required, additionalProperties, items,
// minProperties, maxProperties, minItems, maxItems, minLength and
// maxLength. Descriptions, defaults, examples and extensions
// (x-kubernetes-*) do not take part in this validation. Any other keyword
// (enum, format, pattern, bounds, multipleOf, uniqueItems, allOf, anyOf,
// oneOf, not, patternProperties, ...) leaves the node unknown.

// quickCheck is a node of a schema, compiled. A nil *quickCheck is a
// schema nothing was compiled for: nothing is known.
type quickCheck struct {
	// known is false when the node has a keyword quickCheck does not
	// know.
	known bool
	// types is the type keyword (empty: any type); nullable allows null
	// whatever the type.
	types    []string
	nullable bool

	minLength, maxLength         *int64
	minItems, maxItems           *int64
	minProperties, maxProperties *int64
	items                        *quickCheck
	properties                   map[string]*quickCheck
	required                     []string
	// additional is how fields not among properties are checked.
	additional additionalRule
	// additionalSchema is their schema for additionalSchemaRule.
	additionalSchema *quickCheck
}

// additionalRule is what additionalProperties says of other fields.
type additionalRule int

const (
	additionalUnchecked  additionalRule = iota // absent, or true
	additionalRefused                          // false
	additionalSchemaRule                       // a schema
)

// knownType reports a value of type kube-openapi checks values against.
func knownType(t string) bool {
	switch t {
	case "object", "array", "string", "boolean", "integer", "number", "null":
		return true
	}
	return false
}

// newQuickCheck compiles s, the OpenAPI schema the version's validator
// checks against.
func newQuickCheck(s *spec.Schema) *quickCheck {
	if s == nil {
		return nil
	}
	q := &quickCheck{
		types:         s.Type,
		nullable:      s.Nullable,
		minLength:     s.MinLength,
		maxLength:     s.MaxLength,
		minItems:      s.MinItems,
		maxItems:      s.MaxItems,
		minProperties: s.MinProperties,
		maxProperties: s.MaxProperties,
		required:      s.Required,
	}
	q.known = s.Ref.String() == "" && len(s.AllOf) == 0 && len(s.AnyOf) == 0 && len(s.OneOf) == 0 && s.Not == nil &&
		len(s.Dependencies) == 0 && len(s.PatternProperties) == 0 && len(s.Enum) == 0 &&
		s.Format == "" && s.Pattern == "" && s.Maximum == nil && s.Minimum == nil && s.MultipleOf == nil &&
		!s.UniqueItems && s.AdditionalItems == nil && (s.Items == nil || len(s.Items.Schemas) == 0)
	for _, t := range s.Type {
		if !knownType(t) {
			q.known = false
		}
	}
	if !q.known {
		return q
	}
	if s.Items != nil && s.Items.Schema != nil {
		q.items = newQuickCheck(s.Items.Schema)
	}
	if len(s.Properties) > 0 {
		q.properties = make(map[string]*quickCheck, len(s.Properties))
		for name := range s.Properties {
			p := s.Properties[name]
			q.properties[name] = newQuickCheck(&p)
		}
	}
	switch ap := s.AdditionalProperties; {
	case ap == nil:
	case !ap.Allows:
		q.additional = additionalRefused
	case ap.Schema != nil:
		q.additional, q.additionalSchema = additionalSchemaRule, newQuickCheck(ap.Schema)
	}
	return q
}

// valid reports whether v is known to meet the schema.
func (q *quickCheck) valid(v any) bool {
	if q == nil || !q.known {
		return false
	}
	if v == nil {
		return len(q.types) == 0 || q.nullable || slices.Contains(q.types, "null")
	}
	switch v := v.(type) {
	case string:
		if !q.hasType("string") {
			return false
		}
		if q.minLength != nil || q.maxLength != nil {
			n := int64(utf8.RuneCountInString(v))
			if q.minLength != nil && n < *q.minLength || q.maxLength != nil && n > *q.maxLength {
				return false
			}
		}
		return true
	case bool:
		return q.hasType("boolean")
	case int64:
		// An integer meets type number too.
		return len(q.types) == 0 || slices.Contains(q.types, "integer") || slices.Contains(q.types, "number")
	case float64:
		// Whether a float meets type integer, and the range checks
		// that come with it, are left to the validator.
		return len(q.types) == 0 || slices.Contains(q.types, "number")
	case []any:
		if !q.hasType("array") {
			return false
		}
		n := int64(len(v))
		if q.minItems != nil && n < *q.minItems || q.maxItems != nil && n > *q.maxItems {
			return false
		}
		if q.items != nil {
			for _, item := range v {
				if !q.items.valid(item) {
					return false
				}
			}
		}
		return true
	case map[string]any:
		return q.hasType("object") && q.validObject(v)
	}
	return false
}

// hasType reports whether the type keyword allows a value of type t.
func (q *quickCheck) hasType(t string) bool {
	return len(q.types) == 0 || slices.Contains(q.types, t)
}

// validObject is valid for an object.
func (q *quickCheck) validObject(m map[string]any) bool {
	n := int64(len(m))
	if q.minProperties != nil && n < *q.minProperties || q.maxProperties != nil && n > *q.maxProperties {
		return false
	}
	for _, r := range q.required {
		if _, ok := m[r]; !ok {
			return false
		}
	}
	for k, v := range m {
		if p, ok := q.properties[k]; ok {
			if !p.valid(v) {
				return false
			}
			continue
		}
		switch q.additional {
		case additionalRefused:
			return false
		case additionalSchemaRule:
			if !q.additionalSchema.valid(v) {
				return false
			}
		}
	}
	return true
}
