package customresource

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestFinalizerWarnings(t *testing.T) {
	obj := func(finalizers ...string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{}}
		u.SetFinalizers(finalizers)
		return u
	}
	const prefer = ": prefer a domain-qualified finalizer name to avoid accidental conflicts with other finalizer writers"
	got := finalizerWarnings(obj("example.com/ok", "kubernetes", "foregroundDeletion", "orphan", "plain", "a.b", "-bad"), nil)
	want := []string{
		`metadata.finalizers: "-bad": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`,
		`metadata.finalizers: "-bad"` + prefer,
		`metadata.finalizers: "a.b": prefer a domain-qualified finalizer name including a path (/) to avoid accidental conflicts with other finalizer writers`,
		`metadata.finalizers: "plain"` + prefer,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("create:\n%q\nwant\n%q", got, want)
	}
	if got := finalizerWarnings(obj("plain", "other"), obj("plain")); !reflect.DeepEqual(got, []string{`metadata.finalizers: "other"` + prefer}) {
		t.Errorf("update: %q", got)
	}
}
