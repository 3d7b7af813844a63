package customresource

import (
	"context"
	"fmt"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource/tableconvertor"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/util/jsonpath"

	"github.com/tether-edge/tether/hub/registry"
)

// creationTimestampDescription is ObjectMeta's description of
// creationTimestamp, which upstream gives its default Age column.
var creationTimestampDescription = metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"]

// table returns the columns and cells of the server-side table: Name, then
// the version's additionalPrinterColumns, or Name and Age without any, as
// upstream's table convertor. A column whose JSONPath does not parse ends
// the columns there, as upstream falls back to what it could build.
func table(cols []apiextensionsv1.CustomResourceColumnDefinition) ([]metav1.TableColumnDefinition, func(runtime.Object, time.Time) []any, error) {
	if len(cols) == 0 {
		cols = []apiextensionsv1.CustomResourceColumnDefinition{{
			Name: "Age", Type: "date", Description: creationTimestampDescription, JSONPath: ".metadata.creationTimestamp",
		}}
	}
	conv, _ := tableconvertor.New(cols)
	head, err := conv.ConvertToTable(context.Background(), &unstructured.Unstructured{Object: map[string]any{}}, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("build table columns: %w", err)
	}
	columns := head.ColumnDefinitions
	// Date cells are ages; the convertor computes them against the
	// clock, so they are computed again against the time asked for.
	dates := map[int]*jsonpath.JSONPath{}
	for i, c := range columns[1:] {
		if c.Type != "date" {
			continue
		}
		p := jsonpath.New(c.Name)
		p.AllowMissingKeys(true)
		if err := p.Parse("{" + cols[i].JSONPath + "}"); err == nil {
			dates[i+1] = p
		}
	}
	cells := func(obj runtime.Object, now time.Time) []any {
		t, err := conv.ConvertToTable(context.Background(), obj, &metav1.TableOptions{NoHeaders: true})
		if err != nil || len(t.Rows) == 0 {
			return make([]any, len(columns))
		}
		row := t.Rows[0].Cells
		u, ok := obj.(runtime.Unstructured)
		if !ok {
			return row
		}
		for i, p := range dates {
			if i < len(row) && row[i] != nil {
				row[i] = dateCell(p, u.UnstructuredContent(), now)
			}
		}
		return row
	}
	return columns, cells, nil
}

// dateCell renders the timestamp at p as an age against now, "<invalid>"
// when it is not a timestamp, as upstream's date columns do.
func dateCell(p *jsonpath.JSONPath, obj map[string]any, now time.Time) any {
	res, err := p.FindResults(obj)
	if err != nil || len(res) == 0 || len(res[0]) == 0 {
		return nil
	}
	s, ok := res[0][0].Interface().(string)
	if !ok {
		return nil
	}
	var ts metav1.Time
	if err := ts.UnmarshalQueryParameter(s); err != nil {
		return "<invalid>"
	}
	if ts.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(ts.Time))
}

// selectableFields returns the kind's Fields and FieldLabels from the
// version's selectableFields: each field's label is its JSONPath without
// the leading dot, its value the value found there printed as upstream
// does (fmt.Sprint), "" when absent.
func selectableFields(sfs []apiextensionsv1.SelectableField) (func(runtime.Object) fields.Set, []string, error) {
	if len(sfs) == 0 {
		return nil, nil, nil
	}
	type selectable struct {
		label string
		path  *jsonpath.JSONPath
	}
	var sel []selectable
	var labels []string
	for _, sf := range sfs {
		p := jsonpath.New("selectableField")
		p.AllowMissingKeys(true)
		if err := p.Parse("{" + sf.JSONPath + "}"); err != nil {
			return nil, nil, fmt.Errorf("parse selectable field %q: %w", sf.JSONPath, err)
		}
		label := strings.TrimPrefix(sf.JSONPath, ".")
		sel = append(sel, selectable{label, p})
		labels = append(labels, label)
	}
	get := func(obj runtime.Object) fields.Set {
		set := make(fields.Set, len(sel))
		u, ok := obj.(runtime.Unstructured)
		if !ok {
			return set
		}
		content := u.UnstructuredContent()
		for _, s := range sel {
			set[s.label] = ""
			res, err := s.path.FindResults(content)
			if err != nil || len(res) != 1 || len(res[0]) != 1 {
				continue
			}
			if v := res[0][0].Interface(); v != nil {
				set[s.label] = fmt.Sprint(v)
			}
		}
		return set
	}
	return get, labels, nil
}

// scaleAccess reads and writes the replicas behind /scale at the paths the
// scale subresource names; a missing value reads as 0.
func scaleAccess(scale *apiextensionsv1.CustomResourceSubresourceScale) *registry.ScaleAccess {
	specPath := splitPath(scale.SpecReplicasPath)
	statusPath := splitPath(scale.StatusReplicasPath)
	var selectorPath []string
	if scale.LabelSelectorPath != nil && *scale.LabelSelectorPath != "" {
		selectorPath = splitPath(*scale.LabelSelectorPath)
	}
	return &registry.ScaleAccess{
		Get: func(obj runtime.Object) (int32, int32, string) {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				return 0, 0, ""
			}
			spec, _, _ := unstructured.NestedInt64(u.Object, specPath...)
			status, _, _ := unstructured.NestedInt64(u.Object, statusPath...)
			var selector string
			if selectorPath != nil {
				selector, _, _ = unstructured.NestedString(u.Object, selectorPath...)
			}
			return int32(spec), int32(status), selector
		},
		Set: func(obj runtime.Object, replicas int32) {
			if u, ok := obj.(*unstructured.Unstructured); ok {
				_ = unstructured.SetNestedField(u.Object, int64(replicas), specPath...)
			}
		},
	}
}
