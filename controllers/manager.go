package controllers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tether-edge/tether/controllers/nodelifecycle"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Config configures a Manager. Only RestConfig is required.
type Config struct {
	// RestConfig reaches the hub's API as the controller manager: it
	// discovers the served resources and feeds the shared informers, so
	// it must be allowed to list and watch every resource.
	RestConfig *rest.Config
	// ClientConfig returns the configuration controller name (as in
	// --controllers) reads and writes with, so each controller acts under
	// an identity of its own as kube-controller-manager's
	// --use-service-account-credentials makes it; nil means RestConfig
	// for all.
	ClientConfig func(controller string) *rest.Config
	// Logger receives the controllers' logs; nil means slog.Default().
	Logger *slog.Logger
	// Workers is the number of workers per controller; 0 means 4.
	Workers int
	// ResyncPeriod is how often every informer replays its cache, so that
	// state missed for any reason is reconciled; 0 means 10 minutes.
	ResyncPeriod time.Duration
	// DiscoveryPeriod is how often served resources are rediscovered so
	// new kinds get watched; 0 means 30 seconds.
	DiscoveryPeriod time.Duration
	// ResourcesChanged, when set, returns a channel closed when the
	// served resources next change (the hub passes its registry's, so
	// that custom resources are watched as soon as they are served);
	// discovery then runs again at once. Nil means DiscoveryPeriod only.
	ResourcesChanged func() <-chan struct{}
	// RootCA is the hub's CA certificate (PEM), published in every
	// namespace as the kube-root-ca.crt ConfigMap; empty publishes none.
	RootCA []byte
	// SitePeers, when set, reports what a node's site peers say of it
	// (site gossip, gathered by the hub from the sites' digests); the
	// node lifecycle controller decides with it. It must not block.
	SitePeers func(node string) nodelifecycle.PeerView
	// SiteHeard, when set, reports whether the hub hears any node of a
	// zone now; see nodelifecycle.Config.SiteHeard.
	SiteHeard func(zone string) bool
	// SiteDeadGrace is the node lifecycle controller's DeadGrace: how long
	// a node its site says is dead must also be silent; zero means 10s,
	// negative none (SitePeers confirms it).
	SiteDeadGrace time.Duration
	// SiteKeyRotation is how often the sitekeys controller rotates each
	// site's gossip keys; zero means a day.
	SiteKeyRotation time.Duration
	// LocalPathRoot is the directory on nodes under which local-path
	// volumes are provisioned; empty means /var/lib/tether/storage.
	LocalPathRoot string
	// TerminatedPodGCThreshold is how many finished pods may exist before
	// the pod garbage collector deletes the oldest, as
	// --terminated-pod-gc-threshold; 0 means 12500, negative never.
	TerminatedPodGCThreshold int
	// PodGCQuarantine is how long a node must be gone before the pod
	// garbage collector deletes its pods; 0 means 40 seconds.
	PodGCQuarantine time.Duration
	// HorizontalPodAutoscalerSyncPeriod is how often each
	// HorizontalPodAutoscaler is synced, as
	// --horizontal-pod-autoscaler-sync-period; 0 means 15 seconds.
	HorizontalPodAutoscalerSyncPeriod time.Duration
	// NodeMonitorGracePeriod is how long a node's Lease may go unrenewed
	// before the node lifecycle controller takes it as unreachable, as
	// --node-monitor-grace-period; 0 means 40 seconds.
	NodeMonitorGracePeriod time.Duration
	// Controllers selects the controllers to run, as
	// kube-controller-manager's --controllers ("*", "name", "-name"); nil
	// runs them all.
	Controllers []string
}

// Manager runs the controllers and the informers they share.
type Manager struct {
	cfg  Config
	log  *slog.Logger
	meta metadata.Interface
	kube kubernetes.Interface
	disc discovery.DiscoveryInterface

	// informers counts the running informers of watched resources.
	informers sync.WaitGroup

	discoverMu    sync.Mutex // one discovery at a time
	lastDiscovery time.Time  // of the last successful one

	mu        sync.RWMutex
	watched   map[schema.GroupResource]*watchedResource
	kinds     map[schema.GroupVersionKind]resourceInfo // every served version
	byGR      map[schema.GroupResource]resourceInfo
	namespace []resourceInfo // namespaced resources that can be listed and deleted

	gc *garbageCollector
	ns *namespaceController

	// typed feeds the controllers that work on typed objects.
	typed   informers.SharedInformerFactory
	runners []runner
}

// resourceInfo describes one served resource.
type resourceInfo struct {
	gvr        schema.GroupVersionResource
	kind       string
	namespaced bool
	verbs      []string
}

func (r resourceInfo) can(verb string) bool { return slices.Contains(r.verbs, verb) }

// watchedResource is a resource with a running informer.
type watchedResource struct {
	info     resourceInfo
	informer cache.SharedIndexInformer
	lister   cache.GenericLister
	ctx      context.Context    // the informer runs until it ends
	stop     context.CancelFunc // ends ctx
}

// New checks cfg and builds the clients; nothing runs until Run.
func New(cfg Config) (*Manager, error) {
	if cfg.RestConfig == nil {
		return nil, errors.New("create controllers: no rest config")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.ResyncPeriod <= 0 {
		cfg.ResyncPeriod = 10 * time.Minute
	}
	if cfg.DiscoveryPeriod <= 0 {
		cfg.DiscoveryPeriod = 30 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	meta, kube, err := clients(cfg.RestConfig)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:     cfg,
		log:     log,
		meta:    meta,
		kube:    kube,
		disc:    kube.Discovery(),
		watched: map[schema.GroupResource]*watchedResource{},
		kinds:   map[schema.GroupVersionKind]resourceInfo{},
		byGR:    map[schema.GroupResource]resourceInfo{},
	}
	if err := CheckNames(cfg.Controllers); err != nil {
		return nil, fmt.Errorf("create controllers: %w", err)
	}
	gcMeta, _, err := clients(m.configFor("garbagecollector"))
	if err != nil {
		return nil, err
	}
	m.gc = newGarbageCollector(m, gcMeta, log.With("controller", "garbagecollector"))
	nsMeta, nsKube, err := clients(m.configFor("namespace"))
	if err != nil {
		return nil, err
	}
	m.ns = newNamespaceController(m, nsMeta, nsKube, log.With("controller", "namespace"))
	m.typed = informers.NewSharedInformerFactoryWithOptions(kube, cfg.ResyncPeriod, informers.WithTransform(stripManagedFields))
	for _, b := range builtins {
		if !Enabled(cfg.Controllers, b.name) {
			continue
		}
		_, client, err := clients(m.configFor(b.name))
		if err != nil {
			return nil, err
		}
		r, err := b.build(client, m.typed, cfg.Workers, log.With("controller", b.name), &cfg)
		if err != nil {
			return nil, fmt.Errorf("create %s controller: %w", b.name, err)
		}
		m.runners = append(m.runners, r)
	}
	return m, nil
}

// stripManagedFields drops an object's managedFields before an informer
// keeps it, as upstream's controller manager does: no controller reads
// them, and with server-side apply they are often the larger part of an
// object's metadata (about a third of what the hub's informers held per
// pod, measured by testbench/hollow's TestHubScale).
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// configFor returns the client configuration of controller name.
func (m *Manager) configFor(name string) *rest.Config { return m.cfg.clientConfig(name) }

// clientConfig returns the client configuration of controller name.
func (c *Config) clientConfig(name string) *rest.Config {
	if c.ClientConfig != nil {
		if rc := c.ClientConfig(name); rc != nil {
			return rc
		}
	}
	return c.RestConfig
}

// clients builds the metadata and typed clients of one identity.
func clients(cfg *rest.Config) (metadata.Interface, kubernetes.Interface, error) {
	rc := rest.CopyConfig(cfg)
	// The controllers reach the hub over loopback; client-go's default of
	// 5 requests a second would throttle a node lifecycle pass or a large
	// rollout.
	if rc.QPS == 0 {
		rc.QPS = 500
	}
	if rc.Burst == 0 {
		rc.Burst = 1000
	}
	if rc.UserAgent == "" {
		rc.UserAgent = "tether-controllers"
	}
	meta, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("create metadata client: %w", err)
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("create kubernetes client: %w", err)
	}
	return meta, kube, nil
}

// Run discovers the served resources, starts their informers and the
// controllers' workers, and blocks until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	defer m.gc.queue.ShutDown()
	defer m.ns.queue.ShutDown()

	// Subscribe to changes before the first discovery, so that a kind
	// served between it and the loop below is not missed.
	var changed <-chan struct{}
	if m.cfg.ResourcesChanged != nil {
		changed = m.cfg.ResourcesChanged()
	}
	// The first discovery must succeed enough to watch something.
	for {
		err := m.discover(ctx)
		if err == nil {
			break
		}
		m.log.Warn("discover resources", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
	m.waitForSync(ctx, 30*time.Second)

	var wg sync.WaitGroup
	if Enabled(m.cfg.Controllers, "garbagecollector") {
		wg.Go(func() { m.gc.queue.Run(ctx, m.cfg.Workers, m.gc.log, m.gc.sync) })
	}
	if Enabled(m.cfg.Controllers, "namespace") {
		wg.Go(func() { m.ns.queue.Run(ctx, m.cfg.Workers, m.ns.log, m.ns.sync) })
	}
	m.typed.Start(ctx.Done())
	for _, r := range m.runners {
		wg.Go(func() {
			if err := r.Run(ctx); err != nil && ctx.Err() == nil {
				m.log.Error("controller stopped", "err", err)
			}
		})
	}
	m.log.Info("controllers running", "resources", len(m.watched), "workers", m.cfg.Workers)

	t := time.NewTicker(m.cfg.DiscoveryPeriod)
	defer t.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-t.C:
		case <-changed:
			changed = m.cfg.ResourcesChanged()
			// discover skips a run within a second of the last one:
			// wait that out, so that this change is seen.
			m.discoverMu.Lock()
			wait := time.Until(m.lastDiscovery.Add(time.Second))
			m.discoverMu.Unlock()
			select {
			case <-ctx.Done():
				break loop
			case <-time.After(wait):
			}
		}
		if err := m.discover(ctx); err != nil {
			m.log.Warn("rediscover resources", "err", err)
		}
	}
	m.gc.queue.ShutDown()
	m.ns.queue.ShutDown()
	wg.Wait()
	m.mu.Lock()
	for _, w := range m.watched {
		w.stop()
	}
	m.mu.Unlock()
	m.informers.Wait()
	m.typed.Shutdown()
	return nil
}

// waitForSync waits, at most timeout, for every informer's first list.
func (m *Manager) waitForSync(ctx context.Context, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	m.mu.RLock()
	var synced []cache.InformerSynced
	for _, w := range m.watched {
		synced = append(synced, w.informer.HasSynced)
	}
	m.mu.RUnlock()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) && ctx.Err() != nil {
		m.log.Warn("informers not synced in time; continuing with live lookups")
	}
}

// discover reads the served resources, adds an informer for every
// listable and watchable one not yet watched and stops and drops the
// informers of resources no longer served (a deleted
// CustomResourceDefinition's), as kube-controller-manager's resource
// monitors do. A partial failure keeps what was found and reports the
// error.
func (m *Manager) discover(ctx context.Context) error {
	m.discoverMu.Lock()
	defer m.discoverMu.Unlock()
	if time.Since(m.lastDiscovery) < time.Second {
		return nil
	}
	_, all, err := m.disc.ServerGroupsAndResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return fmt.Errorf("discover resources: %w", err)
	}
	partial := err
	preferred, err := m.disc.ServerPreferredResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return fmt.Errorf("discover preferred resources: %w", err)
	}
	if partial == nil {
		partial = err
	}

	kinds := map[schema.GroupVersionKind]resourceInfo{}
	for _, list := range all {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range list.APIResources {
			if isSubresource(r.Name) {
				continue
			}
			kinds[gv.WithKind(r.Kind)] = resourceInfo{gvr: gv.WithResource(r.Name), kind: r.Kind, namespaced: r.Namespaced, verbs: r.Verbs}
		}
	}
	byGR := map[schema.GroupResource]resourceInfo{}
	var namespaced []resourceInfo
	for _, list := range preferred {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range list.APIResources {
			if isSubresource(r.Name) {
				continue
			}
			info := resourceInfo{gvr: gv.WithResource(r.Name), kind: r.Kind, namespaced: r.Namespaced, verbs: r.Verbs}
			byGR[info.gvr.GroupResource()] = info
			if info.namespaced && info.can("list") && (info.can("delete") || info.can("deletecollection")) {
				namespaced = append(namespaced, info)
			}
		}
	}

	m.mu.Lock()
	// Keep what a failing group served before, rather than forget it.
	if partial != nil {
		for k, v := range m.kinds {
			if _, ok := kinds[k]; !ok {
				kinds[k] = v
			}
		}
		for k, v := range m.byGR {
			if _, ok := byGR[k]; !ok {
				byGR[k] = v
			}
		}
	}
	newKinds := false
	for k := range kinds {
		if _, ok := m.kinds[k]; !ok {
			newKinds = true
			break
		}
	}
	m.kinds, m.byGR, m.namespace = kinds, byGR, namespaced
	m.lastDiscovery = time.Now()
	var added, removed []*watchedResource
	for gr, w := range m.watched {
		if info, ok := byGR[gr]; !ok || !info.can("list") || !info.can("watch") {
			w.stop()
			delete(m.watched, gr)
			removed = append(removed, w)
		}
	}
	for gr, info := range byGR {
		if _, ok := m.watched[gr]; ok || !info.can("list") || !info.can("watch") || ignoredResources[gr] {
			continue
		}
		gi := metadatainformer.NewFilteredMetadataInformer(m.meta, info.gvr, metav1.NamespaceAll, m.cfg.ResyncPeriod,
			cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}, nil)
		_ = gi.Informer().SetTransform(stripManagedFields)
		w := &watchedResource{info: info, informer: gi.Informer(), lister: gi.Lister()}
		w.ctx, w.stop = context.WithCancel(ctx)
		m.watched[gr] = w
		added = append(added, w)
	}
	m.mu.Unlock()

	for _, w := range removed {
		m.log.Debug("stopped watching resource", "resource", w.info.gvr.String())
	}

	for _, w := range added {
		m.gc.watch(w)
		if w.info.gvr.GroupResource() == (schema.GroupResource{Resource: "namespaces"}) {
			m.ns.watch(w)
		}
		m.informers.Go(func() { w.informer.RunWithContext(w.ctx) })
		m.log.Debug("watching resource", "resource", w.info.gvr.String())
	}
	if newKinds {
		m.gc.kindsAdded()
	}
	if partial != nil {
		return fmt.Errorf("discover some groups: %w", partial)
	}
	return nil
}

// ignoredResources are not watched: they are many, short-lived and never
// owners. The namespace controller still deletes them.
var ignoredResources = map[schema.GroupResource]bool{
	{Resource: "events"}:                         true,
	{Group: "events.k8s.io", Resource: "events"}: true,
}

func isSubresource(name string) bool { return strings.Contains(name, "/") }

// kindInfo resolves an apiVersion and kind, as written in an owner
// reference, to a served resource.
func (m *Manager) kindInfo(apiVersion, kind string) (resourceInfo, bool) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return resourceInfo{}, false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	info, ok := m.kinds[gv.WithKind(kind)]
	return info, ok
}

// watchedFor returns the informer of a group and resource, if any.
func (m *Manager) watchedFor(gr schema.GroupResource) *watchedResource {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.watched[gr]
}

// namespacedResources returns the namespaced resources a namespace must be
// emptied of.
func (m *Manager) namespacedResources() []resourceInfo {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return slices.Clone(m.namespace)
}

// metaOf returns an informer object's metadata, unwrapping tombstones.
func metaOf(obj any) (*metav1.PartialObjectMetadata, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*metav1.PartialObjectMetadata)
	return p, ok
}
