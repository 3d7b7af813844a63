package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// maxRetries bounds the read-modify-write loop of unconditional updates.
const maxRetries = 16

var namespaceGVK = corev1.SchemeGroupVersion.WithKind("Namespace")

func accessor(obj runtime.Object) (metav1.Object, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("object has no metadata: %v", err))
	}
	return m, nil
}

// checkNamespace resolves the object's namespace against the URL's.
func checkNamespace(k *registry.Kind, m metav1.Object, namespace string) error {
	if !k.Namespaced {
		m.SetNamespace("")
		return nil
	}
	switch m.GetNamespace() {
	case "":
		m.SetNamespace(namespace)
	case namespace:
	default:
		return apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
	}
	if m.GetNamespace() == "" {
		return apierrors.NewBadRequest("a namespace is required for " + k.Resource)
	}
	return nil
}

// clearStatus resets the Status field of a typed object, or removes the
// status of an unstructured one.
func clearStatus(obj runtime.Object) {
	if u, ok := isUnstructured(obj); ok {
		delete(u.Object, "status")
		return
	}
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer {
		return
	}
	f := v.Elem().FieldByName("Status")
	if f.IsValid() && f.CanSet() {
		f.Set(reflect.Zero(f.Type()))
	}
}

func nameRule(k *registry.Kind) metavalidation.ValidateNameFunc {
	if k.NameRule != nil {
		return k.NameRule
	}
	return metavalidation.NameIsDNSSubdomain
}

func invalid(k *registry.Kind, name string, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(k.GVK.GroupKind(), name, errs)
}

// Create implements API.
func (s *Storage) Create(ctx context.Context, k *registry.Kind, namespace string, obj runtime.Object, opts Options) (runtime.Object, error) {
	k, err := s.served(k)
	if err != nil {
		return nil, err
	}
	return s.create(ctx, k, namespace, obj, opts, true)
}

func (s *Storage) create(ctx context.Context, k *registry.Kind, namespace string, obj runtime.Object, opts Options, record bool) (runtime.Object, error) {
	m, err := accessor(obj)
	if err != nil {
		return nil, err
	}
	if err := checkNamespace(k, m, namespace); err != nil {
		return nil, err
	}
	if k.Namespaced {
		if err := s.namespaceAdmits(ctx, k, m.GetName(), m.GetNamespace()); err != nil {
			return nil, err
		}
	}
	generated := m.GetName() == "" && m.GetGenerateName() != ""
	if generated {
		m.SetName(m.GetGenerateName() + utilrand.String(5))
	}
	m.SetUID(uuid.NewUUID())
	m.SetCreationTimestamp(metav1.NewTime(time.Now().Truncate(time.Second)))
	m.SetDeletionTimestamp(nil)
	m.SetDeletionGracePeriodSeconds(nil)
	m.SetResourceVersion("")
	m.SetSelfLink("")
	m.SetGeneration(0)
	if hasGeneration(k) {
		m.SetGeneration(1)
	}
	if k.Default != nil {
		k.Default(obj)
	}
	// The writer owns what it sent and its defaults; what admission and
	// PrepareForCreate set afterwards belongs to no manager, as upstream,
	// so that a later apply that leaves such a field out keeps it.
	if record {
		empty, err := s.newObjectOf(k)
		if err != nil {
			return nil, err
		}
		if obj, err = s.recordUpdate(k, "", empty, obj, opts.FieldManager); err != nil {
			return nil, err
		}
		m, _ = accessor(obj)
	}
	if k.Mutate != nil {
		if err := k.Mutate(ctx, s.Lister(), obj, nil); err != nil {
			return nil, admitError(err)
		}
	}
	if err := s.mutateExternal(ctx, k, obj, nil, opts); err != nil {
		return nil, err
	}
	if k.HasStatus && !k.StatusOnCreate {
		clearStatus(obj)
	}
	if k.PrepareForCreate != nil {
		k.PrepareForCreate(obj)
	}
	errs := metavalidation.ValidateObjectMetaAccessor(m, k.Namespaced, nameRule(k), field.NewPath("metadata"))
	if k.Validate != nil {
		errs = append(errs, k.Validate(obj)...)
	}
	if err := invalid(k, m.GetName(), errs); err != nil {
		return nil, err
	}
	if k.Admit != nil {
		if err := k.Admit(ctx, s.admitLister(opts.DryRun), obj, nil); err != nil {
			return nil, admitError(err)
		}
	}
	release := func() {
		if !opts.DryRun {
			s.release(k, obj)
		}
	}
	for _, a := range s.admission {
		done, err := a.AdmitCreate(ctx, k, obj, opts.DryRun)
		if err != nil {
			release()
			return nil, admitError(err)
		}
		if done != nil {
			defer done()
		}
	}
	if err := s.validateExternal(ctx, k, obj, nil, opts); err != nil {
		release()
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		enc, err := s.encode(k, obj)
		if err != nil {
			release()
			return nil, err
		}
		var rev int64
		forget := func() {}
		if opts.DryRun {
			_, err = s.st.Get(ctx, enc.Key)
			switch {
			case err == nil:
				err = store.ErrExists
			case errors.Is(err, store.ErrNotFound):
				err = nil
				rev = s.st.Revision()
			}
		} else {
			if state, same, ok := s.writtenState(k, obj); ok {
				forget = s.expectWrite(k, enc, state, same)
			}
			rev, err = s.st.Create(ctx, enc)
		}
		if err != nil {
			forget()
		}
		if errors.Is(err, store.ErrExists) && generated && attempt < 8 {
			m.SetName(m.GetGenerateName() + utilrand.String(5))
			continue
		}
		if err != nil {
			release()
			if errors.Is(err, store.ErrExists) {
				return nil, s.alreadyExists(ctx, k, enc.Key)
			}
			return nil, storeError(err, k.GroupResource(), m.GetName())
		}
		enc.Revision = rev
		if opts.DryRun {
			release()
			return s.decode(k, enc)
		}
		defer forget()
		return s.decodeOwned(k, enc)
	}
}

// alreadyExists builds the 409 for a create of an existing key.
func (s *Storage) alreadyExists(ctx context.Context, k *registry.Kind, key store.Key) error {
	err := apierrors.NewAlreadyExists(k.GroupResource(), key.Name)
	if o, gerr := s.st.Get(ctx, key); gerr == nil {
		if cur, derr := s.decode(s.storedKind(k), o); derr == nil {
			if m, merr := meta.Accessor(cur); merr == nil && m.GetDeletionTimestamp() != nil {
				err.ErrStatus.Message = "object is being deleted: " + err.ErrStatus.Message
			}
		}
	}
	return err
}

// admitError keeps API errors from admission and wraps anything else.
func admitError(err error) error {
	var se *apierrors.StatusError
	if errors.As(err, &se) {
		return se
	}
	return apierrors.NewInternalError(fmt.Errorf("admit: %w", err))
}

// Update implements API.
func (s *Storage) Update(ctx context.Context, k *registry.Kind, namespace, name string, obj runtime.Object, opts Options) (runtime.Object, error) {
	k, err := s.served(k)
	if err != nil {
		return nil, err
	}
	m, err := accessor(obj)
	if err != nil {
		return nil, err
	}
	if m.GetName() == "" {
		m.SetName(name)
	}
	if m.GetName() != name {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", m.GetName(), name))
	}
	if err := checkNamespace(k, m, namespace); err != nil {
		return nil, err
	}
	if _, err := parseRV(m.GetResourceVersion()); err != nil {
		return nil, err
	}
	return s.update(ctx, k, namespace, name, opts, record, func(runtime.Object) (runtime.Object, error) {
		return obj.DeepCopyObject(), nil
	})
}

// GuaranteedUpdate implements API.
func (s *Storage) GuaranteedUpdate(ctx context.Context, k *registry.Kind, namespace, name string, opts Options, tryUpdate func(current runtime.Object) (runtime.Object, error)) (runtime.Object, error) {
	k, err := s.served(k)
	if err != nil {
		return nil, err
	}
	return s.update(ctx, k, namespace, name, opts, record, tryUpdate)
}

// updateMode selects what update does beyond storing the result.
type updateMode int

const (
	// record: full update processing, recording an Update managedFields
	// entry.
	record updateMode = iota
	// applied: full update processing; managedFields were set by apply.
	applied
	// raw: store what tryUpdate returns, managedFields untouched
	// (pods/binding, which upstream writes straight to storage, without
	// the pod's update validation and without a field manager).
	raw
	// rawDecoded: raw, and what tryUpdate returns is already the object
	// decoding its encoding gives (it only sets fields of the current
	// object to values that encode and decode unchanged): that object is
	// handed to the watches as the decoded new state, and update returns
	// it shared, for the caller to read only.
	rawDecoded
)

// update is the read-modify-write loop behind every update.
func (s *Storage) update(ctx context.Context, k *registry.Kind, namespace, name string, opts Options, mode updateMode, tryUpdate func(runtime.Object) (runtime.Object, error)) (runtime.Object, error) {
	key := s.key(k, namespace, name)
	for attempt := 0; ; attempt++ {
		o, err := s.st.Get(ctx, key)
		if err != nil {
			return nil, storeError(err, k.GroupResource(), name)
		}
		cur, err := s.decodeStored(k, o)
		if err != nil {
			return nil, err
		}
		obj, err := tryUpdate(cur.DeepCopyObject())
		if err != nil {
			return nil, err
		}
		m, err := accessor(obj)
		if err != nil {
			return nil, err
		}
		pinned := m.GetResourceVersion() != ""
		if pinned && m.GetResourceVersion() != strconv.FormatInt(o.Revision, 10) {
			return nil, conflictError(k.GroupResource(), name)
		}
		out := obj
		if mode != raw && mode != rawDecoded {
			if out, err = s.prepareUpdate(ctx, k, cur, obj, opts, mode == record); err != nil {
				return nil, err
			}
		}
		enc, err := s.encode(k, out)
		if err != nil {
			return nil, err
		}
		// An update that changes nothing, or only the timestamps of
		// managedFields entries, is not written.
		if same, err := s.unchanged(k, out, cur, enc, o); err != nil {
			return nil, err
		} else if same {
			return cur, nil
		}
		if opts.DryRun {
			if shouldDeleteDuringUpdate(out) {
				return out, nil
			}
			enc.Revision = o.Revision
			return s.decode(k, enc)
		}
		if shouldDeleteDuringUpdate(out) {
			gone, err := s.st.Delete(ctx, key, o.Revision)
			if errors.Is(err, store.ErrConflict) && attempt < maxRetries {
				continue
			}
			if err != nil {
				return nil, storeError(err, k.GroupResource(), name)
			}
			s.release(k, cur)
			return s.decode(k, gone)
		}
		forget := func() {}
		if mode == rawDecoded {
			forget = s.expectWrite(k, enc, out, false)
		}
		rev, err := s.st.Update(ctx, enc, o.Revision)
		if errors.Is(err, store.ErrConflict) && attempt < maxRetries {
			forget()
			continue
		}
		if err != nil {
			forget()
			return nil, storeError(err, k.GroupResource(), name)
		}
		enc.Revision = rev
		if mode == rawDecoded {
			out, err := s.decodeShared(k, enc)
			forget()
			return out, err
		}
		return s.decodeOwned(k, enc)
	}
}

// shouldDeleteDuringUpdate reports whether an update removed the last
// finalizer of an object being deleted without grace.
func shouldDeleteDuringUpdate(obj runtime.Object) bool {
	m, err := meta.Accessor(obj)
	if err != nil || m.GetDeletionTimestamp() == nil || len(m.GetFinalizers()) > 0 {
		return false
	}
	if g := m.GetDeletionGracePeriodSeconds(); g != nil && *g != 0 {
		return false
	}
	if ns, ok := obj.(*corev1.Namespace); ok && len(ns.Spec.Finalizers) > 0 {
		return false
	}
	return true
}

// prepareUpdate turns the requested object into the one to store. Every
// update of a stored object, put, patch and apply alike, passes here in
// upstream's order: defaults, the writer's managedFields entry (apply has
// recorded its own), the kind's mutating admission, PrepareForUpdate,
// validation, then Admit and the update admitters. So an object sent back as it was created, without
// what defaulting and admission added then, gets the same additions again
// before it is compared with the stored one.
func (s *Storage) prepareUpdate(ctx context.Context, k *registry.Kind, cur, obj runtime.Object, opts Options, recordFields bool) (runtime.Object, error) {
	m, err := accessor(obj)
	if err != nil {
		return nil, err
	}
	om, _ := meta.Accessor(cur)
	if m.GetName() != om.GetName() {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", m.GetName(), om.GetName()))
	}
	if k.Namespaced && m.GetNamespace() != om.GetNamespace() {
		if m.GetNamespace() != "" {
			return nil, apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
		}
	}
	m.SetNamespace(om.GetNamespace())
	if m.GetUID() == "" {
		m.SetUID(om.GetUID())
	} else if m.GetUID() != om.GetUID() {
		return nil, apierrors.NewConflict(k.GroupResource(), om.GetName(),
			fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", m.GetUID(), om.GetUID()))
	}
	if m.GetResourceVersion() == "" {
		m.SetResourceVersion(om.GetResourceVersion())
	}
	m.SetCreationTimestamp(om.GetCreationTimestamp())
	m.SetDeletionTimestamp(om.GetDeletionTimestamp())
	m.SetDeletionGracePeriodSeconds(om.GetDeletionGracePeriodSeconds())
	m.SetGeneration(om.GetGeneration())
	m.SetSelfLink("")

	switch opts.Subresource {
	case "":
		if k.HasStatus {
			if obj, err = s.copyTop(k, obj, cur, func(key string) bool { return key != "status" }, func(dst, src map[string]any) {
				setOrDelete(dst, "status", src)
			}); err != nil {
				return nil, err
			}
		}
	case "status":
		if !k.HasStatus {
			return nil, apierrors.NewNotFound(k.GroupResource(), om.GetName())
		}
		if u, ok := isUnstructured(obj); ok {
			// A custom resource's /status write changes status alone:
			// all of metadata but the writer's managedFields stays as
			// stored, as upstream.
			keepStatusOnly(u, cur)
		} else if obj, err = s.copyTop(k, obj, cur, func(key string) bool { return key == "status" || key == "metadata" }, func(dst, src map[string]any) {
			for key := range dst {
				if key != "status" && key != "metadata" {
					delete(dst, key)
				}
			}
			for key, v := range src {
				if key != "status" && key != "metadata" {
					dst[key] = v
				}
			}
		}); err != nil {
			return nil, err
		}
		if k.PrepareForStatusUpdate != nil {
			k.PrepareForStatusUpdate(obj, cur)
		}
	case "finalize":
		if k.GVK != namespaceGVK {
			return nil, apierrors.NewNotFound(k.GroupResource(), om.GetName())
		}
		ns := obj.(*corev1.Namespace)
		fin := ns.Spec.Finalizers
		obj = cur.DeepCopyObject()
		obj.(*corev1.Namespace).Spec.Finalizers = fin
	default:
		// A subresource of the kind's own (pods/ephemeralcontainers)
		// keeps what it does not own before anything else, so that
		// defaults and the managedFields entry see only its changes.
		sr := k.Subresources[opts.Subresource]
		if sr == nil {
			return nil, apierrors.NewNotFound(k.GroupResource(), om.GetName())
		}
		sr.PrepareForUpdate(obj, cur)
	}
	if k.Default != nil {
		k.Default(obj)
	}
	// As on create, the writer's managedFields entry covers what it sent
	// and its defaults; admission's changes are nobody's.
	if recordFields {
		if obj, err = s.recordUpdate(k, opts.Subresource, cur, obj, opts.FieldManager); err != nil {
			return nil, err
		}
	}
	m, _ = meta.Accessor(obj)
	if opts.Subresource == "" && k.Mutate != nil {
		if err := k.Mutate(ctx, s.Lister(), obj, cur); err != nil {
			return nil, admitError(err)
		}
	}
	if err := s.mutateExternal(ctx, k, obj, cur, opts); err != nil {
		return nil, err
	}
	if opts.Subresource == "" && k.PrepareForUpdate != nil {
		k.PrepareForUpdate(obj, cur)
	}
	if hasGeneration(k) && (opts.Subresource == "" || k.Subresources[opts.Subresource] != nil) {
		var changed bool
		if k.GenerationChanged != nil {
			changed = k.GenerationChanged(obj, cur)
		} else {
			changed = specChanged(k, obj, cur)
		}
		if changed {
			m.SetGeneration(om.GetGeneration() + 1)
		}
	}
	path := field.NewPath("metadata")
	errs := metavalidation.ValidateObjectMetaAccessor(m, k.Namespaced, nameRule(k), path)
	errs = append(errs, metavalidation.ValidateObjectMetaAccessorUpdate(m, om, path)...)
	switch opts.Subresource {
	case "status":
		if k.ValidateStatusUpdate != nil {
			errs = append(errs, k.ValidateStatusUpdate(obj, cur)...)
		}
	default:
		if sr := k.Subresources[opts.Subresource]; sr != nil {
			errs = append(errs, sr.ValidateUpdate(obj, cur)...)
		} else if k.ValidateUpdate != nil {
			errs = append(errs, k.ValidateUpdate(obj, cur)...)
		} else if k.Validate != nil {
			errs = append(errs, k.Validate(obj)...)
		}
	}
	if err := invalid(k, m.GetName(), errs); err != nil {
		return nil, err
	}
	if k.Admit != nil {
		if err := k.Admit(ctx, s.admitLister(opts.DryRun), obj, cur); err != nil {
			return nil, admitError(err)
		}
	}
	if err := s.admitUpdate(ctx, k, obj, cur, opts); err != nil {
		return nil, err
	}
	if err := s.validateExternal(ctx, k, obj, cur, opts); err != nil {
		return nil, err
	}
	return obj, nil
}

// unchanged reports whether out, about to be stored as enc over the stored
// o (decoded as cur), is the stored object again, ignoring timestamps of
// managedFields entries.
//
// Stored values are written by encoding/json from the typed object, so
// encoding the decoded cur would give o.Value back byte for byte: the
// comparison uses o.Value and encodes nothing more unless managedFields
// differ only in their timestamps. A kind stored as another kind is
// converted on the way, so its comparison encodes cur as before.
func (s *Storage) unchanged(k *registry.Kind, out, cur runtime.Object, enc store.Object, o store.Object) (bool, error) {
	cmpNew := enc
	if onlyManagedFieldsTimes(out, cur) {
		same := out.DeepCopyObject()
		keepManagedFieldsTimes(same, cur)
		var err error
		if cmpNew, err = s.encode(k, same); err != nil {
			return false, err
		}
	}
	if s.storedKind(k) == k {
		return bytes.Equal(cmpNew.Value, o.Value), nil
	}
	cmpOld, err := s.encode(k, cur)
	if err != nil {
		return false, err
	}
	return bytes.Equal(cmpNew.Value, cmpOld.Value) && reflect.DeepEqual(cmpNew.Fields, cmpOld.Fields), nil
}

// onlyManagedFieldsTimes reports whether obj's managedFields entries differ
// from cur's, and differ only in their timestamps.
func onlyManagedFieldsTimes(obj, cur runtime.Object) bool {
	m, err1 := meta.Accessor(obj)
	om, err2 := meta.Accessor(cur)
	if err1 != nil || err2 != nil {
		return false
	}
	nf, of := m.GetManagedFields(), om.GetManagedFields()
	if len(nf) != len(of) {
		return false
	}
	differ := false
	for i := range nf {
		a, b := nf[i], of[i]
		if !differ && !apiequality.Semantic.DeepEqual(a.Time, b.Time) {
			differ = true
		}
		a.Time, b.Time = nil, nil
		if !apiequality.Semantic.DeepEqual(a, b) {
			return false
		}
	}
	return differ
}

// keepManagedFieldsTimes gives managedFields entries that only changed
// their timestamp the stored timestamp back, so that such an update is a
// no-op.
func keepManagedFieldsTimes(obj, cur runtime.Object) {
	m, err1 := meta.Accessor(obj)
	om, err2 := meta.Accessor(cur)
	if err1 != nil || err2 != nil {
		return
	}
	nf, of := m.GetManagedFields(), om.GetManagedFields()
	if len(nf) != len(of) {
		return
	}
	for i := range nf {
		a, b := nf[i], of[i]
		a.Time, b.Time = nil, nil
		if !apiequality.Semantic.DeepEqual(a, b) {
			return
		}
	}
	m.SetManagedFields(of)
}
