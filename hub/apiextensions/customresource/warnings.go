package customresource

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/warning"

	"github.com/tether-edge/tether/hub/registry"
)

// standardFinalizers are the finalizer names Kubernetes itself uses that
// are not domain-qualified; they draw no warning.
var standardFinalizers = []string{
	metav1.FinalizerOrphanDependents,
	metav1.FinalizerDeleteDependents,
	string(corev1.FinalizerKubernetes),
}

// warnFinalizers is a custom resource's Admit: it records, as Warning
// headers, what kube-apiserver warns about the finalizers a create or an
// update adds (names that are not qualified names or not
// domain-qualified). It never refuses a write.
func warnFinalizers(ctx context.Context, _ registry.Lister, obj, old runtime.Object) error {
	for _, w := range finalizerWarnings(obj, old) {
		warning.AddWarning(ctx, "", w)
	}
	return nil
}

// finalizerWarnings returns the warnings for the finalizers of obj that
// old (nil on create) does not have, in name order.
func finalizerWarnings(obj, old runtime.Object) []string {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil
	}
	added := sets.New(m.GetFinalizers()...)
	if old != nil {
		if om, err := meta.Accessor(old); err == nil {
			added = added.Difference(sets.New(om.GetFinalizers()...))
		}
	}
	path := field.NewPath("metadata", "finalizers").String()
	var out []string
	for _, f := range sets.List(added) {
		for _, msg := range validation.IsQualifiedName(f) {
			out = append(out, fmt.Sprintf("%s: %q: %s", path, f, msg))
		}
		if strings.Contains(f, "/") || slices.Contains(standardFinalizers, f) {
			continue
		}
		if strings.Contains(f, ".") {
			out = append(out, fmt.Sprintf("%s: %q: prefer a domain-qualified finalizer name including a path (/) to avoid accidental conflicts with other finalizer writers", path, f))
		} else {
			out = append(out, fmt.Sprintf("%s: %q: prefer a domain-qualified finalizer name to avoid accidental conflicts with other finalizer writers", path, f))
		}
	}
	return out
}
