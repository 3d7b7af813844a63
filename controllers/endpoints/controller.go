package endpoints

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/tether-edge/tether/controllers/internal/kit"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client writes slices and Endpoints.
	Client kubernetes.Interface
	// Informers is the shared factory the controller registers its
	// Service, Pod, Node, EndpointSlice and Endpoints informers on; New
	// must be called before the factory is started.
	Informers informers.SharedInformerFactory
	// Workers is the number of Services synced at once; zero means 4.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// MaxEndpointsPerSlice caps the endpoints of one slice; zero means
	// 100. At most 1000.
	MaxEndpointsPerSlice int
	// Clock stamps the last-change-trigger-time annotation; nil means the
	// real clock.
	Clock clock.PassiveClock
}

// Controller keeps EndpointSlices and Endpoints for Services.
type Controller struct {
	cfg   Config
	log   *slog.Logger
	queue *kit.Queue

	services  corelisters.ServiceLister
	pods      corelisters.PodLister
	nodes     corelisters.NodeLister
	slices    discoverylisters.EndpointSliceLister
	endpoints corelisters.EndpointsLister
	sliceIdx  cache.Indexer
	synced    []cache.InformerSynced

	tracker *tracker

	mu       sync.Mutex           // guards the following field
	triggers map[string]time.Time // by Service key: the oldest change not yet written
}

const serviceIndex = "service"

// New registers the controller's informers; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create endpoints controller: client and informers are required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.MaxEndpointsPerSlice <= 0 {
		cfg.MaxEndpointsPerSlice = 100
	}
	if cfg.MaxEndpointsPerSlice > 1000 {
		return nil, fmt.Errorf("create endpoints controller: max endpoints per slice %d is over 1000", cfg.MaxEndpointsPerSlice)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{
		cfg: cfg,
		log: log.With("controller", "endpointslice"),
		// No batching delay: a readiness change is written as soon as it
		// is seen. Failures back off from 5ms to 30s.
		queue:    kit.NewQueue("endpointslice", kit.WithBackoff(5*time.Millisecond, 30*time.Second)),
		tracker:  newTracker(),
		triggers: map[string]time.Time{},
	}
	f := cfg.Informers
	svcInf := f.Core().V1().Services()
	podInf := f.Core().V1().Pods()
	nodeInf := f.Core().V1().Nodes()
	sliceInf := f.Discovery().V1().EndpointSlices()
	epInf := f.Core().V1().Endpoints()
	c.services, c.pods, c.nodes = svcInf.Lister(), podInf.Lister(), nodeInf.Lister()
	c.slices, c.endpoints = sliceInf.Lister(), epInf.Lister()
	c.sliceIdx = sliceInf.Informer().GetIndexer()
	if err := sliceInf.Informer().AddIndexers(cache.Indexers{serviceIndex: sliceServiceIndex}); err != nil {
		return nil, fmt.Errorf("index endpoint slices: %w", err)
	}
	c.synced = []cache.InformerSynced{
		svcInf.Informer().HasSynced, podInf.Informer().HasSynced, nodeInf.Informer().HasSynced,
		sliceInf.Informer().HasSynced, epInf.Informer().HasSynced,
	}

	handlers := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{svcInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    c.queue.Enqueue,
			UpdateFunc: func(_, obj any) { c.queue.Enqueue(obj) },
			DeleteFunc: c.queue.Enqueue,
		}},
		{podInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.podChanged(nil, obj) },
			UpdateFunc: c.podChanged,
			DeleteFunc: func(obj any) { c.podChanged(nil, obj) },
		}},
		{nodeInf.Informer(), cache.ResourceEventHandlerFuncs{
			UpdateFunc: c.nodeChanged,
		}},
		{sliceInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    c.sliceChanged,
			UpdateFunc: func(_, obj any) { c.sliceChanged(obj) },
			DeleteFunc: c.sliceChanged,
		}},
	}
	for _, h := range handlers {
		if _, err := h.inf.AddEventHandler(h.h); err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
	}
	return c, nil
}

// sliceServiceIndex indexes the controller's slices by their Service.
func sliceServiceIndex(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || s.Labels[LabelManagedBy] != ManagedByValue || s.Labels[LabelServiceName] == "" {
		return nil, nil
	}
	return []string{s.Namespace + "/" + s.Labels[LabelServiceName]}, nil
}

// Run waits for the informers, then syncs Services until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("endpointslice controller running", "workers", c.cfg.Workers)
	c.queue.Run(ctx, c.cfg.Workers, c.log, c.sync)
	return nil
}

// noteTrigger records when a change that concerns a Service was seen; the
// earliest not yet written becomes the trigger-time annotation.
func (c *Controller) noteTrigger(key string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.triggers[key]; !ok || at.Before(old) {
		c.triggers[key] = at
	}
}

func (c *Controller) takeTrigger(key string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.triggers[key]
	delete(c.triggers, key)
	return t, ok
}

func (c *Controller) podChanged(oldObj, newObj any) {
	pod := podOf(newObj)
	if pod == nil {
		return
	}
	old := podOf(oldObj)
	if old != nil && !podChangeMatters(old, pod) {
		return
	}
	now := c.cfg.Clock.Now()
	keys := c.servicesFor(pod)
	if old != nil && !maps.Equal(old.Labels, pod.Labels) {
		for k := range c.servicesFor(old) {
			keys[k] = struct{}{}
		}
	}
	for k := range keys {
		c.noteTrigger(k, now)
		c.queue.Add(k)
	}
}

func podOf(obj any) *corev1.Pod {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, _ := obj.(*corev1.Pod)
	return p
}

// podChangeMatters says whether a pod update can change any endpoint.
func podChangeMatters(old, cur *corev1.Pod) bool {
	if old.ResourceVersion == cur.ResourceVersion {
		return false // a resync
	}
	return !maps.Equal(old.Labels, cur.Labels) ||
		kit.IsPodReady(old) != kit.IsPodReady(cur) ||
		old.Status.PodIP != cur.Status.PodIP || len(old.Status.PodIPs) != len(cur.Status.PodIPs) ||
		old.Status.Phase != cur.Status.Phase ||
		(old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil) ||
		old.Spec.NodeName != cur.Spec.NodeName ||
		old.Spec.Hostname != cur.Spec.Hostname || old.Spec.Subdomain != cur.Spec.Subdomain ||
		old.Generation != cur.Generation
}

// servicesFor returns the keys of the Services whose selector matches pod.
func (c *Controller) servicesFor(pod *corev1.Pod) map[string]struct{} {
	out := map[string]struct{}{}
	svcs, err := c.services.Services(pod.Namespace).List(labels.Everything())
	if err != nil {
		return out
	}
	set := labels.Set(pod.Labels)
	for _, s := range svcs {
		if s.Spec.Selector == nil {
			continue
		}
		if labels.SelectorFromValidatedSet(s.Spec.Selector).Matches(set) {
			out[s.Namespace+"/"+s.Name] = struct{}{}
		}
	}
	return out
}

// nodeChanged requeues every Service when a node's zone changes; zones
// change rarely enough that finding the affected Services is not worth an
// index.
func (c *Controller) nodeChanged(oldObj, newObj any) {
	o, ok1 := oldObj.(*corev1.Node)
	n, ok2 := newObj.(*corev1.Node)
	if !ok1 || !ok2 || o.Labels[LabelZone] == n.Labels[LabelZone] {
		return
	}
	svcs, err := c.services.List(labels.Everything())
	if err != nil {
		return
	}
	for _, s := range svcs {
		c.queue.Add(s.Namespace + "/" + s.Name)
	}
}

// sliceChanged requeues the Service of a managed slice someone else
// changed or deleted; the controller's own writes are requeued too, which
// is cheap as an unchanged plan writes nothing.
func (c *Controller) sliceChanged(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || s.Labels[LabelManagedBy] != ManagedByValue || s.Labels[LabelServiceName] == "" {
		return
	}
	c.queue.Add(s.Namespace + "/" + s.Labels[LabelServiceName])
}

func (c *Controller) zoneOf(node string) string {
	n, err := c.nodes.Get(node)
	if err != nil {
		return ""
	}
	return n.Labels[LabelZone]
}

// sync brings one Service's slices and Endpoints to the desired state.
func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	svc, err := c.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		// Slices go with their owner through the garbage collector; the
		// Endpoints object has no owner and is deleted here.
		c.tracker.forget(key)
		c.takeTrigger(key)
		err := c.cfg.Client.CoreV1().Endpoints(ns).Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete endpoints: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get service: %w", err)
	}
	if svc.Spec.Selector == nil || svc.DeletionTimestamp != nil {
		return nil
	}

	var pods []*corev1.Pod
	if svc.Spec.Type != corev1.ServiceTypeExternalName {
		pods, err = c.pods.Pods(ns).List(labels.SelectorFromValidatedSet(svc.Spec.Selector))
		if err != nil {
			return fmt.Errorf("list pods: %w", err)
		}
	}
	trigger := ""
	if t, ok := c.takeTrigger(key); ok {
		trigger = t.UTC().Format(time.RFC3339Nano)
	} else if svc.CreationTimestamp.After(c.cfg.Clock.Now().Add(-time.Minute)) {
		trigger = svc.CreationTimestamp.UTC().Format(time.RFC3339Nano)
	}

	errSlices := c.syncSlices(ctx, key, svc, pods, trigger)
	var errLegacy error
	if svc.Spec.Type != corev1.ServiceTypeExternalName {
		errLegacy = c.syncLegacy(ctx, svc, pods, trigger)
	}
	if err := errors.Join(errSlices, errLegacy); err != nil {
		if trigger != "" {
			if t, perr := time.Parse(time.RFC3339Nano, trigger); perr == nil {
				c.noteTrigger(key, t)
			}
		}
		return err
	}
	return nil
}

func (c *Controller) syncSlices(ctx context.Context, key string, svc *corev1.Service, pods []*corev1.Pod, trigger string) error {
	objs, err := c.sliceIdx.ByIndex(serviceIndex, key)
	if err != nil {
		return fmt.Errorf("list slices: %w", err)
	}
	existing := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		existing = append(existing, o.(*discoveryv1.EndpointSlice))
	}
	if !c.tracker.fresh(key, existing) {
		// The cache lacks a write of ours; its event requeues the
		// Service. The delay covers an event that never comes.
		c.queue.AddAfter(key, time.Second)
		return nil
	}
	var groups map[string]*group
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		groups = map[string]*group{}
	} else {
		groups = desiredGroups(svc, pods, c.zoneOf)
	}
	p := planSlices(svc, groups, existing, c.cfg.MaxEndpointsPerSlice, trigger)
	if p.empty() {
		return nil
	}
	api := c.cfg.Client.DiscoveryV1().EndpointSlices(svc.Namespace)
	var errs []error
	// Creations first, so that endpoints moving between slices are never
	// missing from all of them.
	for _, s := range p.create {
		got, err := api.Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("create endpoint slice: %w", err))
			continue
		}
		c.tracker.wrote(key, got)
	}
	for _, s := range p.update {
		got, err := api.Update(ctx, s, metav1.UpdateOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("update endpoint slice %s: %w", s.Name, err))
			continue
		}
		c.tracker.wrote(key, got)
	}
	for _, s := range p.delete {
		err := api.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete endpoint slice %s: %w", s.Name, err))
			continue
		}
		c.tracker.deleted(key, s.Name)
	}
	c.log.Debug("synced endpoint slices", "service", key,
		"created", len(p.create), "updated", len(p.update), "deleted", len(p.delete))
	return errors.Join(errs...)
}
