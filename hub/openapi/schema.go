package openapi

import (
	"encoding/json"
	"reflect"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Schema is the subset of an OpenAPI schema object the hub emits; it
// encodes the same in Swagger 2.0 and OpenAPI 3.0 except for $ref targets.
type Schema struct {
	Ref                  string             `json:"$ref,omitempty"`
	Description          string             `json:"description,omitempty"`
	Type                 string             `json:"type,omitempty"`
	Format               string             `json:"format,omitempty"`
	Items                *Schema            `json:"items,omitempty"`
	Properties           map[string]*Schema `json:"properties,omitempty"`
	AdditionalProperties *Schema            `json:"additionalProperties,omitempty"`
	Required             []string           `json:"required,omitempty"`
	AnyOf                []*Schema          `json:"anyOf,omitempty"`

	GVK           []gvkExt `json:"x-kubernetes-group-version-kind,omitempty"`
	IntOrString   bool     `json:"x-kubernetes-int-or-string,omitempty"`
	PatchStrategy string   `json:"x-kubernetes-patch-strategy,omitempty"`
	PatchMergeKey string   `json:"x-kubernetes-patch-merge-key,omitempty"`
	Unknown       bool     `json:"x-kubernetes-preserve-unknown-fields,omitempty"`
}

type gvkExt struct {
	Group   string `json:"group"`
	Kind    string `json:"kind"`
	Version string `json:"version"`
}

// builder collects the definitions reachable from a set of types.
type builder struct {
	v3   bool
	defs map[string]*Schema
	gvks map[reflect.Type][]gvkExt
}

func newBuilder(v3 bool) *builder {
	return &builder{v3: v3, defs: map[string]*Schema{}, gvks: map[reflect.Type][]gvkExt{}}
}

func (b *builder) ref(name string) *Schema {
	if b.v3 {
		return &Schema{Ref: "#/components/schemas/" + name}
	}
	return &Schema{Ref: "#/definitions/" + name}
}

// DefinitionName returns the name upstream gives the definition of t:
// the package path with its domain reversed, then the type name, as in
// io.k8s.api.core.v1.Pod.
func DefinitionName(t reflect.Type) string {
	pkg := t.PkgPath()
	first, rest, _ := strings.Cut(pkg, "/")
	parts := strings.Split(first, ".")
	for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	name := strings.Join(parts, ".")
	if rest != "" {
		name += "." + strings.ReplaceAll(rest, "/", ".")
	}
	return name + "." + t.Name()
}

var (
	timeType      = reflect.TypeFor[metav1.Time]()
	microTimeType = reflect.TypeFor[metav1.MicroTime]()
	durationType  = reflect.TypeFor[metav1.Duration]()
	quantityType  = reflect.TypeFor[resource.Quantity]()
	intOrStrType  = reflect.TypeFor[intstr.IntOrString]()
	rawExtType    = reflect.TypeFor[runtime.RawExtension]()
	fieldsV1Type  = reflect.TypeFor[metav1.FieldsV1]()
	byteSliceType = reflect.TypeFor[[]byte]()
)

// special returns the schema of a type whose JSON form is not its Go shape.
func (b *builder) special(t reflect.Type) (*Schema, bool) {
	switch t {
	case timeType, microTimeType:
		return &Schema{Type: "string", Format: "date-time"}, true
	case durationType:
		return &Schema{Type: "string"}, true
	case quantityType:
		if b.v3 {
			return &Schema{AnyOf: []*Schema{{Type: "integer"}, {Type: "string"}}, IntOrString: true}, true
		}
		return &Schema{Type: "string"}, true
	case intOrStrType:
		if b.v3 {
			return &Schema{AnyOf: []*Schema{{Type: "integer"}, {Type: "string"}}, IntOrString: true}, true
		}
		return &Schema{Type: "string", Format: "int-or-string"}, true
	case rawExtType:
		return &Schema{Type: "object"}, true
	case fieldsV1Type:
		return &Schema{Type: "object"}, true
	}
	return nil, false
}

// schemaFor returns the schema of t, adding named struct types and special
// types to the definitions and referring to them.
func (b *builder) schemaFor(t reflect.Type) *Schema {
	if t == byteSliceType {
		return &Schema{Type: "string", Format: "byte"}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if s, ok := b.special(t); ok {
		name := DefinitionName(t)
		if _, done := b.defs[name]; !done {
			b.defs[name] = s
		}
		return b.ref(name)
	}
	switch t.Kind() {
	case reflect.Bool:
		return &Schema{Type: "boolean"}
	case reflect.Int32, reflect.Uint32, reflect.Int16, reflect.Uint16, reflect.Int8, reflect.Uint8:
		return &Schema{Type: "integer", Format: "int32"}
	case reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint64:
		return &Schema{Type: "integer", Format: "int64"}
	case reflect.Float32, reflect.Float64:
		return &Schema{Type: "number", Format: "double"}
	case reflect.String:
		return &Schema{Type: "string"}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return &Schema{Type: "string", Format: "byte"}
		}
		return &Schema{Type: "array", Items: b.schemaFor(t.Elem())}
	case reflect.Map:
		return &Schema{Type: "object", AdditionalProperties: b.schemaFor(t.Elem())}
	case reflect.Interface:
		return &Schema{Type: "object", Unknown: true}
	case reflect.Struct:
		if t.Name() == "" {
			return b.structSchema(t)
		}
		name := DefinitionName(t)
		if _, done := b.defs[name]; !done {
			b.defs[name] = &Schema{} // placeholder against recursion
			s := b.structSchema(t)
			s.GVK = b.gvks[t]
			b.defs[name] = s
		}
		return b.ref(name)
	}
	return &Schema{}
}

func (b *builder) structSchema(t reflect.Type) *Schema {
	s := &Schema{Type: "object", Properties: map[string]*Schema{}}
	b.addFields(s, t)
	if len(s.Properties) == 0 {
		s.Properties = nil
	}
	sort.Strings(s.Required)
	return s
}

func (b *builder) addFields(s *Schema, t reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		inline := strings.Contains(","+opts+",", ",inline,")
		if (f.Anonymous && name == "") || inline {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				b.addFields(s, ft)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		p := b.schemaFor(f.Type)
		ps, pk := f.Tag.Get("patchStrategy"), f.Tag.Get("patchMergeKey")
		if ps != "" || pk != "" {
			p.PatchStrategy, p.PatchMergeKey = ps, pk
		}
		s.Properties[name] = p
	}
}

// addKind records gvk for the Go type of obj so its definition carries
// x-kubernetes-group-version-kind, and returns the type's definition name.
func (b *builder) addKind(obj runtime.Object, gvk schema.GroupVersionKind) string {
	t := reflect.TypeOf(obj)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	ext := gvkExt{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind}
	for _, e := range b.gvks[t] {
		if e == ext {
			return DefinitionName(t)
		}
	}
	b.gvks[t] = append(b.gvks[t], ext)
	name := DefinitionName(t)
	if d, ok := b.defs[name]; ok {
		d.GVK = b.gvks[t]
	}
	return name
}

// mustJSON encodes v; the values encoded here are built in memory and
// always encodable.
func mustJSON(v any) []byte {
	out, err := json.Marshal(v)
	if err != nil {
		panic("encode openapi document: " + err.Error())
	}
	return out
}

func reflectTypeOf(v any) reflect.Type {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}
