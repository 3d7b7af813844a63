package endpoints

//lint:file-ignore SA1019 EndpointSlice mirroring reads core/v1 Endpoints by definition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// MirrorConfig configures the mirroring controller. Client and Informers
// are required.
type MirrorConfig struct {
	// Client writes EndpointSlices.
	Client kubernetes.Interface
	// Informers is the shared factory the controller registers its
	// Service, Endpoints and EndpointSlice informers on; NewMirroring
	// must be called before the factory is started.
	Informers informers.SharedInformerFactory
	// Workers is the number of Endpoints mirrored at once; zero means 4.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Mirror keeps EndpointSlices that mirror the hand-written Endpoints of
// Services without a selector, as upstream's endpointslice-mirroring
// controller.
type Mirror struct {
	cfg       MirrorConfig
	log       *slog.Logger
	queue     *kit.Queue
	services  corelisters.ServiceLister
	endpoints corelisters.EndpointsLister
	sliceIdx  cache.Indexer
	synced    []cache.InformerSynced

	mu      sync.Mutex                      // guards created
	created map[string]map[string]time.Time // by Service key: slices created and not yet in the cache, with when
}

const mirrorIndex = "mirrored-service"

// annotationLeader marks an Endpoints object used for leader election.
const annotationLeader = "control-plane.alpha.kubernetes.io/leader"

// mirrorServiceIndex indexes mirrored slices by their Service.
func mirrorServiceIndex(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || s.Labels[LabelManagedBy] != MirroringManagedByValue || s.Labels[LabelServiceName] == "" {
		return nil, nil
	}
	return []string{s.Namespace + "/" + s.Labels[LabelServiceName]}, nil
}

// NewMirroring registers the controller's informers; nothing runs until
// Run.
func NewMirroring(cfg MirrorConfig) (*Mirror, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create endpointslice mirroring controller: client and informers are required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	m := &Mirror{
		cfg:     cfg,
		log:     log.With("controller", "endpointslice-mirroring"),
		queue:   kit.NewQueue("endpointslice-mirroring"),
		created: map[string]map[string]time.Time{},
	}
	f := cfg.Informers
	svcInf := f.Core().V1().Services()
	epInf := f.Core().V1().Endpoints()
	sliceInf := f.Discovery().V1().EndpointSlices()
	m.services, m.endpoints = svcInf.Lister(), epInf.Lister()
	m.sliceIdx = sliceInf.Informer().GetIndexer()
	if err := sliceInf.Informer().AddIndexers(cache.Indexers{mirrorIndex: mirrorServiceIndex}); err != nil {
		return nil, fmt.Errorf("index endpoint slices: %w", err)
	}
	m.synced = []cache.InformerSynced{svcInf.Informer().HasSynced, epInf.Informer().HasSynced, sliceInf.Informer().HasSynced}
	enqueue := cache.ResourceEventHandlerFuncs{
		AddFunc:    m.queue.Enqueue,
		UpdateFunc: func(_, obj any) { m.queue.Enqueue(obj) },
		DeleteFunc: m.queue.Enqueue,
	}
	for _, inf := range []cache.SharedIndexInformer{svcInf.Informer(), epInf.Informer()} {
		if _, err := inf.AddEventHandler(enqueue); err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
	}
	if _, err := sliceInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    m.sliceChanged,
		UpdateFunc: func(_, obj any) { m.sliceChanged(obj) },
		DeleteFunc: m.sliceChanged,
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	return m, nil
}

// sliceChanged requeues the Service of a mirrored slice, so a slice
// changed or deleted by someone else is put back. Any event of a slice
// this controller created shows the cache has seen it, even when the
// slice is gone by the next sync (deleted by the garbage collector with
// its Endpoints, say): it no longer holds the Service's syncs back.
func (m *Mirror) sliceChanged(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || s.Labels[LabelManagedBy] != MirroringManagedByValue || s.Labels[LabelServiceName] == "" {
		return
	}
	key := s.Namespace + "/" + s.Labels[LabelServiceName]
	m.mu.Lock()
	if names := m.created[key]; names != nil {
		delete(names, s.Name)
		if len(names) == 0 {
			delete(m.created, key)
		}
	}
	m.mu.Unlock()
	m.queue.Add(key)
}

// Run waits for the informers, then mirrors Endpoints until ctx ends.
func (m *Mirror) Run(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), m.synced...) {
		return nil
	}
	m.log.Info("endpointslice mirroring controller running", "workers", m.cfg.Workers)
	m.queue.Run(ctx, m.cfg.Workers, m.log, m.sync)
	return nil
}

// sync mirrors one Endpoints object, or deletes its mirrored slices when
// it is not to be mirrored: its Service is gone or has a selector, it is
// gone, or it is labelled to skip mirroring.
func (m *Mirror) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	objs, err := m.sliceIdx.ByIndex(mirrorIndex, key)
	if err != nil {
		return fmt.Errorf("list mirrored slices: %w", err)
	}
	existing := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		existing = append(existing, o.(*discoveryv1.EndpointSlice))
	}
	if !m.cacheHasCreated(key, existing) {
		// A slice just created is not in the cache yet: its event
		// requeues the Service; the delay covers one that never comes.
		m.queue.AddAfter(key, time.Second)
		return nil
	}
	ep, mirror, err := m.toMirror(ns, name)
	if err != nil {
		return err
	}
	var p mirrorPlan
	if mirror {
		p = planMirror(ep, existing, MaxMirroredPerSubset)
	} else {
		p.delete = existing
	}
	api := m.cfg.Client.DiscoveryV1().EndpointSlices(ns)
	var errs []error
	for _, s := range p.create {
		got, err := api.Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("create endpoint slice: %w", err))
			continue
		}
		m.noteCreated(key, got.Name)
	}
	for _, s := range p.update {
		if _, err := api.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			errs = append(errs, fmt.Errorf("update endpoint slice %s: %w", s.Name, err))
		}
	}
	for _, s := range p.delete {
		err := api.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete endpoint slice %s: %w", s.Name, err))
		}
	}
	if len(p.create)+len(p.update)+len(p.delete) > 0 {
		m.log.Debug("mirrored endpoints", "endpoints", key,
			"created", len(p.create), "updated", len(p.update), "deleted", len(p.delete))
	}
	return errors.Join(errs...)
}

func (m *Mirror) noteCreated(key, name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.created[key] == nil {
		m.created[key] = map[string]time.Time{}
	}
	m.created[key][name] = time.Now()
}

// cacheHasCreated says whether the cache holds every slice created for
// key, forgetting those it holds and those created over 30s ago (deleted
// before the cache saw them).
func (m *Mirror) cacheHasCreated(key string, existing []*discoveryv1.EndpointSlice) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := m.created[key]
	for _, s := range existing {
		delete(names, s.Name)
	}
	for n, at := range names {
		if time.Since(at) > 30*time.Second {
			delete(names, n)
		}
	}
	if len(names) == 0 {
		delete(m.created, key)
		return true
	}
	return false
}

// toMirror returns the Endpoints object of a Service and whether it is to
// be mirrored.
func (m *Mirror) toMirror(ns, name string) (*corev1.Endpoints, bool, error) {
	svc, err := m.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("get service: %w", err)
	}
	if svc.Spec.Selector != nil || svc.DeletionTimestamp != nil {
		return nil, false, nil
	}
	ep, err := m.endpoints.Endpoints(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("get endpoints: %w", err)
	}
	// Leader-election records are not endpoints.
	if _, leader := ep.Annotations[annotationLeader]; leader {
		return nil, false, nil
	}
	if ep.Labels[LabelSkipMirror] == "true" || ep.DeletionTimestamp != nil {
		return nil, false, nil
	}
	return ep, true, nil
}
