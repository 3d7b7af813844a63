package storage

import (
	"bytes"
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
	"sigs.k8s.io/structured-merge-diff/v6/typed"

	"github.com/tether-edge/tether/hub/registry"
)

// The managed fields of an Update (create, update, patch, binding) come
// from comparing the live object with the new one as structured-merge-diff
// typed values, and from decoding, adjusting and encoding again every
// managedFields entry of the object. Done by the field manager on whole
// objects, that cost more than the rest of a write. What makes it cheaper
// without changing its result:
//
//   - updateEntries does the field manager's bookkeeping of an Update
//     itself for the common case (entries of the kind's version, too few
//     to be merged, taken from the live object), decoding each distinct
//     entry once (setCache: the objects of one template carry identical
//     entries) and encoding only the entries that changed. Other cases go
//     to the field manager, with the two cheaper inputs below.
//   - updateConverter builds typed values of Go objects with the schema
//     and type of their kind, looked up once per kind, and validates them
//     as the plain converter does (an object that fails goes to the plain
//     converter, which reports the error). It leaves the live object's
//     managedFields out: the field manager has decoded them
//     before it converts; in the comparison they only ever show up as
//     removed, which matters only to a manager that owns fields under
//     metadata.managedFields, which the converter checks for.
//   - pruneEqual drops, from copies of the live and the new object, every
//     field the two have identical (reflect.DeepEqual), recursing into
//     structs. A comparison only reports paths under which the two values
//     differ, so it reports the same paths for the pruned copies.
//
// TestRecordUpdateMatchesFieldManager and
// TestRecordCreateMatchesFieldManager hold all of this to the field
// manager's results. Server-side apply keeps the field managers built on
// the plain converter: it merges typed values and turns them back into
// objects.

// updateConverter is the managedfields.TypeConverter of the field managers
// that record Update entries.
type updateConverter struct {
	inner  managedfields.TypeConverter
	scheme *runtime.Scheme

	mu sync.RWMutex
	// guards the following field
	types map[schema.GroupVersionKind]typed.ParseableType
}

func newUpdateConverter(inner managedfields.TypeConverter, scheme *runtime.Scheme) *updateConverter {
	return &updateConverter{inner: inner, scheme: scheme, types: map[schema.GroupVersionKind]typed.ParseableType{}}
}

// ObjectToTyped implements managedfields.TypeConverter.
func (c *updateConverter) ObjectToTyped(obj runtime.Object, opts ...typed.ValidationOptions) (*typed.TypedValue, error) {
	if _, ok := obj.(runtime.Unstructured); ok {
		return c.inner.ObjectToTyped(obj, opts...)
	}
	pt, ok := c.parseable(obj.GetObjectKind().GroupVersionKind())
	if !ok {
		return c.inner.ObjectToTyped(obj, opts...)
	}
	tv, err := pt.FromStructured(withoutManagedFields(obj), opts...)
	if err != nil {
		// The plain converter reports the error as the field manager
		// would.
		return c.inner.ObjectToTyped(obj, opts...)
	}
	return tv, nil
}

// TypedToObject implements managedfields.TypeConverter.
func (c *updateConverter) TypedToObject(tv *typed.TypedValue) (runtime.Object, error) {
	return c.inner.TypedToObject(tv)
}

// parseable returns the schema and type of a kind, found once by converting
// an empty object of the kind.
func (c *updateConverter) parseable(gvk schema.GroupVersionKind) (typed.ParseableType, bool) {
	c.mu.RLock()
	pt, ok := c.types[gvk]
	c.mu.RUnlock()
	if ok {
		return pt, pt.Schema != nil
	}
	if gvk.Empty() {
		return typed.ParseableType{}, false
	}
	if empty, err := c.scheme.New(gvk); err == nil {
		empty.GetObjectKind().SetGroupVersionKind(gvk)
		if tv, err := c.inner.ObjectToTyped(empty, typed.AllowDuplicates); err == nil {
			pt = typed.ParseableType{Schema: tv.Schema(), TypeRef: tv.TypeRef()}
		}
	}
	c.mu.Lock()
	c.types[gvk] = pt
	c.mu.Unlock()
	return pt, pt.Schema != nil
}

// withoutManagedFields returns obj, or a shallow copy of it without
// metadata.managedFields when it has entries none of which owns fields
// under metadata.managedFields.
func withoutManagedFields(obj runtime.Object) runtime.Object {
	m, err := meta.Accessor(obj)
	if err != nil {
		return obj
	}
	mf := m.GetManagedFields()
	if len(mf) == 0 {
		return obj
	}
	for _, e := range mf {
		if e.FieldsV1 != nil && bytes.Contains(e.FieldsV1.GetRawBytes(), []byte(`"f:managedFields"`)) {
			return obj
		}
	}
	cp, ok := shallowCopy(obj)
	if !ok {
		return obj
	}
	if cm, err := meta.Accessor(cp); err == nil {
		cm.SetManagedFields(nil)
		return cp
	}
	return obj
}

// shallowCopy copies the struct a typed object points to.
func shallowCopy(obj runtime.Object) (runtime.Object, bool) {
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil, false
	}
	cp := reflect.New(v.Elem().Type())
	cp.Elem().Set(v.Elem())
	out, ok := cp.Interface().(runtime.Object)
	return out, ok
}

var (
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	typeMetaType      = reflect.TypeFor[metav1.TypeMeta]()
	objectMetaType    = reflect.TypeFor[metav1.ObjectMeta]()
)

// pruneEqual returns shallow copies of live and obj without the fields the
// two have identical, for computing managed fields. TypeMeta is kept, and
// ObjectMeta unless meta is set: the field manager reads the kind, the uid
// and the managedFields there. ok is false when the objects are not typed
// structs of the same type.
func pruneEqual(live, obj runtime.Object, meta bool) (plive, pobj runtime.Object, ok bool) {
	a, b := reflect.ValueOf(live), reflect.ValueOf(obj)
	if a.Type() != b.Type() {
		return nil, nil, false
	}
	if plive, ok = shallowCopy(live); !ok {
		return nil, nil, false
	}
	if pobj, ok = shallowCopy(obj); !ok {
		return nil, nil, false
	}
	pruneStruct(reflect.ValueOf(plive).Elem(), reflect.ValueOf(pobj).Elem(), true, meta)
	return plive, pobj, true
}

// pruneStruct zeroes the fields a and b (addressable structs of one type,
// owned by the caller) have identical and prunes inside the others where
// that keeps every value present that was present. It reports whether a
// and b were identical. top marks the object itself, whose TypeMeta, and
// ObjectMeta unless meta is set, are left alone. Every value is compared
// once: a struct is identical when all its fields are.
func pruneStruct(a, b reflect.Value, top, meta bool) bool {
	same := true
	for i, f := range planOf(a.Type()) {
		fa, fb := a.Field(i), b.Field(i)
		how := f.how
		if top && (f.typeMeta || f.objectMeta && !meta) {
			how = keep
		}
		equal := false
		switch how {
		case keep, leaf:
			equal = leafEqual(fa, fb)
		case inStruct:
			equal = pruneStruct(fa, fb, false, false)
		case inPointer:
			if fa.IsNil() || fb.IsNil() {
				equal = fa.IsNil() && fb.IsNil()
				break
			}
			ca, cb := reflect.New(f.elem), reflect.New(f.elem)
			ca.Elem().Set(fa.Elem())
			cb.Elem().Set(fb.Elem())
			equal = pruneStruct(ca.Elem(), cb.Elem(), false, false)
			fa.Set(ca)
			fb.Set(cb)
		}
		if !equal {
			same = false
		} else if how != keep {
			fa.SetZero()
			fb.SetZero()
		}
	}
	return same
}

// leafEqual is reflect.DeepEqual of two values of one type, without
// copying them.
func leafEqual(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.String:
		return a.String() == b.String()
	case reflect.Bool:
		return a.Bool() == b.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return a.Int() == b.Int()
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
	case reflect.Slice, reflect.Map:
		if a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return false
		}
		if a.Len() == 0 {
			return true
		}
	}
	return reflect.DeepEqual(a.Addr().Interface(), b.Addr().Interface())
}

// How pruneStruct treats a field.
const (
	// leaf: compared whole, zeroed when identical.
	leaf = iota
	// keep: compared, never zeroed (unexported fields; the object's
	// TypeMeta and ObjectMeta).
	keep
	// inStruct, inPointer: a struct, or a pointer to one, pruned inside.
	inStruct
	inPointer
)

type fieldPlan struct {
	how                  int
	elem                 reflect.Type // inPointer: the struct type
	typeMeta, objectMeta bool
}

// plans caches planOf per struct type.
var plans sync.Map // reflect.Type → []fieldPlan

// planOf returns how pruneStruct treats each field of struct type t.
func planOf(t reflect.Type) []fieldPlan {
	if p, ok := plans.Load(t); ok {
		return p.([]fieldPlan)
	}
	p := make([]fieldPlan, t.NumField())
	for i := range p {
		f := t.Field(i)
		p[i].typeMeta, p[i].objectMeta = f.Type == typeMetaType, f.Type == objectMetaType
		switch {
		case !f.IsExported():
			p[i].how = keep
		case !descend(f):
			p[i].how = leaf
		case f.Type.Kind() == reflect.Struct:
			p[i].how = inStruct
		default:
			p[i].how, p[i].elem = inPointer, f.Type.Elem()
		}
	}
	plans.Store(t, p)
	return p
}

// descend reports whether pruning may go inside a field that differs: a
// struct, or a pointer to one, that is converted field by field (not
// through its own JSON form) and that is never left out for being zero.
func descend(f reflect.StructField) bool {
	t := f.Type
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return false
	}
	if t.Implements(jsonMarshalerType) || reflect.PointerTo(t).Implements(jsonMarshalerType) {
		return false
	}
	if strings.Contains(f.Tag.Get("json"), "omitzero") {
		return false
	}
	return true
}

// maxCachedSets bounds the decoded managedFields sets kept for reuse.
const maxCachedSets = 1024

// setKey names one encoded field set as reconciled with one kind's schema.
type setKey struct {
	gvk schema.GroupVersionKind
	raw string
}

// decodedSet is one managedFields entry's fieldsV1, decoded.
type decodedSet struct {
	set *fieldpath.Set
	// canonical: encoding set gives raw back byte for byte.
	canonical bool
}

// setCache keeps decoded field sets: the entries of an object's
// managedFields are decoded again on every update of the object, and the
// objects of one template carry identical entries.
type setCache struct {
	mu sync.Mutex
	// guards the following fields
	m      map[setKey]decodedSet
	merged map[mergeKey][]byte
}

// decode returns the set of raw, reconciled with tv's schema as the field
// manager does before every update.
func (c *setCache) decode(gvk schema.GroupVersionKind, raw []byte, tv *typed.TypedValue) (decodedSet, error) {
	key := setKey{gvk, string(raw)}
	c.mu.Lock()
	d, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return d, nil
	}
	set := &fieldpath.Set{}
	if err := set.FromJSON(bytes.NewReader(raw)); err != nil {
		return decodedSet{}, err
	}
	canonical := false
	reconciled, err := typed.ReconcileFieldSetWithSchema(set, tv)
	if err != nil {
		return decodedSet{}, err
	}
	if reconciled != nil {
		set = reconciled
	} else if enc, err := set.ToJSON(); err == nil && bytes.Equal(enc, raw) {
		canonical = true
	}
	d = decodedSet{set: set, canonical: canonical}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedSets {
		c.m = make(map[setKey]decodedSet, maxCachedSets)
	}
	c.m[key] = d
	c.mu.Unlock()
	return d, nil
}

// merge returns the encoding of the union of the sets encoded as a and b,
// computing it with union the first time.
func (c *setCache) merge(gvk schema.GroupVersionKind, a, b []byte, union func() ([]byte, error)) ([]byte, error) {
	key := mergeKey{gvk, string(a), string(b)}
	c.mu.Lock()
	out, ok := c.merged[key]
	c.mu.Unlock()
	if ok {
		return out, nil
	}
	out, err := union()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.merged == nil || len(c.merged) >= maxCachedSets {
		c.merged = make(map[mergeKey][]byte, maxCachedSets)
	}
	c.merged[key] = out
	c.mu.Unlock()
	return out, nil
}

// mergeKey names the union of two encoded field sets.
type mergeKey struct {
	gvk  schema.GroupVersionKind
	a, b string
}

// stripSet holds the fields the field manager never records.
var stripSet = fieldpath.NewSet(
	fieldpath.MakePathOrDie("apiVersion"),
	fieldpath.MakePathOrDie("kind"),
	fieldpath.MakePathOrDie("metadata"),
	fieldpath.MakePathOrDie("metadata", "name"),
	fieldpath.MakePathOrDie("metadata", "namespace"),
	fieldpath.MakePathOrDie("metadata", "creationTimestamp"),
	fieldpath.MakePathOrDie("metadata", "selfLink"),
	fieldpath.MakePathOrDie("metadata", "uid"),
	fieldpath.MakePathOrDie("metadata", "clusterName"),
	fieldpath.MakePathOrDie("metadata", "generation"),
	fieldpath.MakePathOrDie("metadata", "managedFields"),
	fieldpath.MakePathOrDie("metadata", "resourceVersion"),
)

// maxUpdateManagers is how many Update entries the field manager keeps
// before it merges the oldest.
const maxUpdateManagers = 10

// managerID is what makes a managedFields entry one manager's: entries of
// an Apply are one manager's whatever their version.
type managerID struct {
	manager, operation, apiVersion, subresource string
}

func idOf(e *metav1.ManagedFieldsEntry) managerID {
	id := managerID{e.Manager, string(e.Operation), e.APIVersion, e.Subresource}
	if e.Operation == metav1.ManagedFieldsOperationApply {
		id.apiVersion = ""
	}
	return id
}

// updateEntries computes the managedFields an Update by manager records
// on obj, replacing live (a stored object of the same typed kind, or an
// empty one for a create), for the common case: the managed fields come
// from live, every entry is of k's version and valid, and there are too
// few for the oldest to be merged. It gives what the field manager gives (see
// TestRecordUpdateMatchesFieldManager), decoding each distinct entry once
// and comparing only what differs. ok is false when the case is not the
// common one; the caller then runs the field manager.
func (s *Storage) updateEntries(k *registry.Kind, sub string, live, obj runtime.Object, manager string) (out []metav1.ManagedFieldsEntry, ok bool) {
	lm, err1 := meta.Accessor(live)
	nm, err2 := meta.Accessor(obj)
	if err1 != nil || err2 != nil || manager == "" || !utf8.ValidString(manager) {
		return nil, false
	}
	entries := lm.GetManagedFields()
	if len(entries)+1 > maxUpdateManagers {
		return nil, false
	}
	if len(entries) == 0 && lm.GetUID() != "" {
		// Fields of a stored object nobody manages are not tracked from
		// then on (only creates start tracking).
		if nm.GetManagedFields() != nil {
			return nil, false
		}
		return nil, true
	}
	if sub == "" {
		// The field manager takes the new object's entries unless there
		// are none (a reset, an empty non-nil list, is not handled here).
		if nf := nm.GetManagedFields(); nf != nil && !reflect.DeepEqual(nf, entries) {
			return nil, false
		}
	}
	gv := k.GVK.GroupVersion().String()
	ids := make(map[managerID]int, len(entries)+1)
	for i := range entries {
		e := &entries[i]
		switch e.Operation {
		case metav1.ManagedFieldsOperationApply, metav1.ManagedFieldsOperationUpdate:
		default:
			return nil, false
		}
		if e.APIVersion != gv || e.FieldsType != "FieldsV1" || e.FieldsV1 == nil ||
			!utf8.ValidString(e.Manager) || !utf8.ValidString(e.Subresource) ||
			bytes.Contains(e.FieldsV1.GetRawBytes(), []byte(`"f:managedFields"`)) {
			return nil, false
		}
		id := idOf(e)
		if _, dup := ids[id]; dup {
			return nil, false
		}
		ids[id] = i
	}
	// The comparison is made without managedFields (the field manager
	// leaves them out of the new object, and the update converter out of
	// the live one), so metadata can be pruned like the rest.
	plive, pobj, ok := pruneEqual(live, obj, true)
	if !ok {
		return nil, false
	}
	for _, o := range []runtime.Object{plive, pobj} {
		m, err := meta.Accessor(o)
		if err != nil {
			return nil, false
		}
		m.SetManagedFields(nil)
	}
	uc := s.updateConverter(k)
	ltv, err := uc.ObjectToTyped(plive, typed.AllowDuplicates)
	if err != nil {
		return nil, false
	}
	ntv, err := uc.ObjectToTyped(pobj, typed.AllowDuplicates)
	if err != nil {
		return nil, false
	}
	cmp, err := ltv.Compare(ntv)
	if err != nil {
		return nil, false
	}
	if f := resetFilter(k, sub); f != nil {
		cmp.FilterFields(f)
	}
	changed := cmp.Modified.Union(cmp.Added)

	type result struct {
		e   metav1.ManagedFieldsEntry
		set *fieldpath.Set
		// raw is the entry's encoding when its set is unchanged.
		raw []byte
	}
	results := make([]result, 0, len(entries)+1)
	for i := range entries {
		e := entries[i]
		d, err := s.sets.decode(k.GVK, e.FieldsV1.GetRawBytes(), ltv)
		if err != nil {
			return nil, false
		}
		set, raw := d.set, e.FieldsV1.GetRawBytes()
		if !d.canonical {
			raw = nil
		}
		if conflict := set.Intersection(changed); !conflict.Empty() {
			set, raw = set.Difference(conflict), nil
		}
		if !cmp.Removed.Empty() && !set.Intersection(cmp.Removed).Empty() {
			set, raw = set.Difference(cmp.Removed), nil
		}
		if set.Empty() {
			continue
		}
		e.FieldsV1 = nil
		results = append(results, result{e: e, set: set, raw: raw})
	}
	own := fieldpath.NewSet().Difference(cmp.Removed).Union(cmp.Modified).Union(cmp.Added)
	if f := resetFilter(k, sub); f != nil {
		own = f.Filter(own)
	}
	own = own.Difference(stripSet)
	if !own.Empty() {
		me := metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: gv, Subresource: sub}
		now := &metav1.Time{Time: time.Now().UTC()}
		found := false
		for i := range results {
			r := &results[i]
			if idOf(&r.e) != idOf(&me) {
				continue
			}
			found = true
			r.e.Time = now
			if r.raw == nil {
				r.set = own.Union(r.set)
				break
			}
			// The manager's entry as stored, grown by the same fields as
			// the same write of another object of the template was.
			ownRaw, err := own.ToJSON()
			if err != nil {
				return nil, false
			}
			merged, err := s.sets.merge(k.GVK, r.raw, ownRaw, func() ([]byte, error) { return own.Union(r.set).ToJSON() })
			if err != nil {
				return nil, false
			}
			r.raw = merged
			break
		}
		if !found {
			me.Time = now
			results = append(results, result{e: me, set: own})
		}
	}
	if len(results) == 0 {
		return nil, true
	}
	out = make([]metav1.ManagedFieldsEntry, 0, len(results))
	for _, r := range results {
		raw := r.raw
		if raw == nil {
			if raw, err = r.set.ToJSON(); err != nil {
				return nil, false
			}
		}
		fields := &metav1.FieldsV1{}
		fields.SetRawBytes(raw)
		e := metav1.ManagedFieldsEntry{Manager: r.e.Manager, Operation: r.e.Operation, APIVersion: r.e.APIVersion,
			Time: r.e.Time, FieldsType: "FieldsV1", FieldsV1: fields, Subresource: r.e.Subresource}
		out = append(out, e)
	}
	sortEntries(out)
	return out, true
}

// sortEntries orders managedFields entries as the field manager does:
// by operation, then time (in seconds), manager, version and subresource.
func sortEntries(es []metav1.ManagedFieldsEntry) {
	sort.Slice(es, func(i, j int) bool {
		p, q := es[i], es[j]
		if p.Operation != q.Operation {
			return p.Operation < q.Operation
		}
		var ps, qs int64
		if p.Time != nil {
			ps = p.Time.Unix()
		}
		if q.Time != nil {
			qs = q.Time.Unix()
		}
		if ps != qs {
			return ps < qs
		}
		if p.Manager != q.Manager {
			return p.Manager < q.Manager
		}
		if p.APIVersion != q.APIVersion {
			return p.APIVersion < q.APIVersion
		}
		return p.Subresource < q.Subresource
	})
}

// resetFilter is the filter of the fields a write of sub may not own:
// status for the main resource, spec for /status.
func resetFilter(k *registry.Kind, sub string) fieldpath.Filter {
	if !k.HasStatus {
		return nil
	}
	p := "status"
	if sub == "status" {
		p = "spec"
	}
	return fieldpath.NewExcludeSetFilter(fieldpath.NewSet(fieldpath.MakePathOrDie(p)))
}
