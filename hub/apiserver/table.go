package apiserver

import (
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
)

// defaultColumns is the table of kinds without their own columns.
var defaultColumns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: metav1.ObjectMeta{}.SwaggerDoc()["name"]},
	{Name: "Created At", Type: "date", Description: metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"]},
}

// toTable converts an object or a list of kind k to a Table. includeObject
// is the query parameter (Metadata by default); withColumns says whether to
// include the column definitions.
func (s *Server) toTable(k *registry.Kind, obj runtime.Object, includeObject string, withColumns bool) (*metav1.Table, error) {
	switch metav1.IncludeObjectPolicy(includeObject) {
	case "", metav1.IncludeMetadata, metav1.IncludeObject, metav1.IncludeNone:
	default:
		return nil, apierrors.NewBadRequest(fmt.Sprintf("unknown includeObject value %q", includeObject))
	}
	tbl := &metav1.Table{}
	var items []runtime.Object
	if meta.IsListType(obj) {
		var err error
		if items, err = meta.ExtractList(obj); err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		if l, err := meta.ListAccessor(obj); err == nil {
			tbl.ResourceVersion = l.GetResourceVersion()
			tbl.Continue = l.GetContinue()
			tbl.RemainingItemCount = l.GetRemainingItemCount()
		}
	} else {
		items = []runtime.Object{obj}
		if m, err := meta.Accessor(obj); err == nil {
			tbl.ResourceVersion = m.GetResourceVersion()
		}
	}
	if withColumns {
		tbl.ColumnDefinitions = defaultColumns
		if len(k.Columns) > 0 {
			tbl.ColumnDefinitions = k.Columns
		}
	}
	now := time.Now()
	tbl.Rows = make([]metav1.TableRow, 0, len(items))
	for _, it := range items {
		m, err := meta.Accessor(it)
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		row := metav1.TableRow{}
		if len(k.Columns) > 0 && k.Cells != nil {
			row.Cells = k.Cells(it, now)
		} else {
			created := ""
			if ts := m.GetCreationTimestamp(); !ts.IsZero() {
				created = ts.UTC().Format(time.RFC3339)
			}
			row.Cells = []any{m.GetName(), created}
		}
		switch metav1.IncludeObjectPolicy(includeObject) {
		case "", metav1.IncludeMetadata:
			p, err := toPartial(it)
			if err != nil {
				return nil, err
			}
			row.Object = runtime.RawExtension{Object: p}
		case metav1.IncludeObject:
			if err := s.setKind(it, k.GVK.GroupVersion()); err != nil {
				return nil, apierrors.NewInternalError(err)
			}
			row.Object = runtime.RawExtension{Object: it}
		}
		tbl.Rows = append(tbl.Rows, row)
	}
	return tbl, nil
}

// toPartial converts an object to PartialObjectMetadata and a list to
// PartialObjectMetadataList.
func toPartial(obj runtime.Object) (runtime.Object, error) {
	if meta.IsListType(obj) {
		items, err := meta.ExtractList(obj)
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		out := &metav1.PartialObjectMetadataList{}
		out.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind("PartialObjectMetadataList"))
		if l, err := meta.ListAccessor(obj); err == nil {
			out.ResourceVersion = l.GetResourceVersion()
			out.Continue = l.GetContinue()
			out.RemainingItemCount = l.GetRemainingItemCount()
		}
		for _, it := range items {
			p, err := toPartial(it)
			if err != nil {
				return nil, err
			}
			out.Items = append(out.Items, *p.(*metav1.PartialObjectMetadata))
		}
		return out, nil
	}
	p := &metav1.PartialObjectMetadata{}
	p.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind("PartialObjectMetadata"))
	if om, ok := partialMeta(obj); ok {
		p.ObjectMeta = *om
		return p, nil
	}
	acc, ok := obj.(metav1.ObjectMetaAccessor)
	if !ok {
		return nil, apierrors.NewInternalError(fmt.Errorf("object %T has no ObjectMeta", obj))
	}
	om, ok := acc.GetObjectMeta().(*metav1.ObjectMeta)
	if !ok {
		return nil, apierrors.NewInternalError(fmt.Errorf("object %T has no ObjectMeta", obj))
	}
	p.ObjectMeta = *om.DeepCopy()
	return p, nil
}
