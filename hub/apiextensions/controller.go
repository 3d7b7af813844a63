package apiextensions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/workqueue"

	"github.com/tether-edge/tether/hub/apiextensions/customresource"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// fieldManager is the manager of the controller's writes, as upstream's
// in-process controllers write as the API server.
const fieldManager = "kube-apiserver"

// Config is what the controller works with.
type Config struct {
	// Storage holds the definitions and the custom objects.
	Storage storage.API
	// Registry receives the kinds of each definition (SetCustom) and
	// serves the CustomResourceDefinition kind.
	Registry *registry.Registry
	Logger   *slog.Logger
	// Kinds builds the kinds of a definition; nil means
	// customresource.Kinds.
	Kinds func(*apiextensionsv1.CustomResourceDefinition) ([]*registry.Kind, error)
}

// Controller turns stored CustomResourceDefinitions into served kinds,
// as kube-apiserver's naming, establishing and finalizer controllers do.
type Controller struct {
	cfg  Config
	kind *registry.Kind
	q    workqueue.TypedRateLimitingInterface[string]

	mu sync.Mutex
	// crds is the controller's view of the stored definitions, each the
	// newer of what the watch and the controller's own writes saw.
	crds map[string]*apiextensionsv1.CustomResourceDefinition
	// served is what each definition's registered kinds were built from,
	// kinds what they are.
	served map[string]servedAs
	kinds  map[string][]*registry.Kind
	// cleaning holds the definitions whose objects are being deleted.
	cleaning map[string]bool

	synced chan struct{}
}

// servedAs is what a definition's kinds depend on: a change of either
// builds them again.
type servedAs struct {
	generation int64
	names      apiextensionsv1.CustomResourceDefinitionNames
	terminate  bool
}

// New returns a controller; Run starts it.
func New(cfg Config) *Controller {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Kinds == nil {
		cfg.Kinds = customresource.Kinds
	}
	return &Controller{
		cfg: cfg,
		q: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 5*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "customresourcedefinitions"}),
		crds:     map[string]*apiextensionsv1.CustomResourceDefinition{},
		served:   map[string]servedAs{},
		kinds:    map[string][]*registry.Kind{},
		cleaning: map[string]bool{},
		synced:   make(chan struct{}),
	}
}

// WaitSynced waits until every definition stored when Run started has
// been handled once (its kinds served, if its names are accepted), or ctx
// ends; it reports which.
func (c *Controller) WaitSynced(ctx context.Context) bool {
	select {
	case <-c.synced:
		return true
	case <-ctx.Done():
		return false
	}
}

// Run keeps the registry in step with the stored definitions until ctx
// ends.
func (c *Controller) Run(ctx context.Context) {
	c.kind = c.cfg.Registry.Lookup(gvrCRD)
	if c.kind == nil {
		c.cfg.Logger.Error("apiextensions: CustomResourceDefinitions are not served")
		return
	}
	defer c.q.ShutDown()
	go func() {
		<-ctx.Done()
		c.q.ShutDown()
	}()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.follow(ctx) }()
	go func() { defer wg.Done(); c.work(ctx) }()
	wg.Wait()
}

// follow keeps the view equal to the stored definitions until ctx ends
// (see storage.Follow), queueing each one that changes. The definitions
// stored before the hub started are served before it takes requests:
// they are handled once the first list is in the view.
func (c *Controller) follow(ctx context.Context) {
	synced := func() {
		for _, name := range c.names() {
			c.handle(ctx, name)
		}
		close(c.synced)
	}
	storage.Follow(ctx, c.cfg.Storage, c.kind, "", storage.FollowOptions{Logger: c.cfg.Logger, Synced: synced},
		storage.FollowFuncs{ReplaceFunc: c.replace, ApplyFunc: c.apply})
}

// replace makes a list of definitions the view, queueing each listed one
// and each one the list lacks (deleted while the watch was down).
func (c *Controller) replace(obj runtime.Object) error {
	list, ok := obj.(*apiextensionsv1.CustomResourceDefinitionList)
	if !ok {
		return fmt.Errorf("list %s: unexpected %T", Resource, obj)
	}
	seen := map[string]bool{}
	for i := range list.Items {
		crd := &list.Items[i]
		seen[crd.Name] = true
		c.observe(crd)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.crds {
		if !seen[name] {
			delete(c.crds, name)
			c.q.Add(name)
		}
	}
	return nil
}

// apply records a change of a stored definition and queues it.
func (c *Controller) apply(ev watch.EventType, obj runtime.Object) {
	crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
	if !ok {
		return
	}
	if ev != watch.Deleted {
		c.observe(crd)
		return
	}
	c.mu.Lock()
	delete(c.crds, crd.Name)
	c.mu.Unlock()
	c.q.Add(crd.Name)
}

// names returns the names of the definitions in the view, sorted.
func (c *Controller) names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.crds))
}

// observe records a definition read from storage, unless the view holds
// a newer one (written by the controller itself), and queues it.
func (c *Controller) observe(crd *apiextensionsv1.CustomResourceDefinition) {
	c.mu.Lock()
	if cur, ok := c.crds[crd.Name]; !ok || cur.UID != crd.UID || !newer(cur, crd) {
		c.crds[crd.Name] = crd
	}
	c.mu.Unlock()
	c.q.Add(crd.Name)
}

// newer reports whether a was stored after b.
func newer(a, b *apiextensionsv1.CustomResourceDefinition) bool {
	var ra, rb int64
	_, _ = fmt.Sscan(a.ResourceVersion, &ra)
	_, _ = fmt.Sscan(b.ResourceVersion, &rb)
	return ra > rb
}

func (c *Controller) work(ctx context.Context) {
	for {
		name, quit := c.q.Get()
		if quit {
			return
		}
		if err := c.handle(ctx, name); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("apiextensions: sync failed; retrying", "crd", name, "err", err)
			c.q.AddRateLimited(name)
		} else {
			c.q.Forget(name)
		}
		c.q.Done(name)
	}
}

// get returns the view's copy of a definition, nil if it is gone.
func (c *Controller) get(name string) *apiextensionsv1.CustomResourceDefinition {
	c.mu.Lock()
	defer c.mu.Unlock()
	if crd := c.crds[name]; crd != nil {
		return crd.DeepCopy()
	}
	return nil
}

// handle brings one definition's served kinds and status in line with
// what is stored.
func (c *Controller) handle(ctx context.Context, name string) error {
	crd := c.get(name)
	if crd == nil {
		c.unserve(name)
		return nil
	}
	if crd.DeletionTimestamp != nil {
		return c.terminate(ctx, crd)
	}
	names, accepted, established := c.namesAndConditions(crd)
	upd := crd.DeepCopy()
	upd.Status.AcceptedNames = names
	apihelpers.SetCRDCondition(upd, accepted)
	apihelpers.SetCRDCondition(upd, established)
	if accepted.Status == apiextensionsv1.ConditionTrue || apihelpers.IsCRDConditionTrue(crd, apiextensionsv1.Established) {
		// Served under the accepted names (the old ones while new ones
		// conflict), before Established says so.
		if err := c.serve(upd, false); err != nil {
			return err
		}
		apihelpers.SetCRDCondition(upd, apiextensionsv1.CustomResourceDefinitionCondition{
			Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue,
			Reason: "InitialNamesAccepted", Message: "the initial names have been accepted",
		})
	}
	return c.writeStatus(ctx, crd, upd)
}

// serve registers a definition's kinds under its accepted names, unless
// they are registered from the same generation and names already.
func (c *Controller) serve(crd *apiextensionsv1.CustomResourceDefinition, terminating bool) error {
	as := servedAs{generation: crd.Generation, names: crd.Status.AcceptedNames, terminate: terminating}
	c.mu.Lock()
	cur, ok := c.served[crd.Name]
	c.mu.Unlock()
	if ok && reflect.DeepEqual(cur, as) {
		return nil
	}
	built := crd.DeepCopy()
	built.Spec.Names = crd.Status.AcceptedNames
	kinds, err := c.cfg.Kinds(built)
	if err != nil {
		return fmt.Errorf("build kinds of %s: %w", crd.Name, err)
	}
	if terminating {
		kinds = refuseCreates(kinds)
	}
	c.cfg.Registry.SetCustom(crd.Name, kinds)
	c.mu.Lock()
	c.served[crd.Name] = as
	c.kinds[crd.Name] = kinds
	c.mu.Unlock()
	c.cfg.Logger.Debug("apiextensions: serving", "crd", crd.Name, "kinds", len(kinds), "terminating", terminating)
	return nil
}

func (c *Controller) unserve(name string) {
	c.mu.Lock()
	_, ok := c.served[name]
	delete(c.served, name)
	delete(c.kinds, name)
	c.mu.Unlock()
	if ok {
		c.cfg.Registry.SetCustom(name, nil)
		c.cfg.Logger.Debug("apiextensions: no longer serving", "crd", name)
	}
}

// kindsOf returns the kinds registered for a definition.
func (c *Controller) kindsOf(name string) []*registry.Kind {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kinds[name]
}

// writeStatus stores upd's status when it differs from crd's, the stored
// one, and keeps what was stored in the view.
func (c *Controller) writeStatus(ctx context.Context, crd, upd *apiextensionsv1.CustomResourceDefinition) error {
	if equalStatus(&crd.Status, &upd.Status) {
		return nil
	}
	obj, err := c.cfg.Storage.Update(ctx, c.kind, "", crd.Name, upd, storage.Options{Subresource: "status", FieldManager: fieldManager})
	if err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil // the watch brings the newer object, queued again
		}
		return fmt.Errorf("update status of %s: %w", crd.Name, err)
	}
	if stored, ok := obj.(*apiextensionsv1.CustomResourceDefinition); ok {
		c.observeWritten(stored)
	}
	return nil
}

// observeWritten records an object the controller stored, without
// queueing it again.
func (c *Controller) observeWritten(crd *apiextensionsv1.CustomResourceDefinition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.crds[crd.Name]; ok && cur.UID == crd.UID && newer(cur, crd) {
		return
	}
	c.crds[crd.Name] = crd
}

// equalStatus compares statuses ignoring the conditions' transition times.
func equalStatus(a, b *apiextensionsv1.CustomResourceDefinitionStatus) bool {
	x, y := a.DeepCopy(), b.DeepCopy()
	for _, s := range []*apiextensionsv1.CustomResourceDefinitionStatus{x, y} {
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metaZero
		}
	}
	return reflect.DeepEqual(x, y)
}

// refuseCreates returns copies of kinds whose creates fail as upstream's
// do while the definition is terminating.
func refuseCreates(kinds []*registry.Kind) []*registry.Kind {
	out := make([]*registry.Kind, 0, len(kinds))
	for _, k := range kinds {
		cp := *k
		mutate := k.Mutate
		gr := k.GroupResource()
		cp.Mutate = func(ctx context.Context, l registry.Lister, obj, old runtime.Object) error {
			if old == nil {
				var name string
				if m, err := meta.Accessor(obj); err == nil {
					name = m.GetName()
				}
				return apierrors.NewForbidden(gr, name, errors.New("create not allowed while custom resource definition is terminating"))
			}
			if mutate != nil {
				return mutate(ctx, l, obj, old)
			}
			return nil
		}
		out = append(out, &cp)
	}
	return out
}
