package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/client-go/applyconfigurations"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// Config configures a Storage.
type Config struct {
	// Store keeps the objects; required.
	Store store.Store
	// Kinds are the kinds served; nil means registry.All(). Ignored when
	// Registry is set.
	Kinds []*registry.Kind
	// Registry, when set, is the hub's registry: the kinds served are its
	// current ones, custom kinds included, and follow its changes.
	Registry *registry.Registry
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
	// BookmarkInterval is how often an idle watch that allows bookmarks
	// gets one; zero means 45 seconds.
	BookmarkInterval time.Duration
	// FutureWait is how long a read at a resourceVersion the store has
	// not reached waits for it before failing; zero means 3 seconds.
	FutureWait time.Duration
	// Admission runs on every create, after the kind's own admission,
	// in order: quota and limit ranges, for example; those that are
	// UpdateAdmitters run on updates too.
	Admission []Admitter
	// External is admission configured through the API (webhooks,
	// ValidatingAdmissionPolicies); nil means none. SetExternalAdmission
	// sets it later.
	External ExternalAdmission
	// ListCacheBytes bounds the protobuf encodings of list items kept
	// for the next protobuf list (see ListProtobuf); zero means 64 MiB,
	// negative keeps none.
	ListCacheBytes int
}

// Admitter is admission that applies across kinds.
type Admitter interface {
	// AdmitCreate checks and may change obj, about to be created in its
	// namespace. The returned done, when not nil, is called once the
	// write is over, whether it was stored or not; an Admitter may hold a
	// lock until then so that the decisions of concurrent writes see each
	// other's results.
	AdmitCreate(ctx context.Context, k *registry.Kind, obj runtime.Object, dryRun bool) (done func(), err error)
}

// UpdateAdmitter is an Admitter that also checks updates of an object's
// main resource (not of its subresources).
type UpdateAdmitter interface {
	// AdmitUpdate checks obj, about to replace old.
	AdmitUpdate(ctx context.Context, k *registry.Kind, obj, old runtime.Object, dryRun bool) error
}

// SubresourceAdmitter is an Admitter that also checks writes of the
// subresources that update an object: status, finalize and a kind's
// Subresources (such as certificatesigningrequests/approval).
type SubresourceAdmitter interface {
	// AdmitSubresourceUpdate checks obj, about to replace old through
	// subresource.
	AdmitSubresourceUpdate(ctx context.Context, k *registry.Kind, subresource string, obj, old runtime.Object, dryRun bool) error
}

// Storage implements API and registry.Lister on a store.Store.
type Storage struct {
	st     store.Store
	reg    *registry.Registry // nil: the kinds of Config.Kinds, fixed
	kv     atomic.Pointer[kindView]
	kvMu   sync.Mutex // serialises rebuilding kv
	log    *slog.Logger
	scheme *runtime.Scheme
	bmk    time.Duration
	wait   time.Duration

	admission []Admitter
	external  externalAdmission

	shared    decodeCache
	rdefaults readDefaults
	protos    protoItems

	nsMu sync.Mutex
	// guards the following field
	nsCache map[string]nsState // namespace name → state at a revision

	tcOnce sync.Once
	tc     managedfields.TypeConverter
	uc     *updateConverter
	sets   setCache
	mu     sync.Mutex
	fms    map[fmKey]*managedfields.FieldManager
}

var (
	_ API             = (*Storage)(nil)
	_ registry.Lister = lister{}
)

// New returns a Storage over cfg.Store.
func New(cfg Config) (*Storage, error) {
	if cfg.Store == nil {
		return nil, errors.New("create storage: no store configured")
	}
	sch, err := registry.NewScheme()
	if err != nil {
		return nil, fmt.Errorf("create storage: %w", err)
	}
	s := &Storage{
		st:        cfg.Store,
		reg:       cfg.Registry,
		log:       cfg.Logger,
		scheme:    sch,
		bmk:       cfg.BookmarkInterval,
		admission: cfg.Admission,
		wait:      cfg.FutureWait,
		fms:       map[fmKey]*managedfields.FieldManager{},
		nsCache:   map[string]nsState{},
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.SetExternalAdmission(cfg.External)
	if s.bmk <= 0 {
		s.bmk = 45 * time.Second
	}
	if s.wait <= 0 {
		s.wait = 3 * time.Second
	}
	switch s.protos.budget = cfg.ListCacheBytes; {
	case s.protos.budget == 0:
		s.protos.budget = 64 << 20
	case s.protos.budget < 0:
		s.protos.budget = 0
	}
	kinds, gen := cfg.Kinds, uint64(0)
	if s.reg != nil {
		gen = s.reg.Generation()
		kinds = s.reg.Kinds()
	} else if kinds == nil {
		kinds = registry.All()
	}
	v, problems := buildView(s.scheme, kinds, gen)
	if len(problems) > 0 {
		return nil, fmt.Errorf("create storage: %w", problems[0])
	}
	s.kv.Store(v)
	return s, nil
}

// served returns this storage's kind for k. Callers may hold a kind that
// only describes what is served (registry.Lookup); writes must run the
// admission hooks of the kinds the storage serves, whose Service and Node
// kinds hold the hub's allocations. A custom kind (one with New) that is
// no longer served is NotFound, as upstream answers for the resources of
// a deleted CustomResourceDefinition.
func (s *Storage) served(k *registry.Kind) (*registry.Kind, error) {
	if o := s.view().byGVK[k.GVK]; o != nil {
		return o, nil
	}
	if k.New != nil {
		return nil, apierrors.NewGenericServerResponse(http.StatusNotFound, "", schema.GroupResource{}, "", "", 0, false)
	}
	return k, nil
}

// storedKind returns the kind whose objects the store holds for k. A
// view whose stored kind left the registry meanwhile (a custom resource's
// versions share their group and resource, so the store key is the same)
// stands for itself.
func (s *Storage) storedKind(k *registry.Kind) *registry.Kind {
	if k.StoredAs.Empty() {
		return k
	}
	if sk := s.view().byGVK[k.StoredAs]; sk != nil {
		return sk
	}
	return k
}

// resource returns the store resource for k.
func (s *Storage) resource(k *registry.Kind) string {
	return s.storedKind(k).QualifiedResource()
}

func (s *Storage) key(k *registry.Kind, namespace, name string) store.Key {
	if !k.Namespaced {
		namespace = ""
	}
	return store.Key{Resource: s.resource(k), Namespace: namespace, Name: name}
}

// newObjectOf returns an empty object of kind k with its type set: from
// the kind's New (custom resources: unstructured) or else the scheme.
func (s *Storage) newObjectOf(k *registry.Kind) (runtime.Object, error) {
	if k.New == nil {
		return s.newObject(k.GVK)
	}
	obj := k.New()
	obj.GetObjectKind().SetGroupVersionKind(k.GVK)
	return obj, nil
}

// newObject returns an empty typed object of the kind with its type set.
func (s *Storage) newObject(gvk schema.GroupVersionKind) (runtime.Object, error) {
	obj, err := s.scheme.New(gvk)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("create %s: %w", gvk.Kind, err))
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	return obj, nil
}

// decode turns a stored object into a typed object of kind k (converting
// from the stored kind when k is a view), with resourceVersion set.
func (s *Storage) decode(k *registry.Kind, o store.Object) (runtime.Object, error) {
	obj, _, err := s.decodeReporting(k, o)
	return obj, err
}

// decodeReporting is decode, and reports whether the kind's DefaultOnRead
// left the object as stored (see readDefaults); false for a kind without
// one, or a view.
func (s *Storage) decodeReporting(k *registry.Kind, o store.Object) (runtime.Object, bool, error) {
	sk := s.storedKind(k)
	obj, err := s.newObjectOf(sk)
	if err != nil {
		return nil, false, err
	}
	if err := json.Unmarshal(o.Value, obj); err != nil {
		return nil, false, apierrors.NewInternalError(fmt.Errorf("decode %s: %w", o.Key, err))
	}
	obj.GetObjectKind().SetGroupVersionKind(sk.GVK)
	if sk != k {
		if obj, err = k.FromStorage(obj); err != nil {
			return nil, false, apierrors.NewInternalError(fmt.Errorf("convert %s: %w", o.Key, err))
		}
		obj.GetObjectKind().SetGroupVersionKind(k.GVK)
	}
	same := false
	if k.DefaultOnRead != nil {
		same = defaultOnRead(k, sk, obj)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, false, apierrors.NewInternalError(err)
	}
	m.SetResourceVersion(strconv.FormatInt(o.Revision, 10))
	return obj, same, nil
}

// encode turns a typed object of kind k into a store object (converting to
// the stored kind when k is a view), without resourceVersion.
func (s *Storage) encode(k *registry.Kind, obj runtime.Object) (store.Object, error) {
	sk := s.storedKind(k)
	if sk != k {
		var err error
		if obj, err = k.ToStorage(obj.DeepCopyObject()); err != nil {
			return store.Object{}, apierrors.NewInternalError(fmt.Errorf("convert %s: %w", k.GVK.Kind, err))
		}
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return store.Object{}, apierrors.NewInternalError(err)
	}
	// The stored form has the stored kind's type and no resourceVersion;
	// obj gets its own back once encoded (writes own the objects they
	// encode, so nothing else reads it meanwhile).
	gvk, rv := obj.GetObjectKind().GroupVersionKind(), m.GetResourceVersion()
	obj.GetObjectKind().SetGroupVersionKind(sk.GVK)
	m.SetResourceVersion("")
	b, err := marshal(obj)
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	m.SetResourceVersion(rv)
	if err != nil {
		return store.Object{}, apierrors.NewInternalError(fmt.Errorf("encode %s: %w", k.GVK.Kind, err))
	}
	f := fields.Set{"metadata.name": m.GetName()}
	if sk.Namespaced {
		f["metadata.namespace"] = m.GetNamespace()
	}
	if sk.Fields != nil {
		for key, v := range sk.Fields(obj) {
			f[key] = v
		}
	}
	return store.Object{
		Key:    store.Key{Resource: sk.QualifiedResource(), Namespace: m.GetNamespace(), Name: m.GetName()},
		Value:  b,
		Labels: m.GetLabels(),
		Fields: f,
	}, nil
}

// withType sets apiVersion and kind on an object. An object that has them
// already is only read.
func withType(k *registry.Kind, obj runtime.Object) runtime.Object {
	if obj.GetObjectKind().GroupVersionKind() != k.GVK {
		obj.GetObjectKind().SetGroupVersionKind(k.GVK)
	}
	return obj
}

// fieldSelector checks and translates a field selector for kind k.
func (s *Storage) fieldSelector(k *registry.Kind, sel fields.Selector) (fields.Selector, error) {
	if sel == nil || sel.Empty() {
		return nil, nil
	}
	convert := runtime.DefaultMetaV1FieldSelectorConversion
	if len(k.FieldLabels) > 0 || len(k.FieldAliases) > 0 {
		// A kind with fields of its own names the label it refuses, as
		// upstream's conversion functions for those kinds do.
		allowed := map[string]bool{"metadata.name": true}
		if k.Namespaced {
			allowed["metadata.namespace"] = true
		}
		for _, f := range k.FieldLabels {
			allowed[f] = true
		}
		convert = func(field, value string) (string, string, error) {
			if a, ok := k.FieldAliases[field]; ok {
				field = a
			}
			if !allowed[field] {
				return "", "", fmt.Errorf("field label not supported: %s", field)
			}
			return field, value, nil
		}
	}
	out, err := sel.Transform(convert)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	return out, nil
}

// newList returns an empty typed list for the kind.
func (s *Storage) newList(k *registry.Kind) (runtime.Object, error) {
	lgvk := k.GVK.GroupVersion().WithKind(k.GVK.Kind + "List")
	if k.New != nil {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(lgvk)
		return l, nil
	}
	return s.newObject(lgvk)
}

// Revision returns the store's current revision: the resourceVersion a
// list made now would carry.
func (s *Storage) Revision() int64 { return s.st.Revision() }

// CompactedRevision returns the newest revision the change log no longer
// holds: a watch from below it ends with 410 Expired.
func (s *Storage) CompactedRevision() int64 { return s.st.CompactedRevision() }

// Get implements API.
func (s *Storage) Get(ctx context.Context, k *registry.Kind, namespace, name string) (runtime.Object, error) {
	k, err := s.served(k)
	if err != nil {
		return nil, err
	}
	o, err := s.st.Get(ctx, s.key(k, namespace, name))
	if err != nil {
		return nil, storeError(err, k.GroupResource(), name)
	}
	return s.decode(k, o)
}

// parseRV parses a resourceVersion parameter.
func parseRV(rv string) (int64, error) {
	if rv == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil || n < 0 {
		return 0, apierrors.NewBadRequest(fmt.Sprintf("invalid resource version: %q", rv))
	}
	return n, nil
}

// waitFor waits until the store reaches revision rv, or fails with 504.
func (s *Storage) waitFor(ctx context.Context, rv int64) error {
	if rv <= s.st.Revision() {
		return nil
	}
	deadline := time.NewTimer(s.wait)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return apierrors.NewTimeoutError(ctx.Err().Error(), 1)
		case <-deadline.C:
			return tooLargeRV(rv, s.st.Revision())
		case <-tick.C:
			if rv <= s.st.Revision() {
				return nil
			}
		}
	}
}

// List implements API.
func (s *Storage) List(ctx context.Context, k *registry.Kind, namespace string, opts ListOptions) (runtime.Object, error) {
	k, err := s.served(k)
	if err != nil {
		return nil, err
	}
	res, err := s.list(ctx, k, namespace, opts, false)
	if err != nil {
		return nil, err
	}
	items := make([]runtime.Object, 0, len(res.Objects))
	for _, o := range res.Objects {
		obj, err := s.decode(k, o)
		if err != nil {
			return nil, err
		}
		items = append(items, obj)
	}
	return s.makeList(k, items, res.Revision, res.Continue, res.Remaining)
}

// list checks opts and reads the stored objects a List answers with.
// list reads one page from the store; readOnly is passed on to the store
// (see store.ListOptions.ReadOnly).
func (s *Storage) list(ctx context.Context, k *registry.Kind, namespace string, opts ListOptions, readOnly bool) (store.ListResult, error) {
	fsel, err := s.fieldSelector(k, opts.Field)
	if err != nil {
		return store.ListResult{}, err
	}
	rv, err := parseRV(opts.ResourceVersion)
	if err != nil {
		return store.ListResult{}, err
	}
	if opts.Continue != "" && opts.ResourceVersion != "" && opts.ResourceVersion != "0" {
		return store.ListResult{}, apierrors.NewBadRequest("specifying resource version is not allowed when using continue")
	}
	exact := opts.ResourceVersionMatch == metav1.ResourceVersionMatchExact ||
		(opts.Limit > 0 && opts.Continue == "" && rv > 0 && opts.ResourceVersionMatch == "")
	switch opts.ResourceVersionMatch {
	case "", metav1.ResourceVersionMatchExact, metav1.ResourceVersionMatchNotOlderThan:
	default:
		return store.ListResult{}, apierrors.NewBadRequest(fmt.Sprintf("unsupported resourceVersionMatch %q", opts.ResourceVersionMatch))
	}
	if opts.ResourceVersionMatch != "" && opts.ResourceVersion == "" {
		return store.ListResult{}, apierrors.NewBadRequest("resourceVersionMatch is forbidden unless resourceVersion is provided")
	}
	if rv > 0 {
		if exact && rv <= s.st.CompactedRevision() {
			return store.ListResult{}, expired(rv, s.st.CompactedRevision())
		}
		if err := s.waitFor(ctx, rv); err != nil {
			return store.ListResult{}, err
		}
		if exact && rv != s.st.Revision() {
			// The store serves current state only; an exact read of an
			// older revision cannot be answered consistently.
			return store.ListResult{}, expired(rv, s.st.Revision())
		}
	}
	if !k.Namespaced {
		namespace = ""
	}
	res, err := s.st.List(ctx, store.ListOptions{
		Resource: s.resource(k), Namespace: namespace,
		Label: opts.Label, Field: fsel, Limit: opts.Limit, Continue: opts.Continue,
		ReadOnly: readOnly,
	})
	if err != nil {
		if errors.Is(err, store.ErrCompacted) {
			return store.ListResult{}, apierrors.NewResourceExpired(continueExpiredMessage)
		}
		if opts.Continue != "" && !errors.Is(err, store.ErrClosed) {
			return store.ListResult{}, apierrors.NewBadRequest(fmt.Sprintf("invalid continue token: %v", err))
		}
		return store.ListResult{}, storeError(err, k.GroupResource(), "")
	}
	return res, nil
}

// makeList builds a typed list holding items.
func (s *Storage) makeList(k *registry.Kind, items []runtime.Object, rev int64, cont string, remaining int64) (runtime.Object, error) {
	list, err := s.newList(k)
	if err != nil {
		return nil, err
	}
	if k.New == nil {
		// Typed list items carry no type; unstructured ones keep theirs,
		// as upstream's custom resource lists do.
		for _, it := range items {
			it.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
		}
	}
	if err := setItems(list, items); err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	lm.SetResourceVersion(strconv.FormatInt(rev, 10))
	lm.SetContinue(cont)
	if cont != "" && remaining > 0 {
		r := remaining
		lm.SetRemainingItemCount(&r)
	}
	list.GetObjectKind().SetGroupVersionKind(k.GVK.GroupVersion().WithKind(k.GVK.Kind + "List"))
	return list, nil
}

// setItems fills the Items slice of a typed list, never leaving it nil.
func setItems(list runtime.Object, items []runtime.Object) error {
	v := reflect.ValueOf(list).Elem().FieldByName("Items")
	if !v.IsValid() || v.Kind() != reflect.Slice {
		return fmt.Errorf("set items: %T has no Items slice", list)
	}
	sl := reflect.MakeSlice(v.Type(), 0, len(items))
	for _, it := range items {
		iv := reflect.ValueOf(it)
		if v.Type().Elem().Kind() != reflect.Pointer {
			iv = iv.Elem()
		}
		if !iv.Type().AssignableTo(v.Type().Elem()) {
			return fmt.Errorf("set items: %T does not fit %s", it, v.Type())
		}
		sl = reflect.Append(sl, iv)
	}
	v.Set(sl)
	return nil
}

// Lister returns a registry.Lister reading this Storage (the method set of
// API already has a List with another signature).
func (s *Storage) Lister() registry.Lister { return lister{s} }

type lister struct{ s *Storage }

// List implements registry.Lister.
func (l lister) List(ctx context.Context, resource, namespace string) ([]runtime.Object, error) {
	return l.s.listRaw(ctx, resource, namespace)
}

func (s *Storage) listRaw(ctx context.Context, resource, namespace string) ([]runtime.Object, error) {
	k := s.view().byRes[resource]
	if k == nil {
		return nil, fmt.Errorf("list %s: resource not served", resource)
	}
	res, err := s.st.List(ctx, store.ListOptions{Resource: resource, Namespace: namespace})
	if err != nil {
		return nil, storeError(err, k.GroupResource(), "")
	}
	out := make([]runtime.Object, 0, len(res.Objects))
	for _, o := range res.Objects {
		obj, err := s.decode(k, o)
		if err != nil {
			return nil, err
		}
		out = append(out, obj)
	}
	return out, nil
}

// typeConverter returns the type converter of kind k: its own
// (custom resources), else the built-in kinds' one, built lazily.
func (s *Storage) typeConverter(k *registry.Kind) managedfields.TypeConverter {
	if k.TypeConverter != nil {
		return k.TypeConverter
	}
	s.tcOnce.Do(s.buildTypeConverters)
	return s.tc
}

// updateConverter returns the type converter of the field managers that
// record Update entries of kind k.
func (s *Storage) updateConverter(k *registry.Kind) managedfields.TypeConverter {
	if k.TypeConverter != nil {
		return k.TypeConverter
	}
	s.tcOnce.Do(s.buildTypeConverters)
	return s.uc
}

func (s *Storage) buildTypeConverters() {
	s.tc = applyconfigurations.NewTypeConverter(s.scheme)
	s.uc = newUpdateConverter(s.tc, s.scheme)
}

// admitUpdate runs the UpdateAdmitters on an update of a main resource,
// the SubresourceAdmitters on a write through a subresource.
func (s *Storage) admitUpdate(ctx context.Context, k *registry.Kind, obj, cur runtime.Object, opts Options) error {
	if opts.Subresource != "" {
		for _, a := range s.admission {
			if sa, ok := a.(SubresourceAdmitter); ok {
				if err := sa.AdmitSubresourceUpdate(ctx, k, opts.Subresource, obj, cur, opts.DryRun); err != nil {
					return admitError(err)
				}
			}
		}
		return nil
	}
	for _, a := range s.admission {
		if ua, ok := a.(UpdateAdmitter); ok {
			if err := ua.AdmitUpdate(ctx, k, obj, cur, opts.DryRun); err != nil {
				return admitError(err)
			}
		}
	}
	return nil
}
