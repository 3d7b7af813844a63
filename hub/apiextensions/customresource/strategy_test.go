package customresource

import (
	"reflect"
	"sort"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

const validWidget = `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec:
  image: nginx
  replicas: 3
  minReplicas: 1
  mode: Fast
  email: ops@example.com
  port: http
  ports: [{name: http, port: 80}, {name: https, port: 443}]
  tags: [a, b]
  template: {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {containers: []}}
`

// withSpec returns the valid widget with spec fields replaced.
func withSpec(t *testing.T, set map[string]any) *unstructured.Unstructured {
	u := obj(t, validWidget)
	spec := u.Object["spec"].(map[string]any)
	for k, v := range set {
		if v == nil {
			delete(spec, k)
		} else {
			spec[k] = v
		}
	}
	return u
}

func errorStrings(errs field.ErrorList) []string {
	out := []string{}
	for _, e := range errs {
		out = append(out, e.Error())
	}
	sort.Strings(out)
	return out
}

func TestPruneReturnsWhatTheSchemaDoesNotDeclare(t *testing.T) {
	k := widgetKinds(t)["v1"]
	for _, tc := range []struct {
		name, in, want string
		paths          []string
	}{{
		name: "unknown fields at every level",
		in: `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default, colour: blue}
extra: 1
spec: {image: nginx, junk: true, ports: [{name: http, port: 80, weight: 3}]}
status: {phase: Ready, age: 3}
`,
		want: `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec: {image: nginx, ports: [{name: http, port: 80}]}
status: {phase: Ready}
`,
		paths: []string{"extra", "metadata.colour", "spec.junk", "spec.ports[0].weight", "status.age"},
	}, {
		name: "preserve-unknown-fields keeps what is under it",
		in: `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec: {image: nginx, config: {anything: {goes: [1, 2]}}}
`,
		want: `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec: {image: nginx, config: {anything: {goes: [1, 2]}}}
`,
	}, {
		name: "an embedded resource keeps its content and loses unknown metadata",
		in: `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec:
  image: nginx
  template: {apiVersion: v1, kind: Pod, metadata: {name: p, shade: dark}, spec: {containers: [{name: c}]}}
`,
		want: `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec:
  image: nginx
  template: {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {containers: [{name: c}]}}
`,
		paths: []string{"spec.template.metadata.shade"},
	}, {
		name: "a null the schema neither allows nor defaults goes",
		in: `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec: {image: nginx, email: null}
`,
		want: `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec: {image: nginx}
`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			u := obj(t, tc.in)
			paths := k.Prune(u)
			sort.Strings(paths)
			if len(paths) != 0 || len(tc.paths) != 0 {
				if !reflect.DeepEqual(paths, tc.paths) {
					t.Errorf("paths: got %v, want %v", paths, tc.paths)
				}
			}
			if want := obj(t, tc.want); !reflect.DeepEqual(u.Object, want.Object) {
				t.Errorf("pruned:\n got %v\nwant %v", u.Object, want.Object)
			}
		})
	}
}

func TestPreserveUnknownFieldsKeepsEverything(t *testing.T) {
	crd := loadCRD(t)
	crd.Spec.PreserveUnknownFields = true
	ks, err := Kinds(crd)
	if err != nil {
		t.Fatal(err)
	}
	u := withSpec(t, map[string]any{"junk": int64(1)})
	if paths := ks[0].Prune(u); len(paths) != 0 || u.Object["spec"].(map[string]any)["junk"] != int64(1) {
		t.Errorf("pruned %v: %v", paths, u.Object["spec"])
	}
}

func TestDefaultOnWriteAndOnRead(t *testing.T) {
	ks := widgetKinds(t)
	k := ks["v1"]
	u := obj(t, `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec: {image: nginx, ports: [{name: http}]}
`)
	k.Default(u)
	want := obj(t, `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default}
spec: {image: nginx, replicas: 1, minReplicas: 0, mode: Fast, ports: [{name: http, protocol: TCP}]}
`)
	if !reflect.DeepEqual(u.Object, want.Object) {
		t.Errorf("defaulted on write:\n got %v\nwant %v", u.Object, want.Object)
	}

	// An object stored before the schema had defaults (and with a field
	// the schema has since dropped) reads back defaulted and pruned,
	// with a generation.
	stored := obj(t, `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default, labels: 7}
spec: {image: nginx, retired: yes}
`)
	k.DefaultOnRead(stored)
	want = obj(t, `
apiVersion: example.tether.dev/v1
kind: Widget
metadata: {name: w, namespace: default, generation: 1}
spec: {image: nginx, replicas: 1, minReplicas: 0, mode: Fast}
`)
	if !reflect.DeepEqual(stored.Object, want.Object) {
		t.Errorf("defaulted on read:\n got %v\nwant %v", stored.Object, want.Object)
	}

	// Each version defaults by its own schema.
	beta := obj(t, `
apiVersion: example.tether.dev/v1beta1
kind: Widget
metadata: {name: w, namespace: default}
spec: {image: nginx}
`)
	ks["v1beta1"].Default(beta)
	if got, _, _ := unstructured.NestedInt64(beta.Object, "spec", "replicas"); got != 1 {
		t.Errorf("v1beta1 replicas default %d", got)
	}
	if _, found := beta.Object["spec"].(map[string]any)["mode"]; found {
		t.Errorf("v1beta1 got v1's default mode")
	}
}

func TestValidateAsKubeAPIServer(t *testing.T) {
	k := widgetKinds(t)["v1"]
	blocked := "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"
	for _, tc := range []struct {
		name string
		obj  *unstructured.Unstructured
		want []string
	}{
		{"valid", obj(t, validWidget), nil},
		{"int-or-string takes an integer", withSpec(t, map[string]any{"port": int64(8080)}), nil},
		{"maximum", withSpec(t, map[string]any{"replicas": int64(12)}), []string{
			"spec.replicas: Invalid value: 12: spec.replicas in body should be less than or equal to 10"}},
		{"minimum", withSpec(t, map[string]any{"replicas": int64(-1), "minReplicas": int64(-2)}), []string{
			".spec.replicas: Invalid value: -1: should be a non-negative integer",
			"spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"}},
		{"enum", withSpec(t, map[string]any{"mode": "Medium"}), []string{
			`spec.mode: Unsupported value: "Medium": supported values: "Fast", "Slow"`, blocked}},
		{"format", withSpec(t, map[string]any{"email": "nope"}), []string{
			`spec.email: Invalid value: "nope": spec.email in body must be of type email: "nope"`, blocked}},
		{"type", withSpec(t, map[string]any{"minReplicas": "one"}), []string{
			`spec.minReplicas: Invalid value: "string": spec.minReplicas in body must be of type integer: "string"`, blocked}},
		{"required", withSpec(t, map[string]any{"image": nil}), []string{"spec.image: Required value", blocked}},
		{"int-or-string refuses a boolean", withSpec(t, map[string]any{"port": true}), []string{
			`<nil>: Invalid value: "": "spec.port" must validate at least one schema (anyOf)`,
			`spec.port: Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean"`,
			`spec.port: Invalid value: "boolean": spec.port in body must be of type integer: "boolean"`,
			blocked}},
		{"list-map keys are unique", withSpec(t, map[string]any{"ports": []any{
			map[string]any{"name": "http", "port": int64(80)}, map[string]any{"name": "http", "port": int64(81)}}}), []string{
			`spec.ports[1]: Duplicate value: {"name":"http"}`}},
		{"list-set values are unique", withSpec(t, map[string]any{"tags": []any{"a", "a"}}), []string{
			`spec.tags[1]: Duplicate value: "a"`}},
		{"embedded resource needs apiVersion and kind", withSpec(t, map[string]any{"template": map[string]any{"spec": map[string]any{}}}), []string{
			"spec.template.apiVersion: Required value", "spec.template.kind: Required value", blocked}},
		{"embedded resource metadata", withSpec(t, map[string]any{"template": map[string]any{
			"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "a/b"}}}), []string{
			`spec.template.metadata.name: Invalid value: "a/b": may not contain '/'`}},
		{"CEL rule", withSpec(t, map[string]any{"replicas": int64(2), "minReplicas": int64(3)}), []string{
			"spec: Invalid value: minReplicas must not exceed replicas"}},
		{"metadata that is not ObjectMeta", func() *unstructured.Unstructured {
			u := obj(t, validWidget)
			u.Object["metadata"].(map[string]any)["labels"] = "x"
			return u
		}(), []string{`metadata: Invalid value: {"labels":"x","name":"w","namespace":"default"}: cannot restore map from string`}},
		{"wrong kind", func() *unstructured.Unstructured {
			u := obj(t, validWidget)
			u.SetKind("Gadget")
			return u
		}(), []string{`kind: Invalid value: "Gadget": must be Widget`}},
		{"wrong version", func() *unstructured.Unstructured {
			u := obj(t, validWidget)
			u.SetAPIVersion("example.tether.dev/v2")
			return u
		}(), []string{`apiVersion: Invalid value: "example.tether.dev/v2": must be example.tether.dev/v1`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := errorStrings(k.Validate(tc.obj))
			want := append([]string{}, tc.want...)
			sort.Strings(want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("errors:\n got %q\nwant %q", got, want)
			}
		})
	}

	// The whole message, as kubectl prints it.
	errs := k.Validate(withSpec(t, map[string]any{"replicas": int64(12)}))
	msg := apierrors.NewInvalid(schema.GroupKind{Group: "example.tether.dev", Kind: "Widget"}, "w", errs).Error()
	if msg != `Widget.example.tether.dev "w" is invalid: spec.replicas: Invalid value: 12: spec.replicas in body should be less than or equal to 10` {
		t.Errorf("message %q", msg)
	}
}

func TestValidateUpdateTransitionRulesAndRatcheting(t *testing.T) {
	k := widgetKinds(t)["v1"]
	blocked := "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"
	for _, tc := range []struct {
		name     string
		old, new *unstructured.Unstructured
		want     []string
	}{{
		name: "unchanged",
		old:  obj(t, validWidget), new: obj(t, validWidget),
	}, {
		name: "a transition rule sees oldSelf",
		old:  obj(t, validWidget), new: withSpec(t, map[string]any{"image": "redis"}),
		want: []string{`spec.image: Invalid value: "redis": image is immutable`},
	}, {
		name: "an invalid value the update leaves alone is not refused",
		old:  withSpec(t, map[string]any{"email": "nope"}),
		new:  withSpec(t, map[string]any{"email": "nope", "replicas": int64(4)}),
	}, {
		name: "an invalid value the update writes is refused",
		old:  obj(t, validWidget),
		new:  withSpec(t, map[string]any{"email": "nope"}),
		want: []string{`spec.email: Invalid value: "nope": spec.email in body must be of type email: "nope"`, blocked},
	}, {
		// As upstream, a value holds still for ratcheting when every
		// field in it is declared: the spec here has no template, whose
		// content the schema leaves open.
		name: "a CEL rule the unchanged spec already broke is not checked",
		old:  withSpec(t, map[string]any{"replicas": int64(2), "minReplicas": int64(3), "template": nil}),
		new: func() *unstructured.Unstructured {
			u := withSpec(t, map[string]any{"replicas": int64(2), "minReplicas": int64(3), "template": nil})
			u.SetLabels(map[string]string{"a": "b"})
			return u
		}(),
	}, {
		name: "duplicates already stored are not refused again",
		old:  withSpec(t, map[string]any{"tags": []any{"a", "a"}}),
		new:  withSpec(t, map[string]any{"tags": []any{"a", "a"}, "replicas": int64(5)}),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := errorStrings(k.ValidateUpdate(tc.new, tc.old))
			want := append([]string{}, tc.want...)
			sort.Strings(want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("errors:\n got %q\nwant %q", got, want)
			}
		})
	}
}

func TestStatusWrites(t *testing.T) {
	k := widgetKinds(t)["v1"]
	old := obj(t, validWidget)
	old.Object["status"] = map[string]any{"replicas": int64(1), "phase": "Pending"}

	// create drops status; an update of the main resource keeps the
	// stored status; neither is a generation change by itself.
	created := obj(t, validWidget)
	created.Object["status"] = map[string]any{"phase": "Ready"}
	k.PrepareForCreate(created)
	if _, ok := created.Object["status"]; ok {
		t.Errorf("create kept status")
	}
	upd := obj(t, validWidget)
	upd.Object["status"] = map[string]any{"phase": "Ready"}
	upd.SetLabels(map[string]string{"x": "y"})
	k.PrepareForUpdate(upd, old)
	if !reflect.DeepEqual(upd.Object["status"], old.Object["status"]) {
		t.Errorf("update changed status: %v", upd.Object["status"])
	}
	if k.GenerationChanged(upd, old) {
		t.Errorf("a label change bumps generation")
	}
	spec := withSpec(t, map[string]any{"replicas": int64(4)})
	k.PrepareForUpdate(spec, old)
	if !k.GenerationChanged(spec, old) {
		t.Errorf("a spec change does not bump generation")
	}

	// /status writes status alone, keeping the managedFields recorded.
	st := withSpec(t, map[string]any{"replicas": int64(9)})
	st.SetLabels(map[string]string{"x": "y"})
	st.Object["status"] = map[string]any{"replicas": int64(3), "phase": "Ready"}
	st.SetManagedFields(nil)
	k.PrepareForStatusUpdate(st, old)
	want := old.DeepCopy()
	want.Object["status"] = map[string]any{"replicas": int64(3), "phase": "Ready"}
	if !reflect.DeepEqual(st.Object, want.Object) {
		t.Errorf("status write:\n got %v\nwant %v", st.Object, want.Object)
	}

	for _, tc := range []struct {
		name   string
		status map[string]any
		want   []string
	}{
		{"valid", map[string]any{"replicas": int64(3), "conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}, nil},
		{"type", map[string]any{"phase": int64(5)}, []string{
			`status.phase: Invalid value: "integer": phase in body must be of type string: "integer"`,
			"<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"}},
		{"scale status replicas", map[string]any{"replicas": int64(-1)}, []string{
			".status.replicas: Invalid value: -1: should be a non-negative integer"}},
		{"required in a list item", map[string]any{"conditions": []any{map[string]any{"type": "Ready"}}}, []string{
			"status.conditions[0].status: Required value", "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"}},
		{"list-map keys", map[string]any{"conditions": []any{
			map[string]any{"type": "Ready", "status": "True"}, map[string]any{"type": "Ready", "status": "False"}}}, []string{
			`status.conditions[1]: Duplicate value: {"type":"Ready"}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := old.DeepCopy()
			u.Object["status"] = tc.status
			got := errorStrings(k.ValidateStatusUpdate(u, old))
			want := append([]string{}, tc.want...)
			sort.Strings(want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("errors:\n got %q\nwant %q", got, want)
			}
		})
	}
}
