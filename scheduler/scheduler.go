package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// DefaultSchedulerName is the name pods ask for (or leave empty) to be
// placed by this scheduler.
const DefaultSchedulerName = corev1.DefaultSchedulerName

// Config configures a Scheduler.
type Config struct {
	// RestConfig reaches the API server. Required. The scheduler copies it
	// and lifts client-side rate limits: bindings are its throughput.
	RestConfig *rest.Config
	// SchedulerName is the spec.schedulerName of the pods to place. If
	// empty, "default-scheduler", which also takes pods that name none.
	SchedulerName string
	// Parallelism is the number of bindings in flight at once. If zero, 64.
	Parallelism int
	// Logger receives the scheduler's logs. If nil, slog.Default().
	Logger *slog.Logger
}

// Scheduler watches pending pods and binds them to nodes.
type Scheduler struct {
	cfg  Config
	log  *slog.Logger
	cs   kubernetes.Interface
	name string

	// Owned by the loop goroutine.
	snap *Snapshot
	dec  *Decider
	q    *queue
	prio *PriorityClasses

	mu    sync.Mutex
	inbox []func()
	wake  chan struct{}

	binds  chan bindJob
	writes chan func(context.Context)
	events *events

	stats Stats
}

// Stats counts what the scheduler did; read it with (*Scheduler).Stats.
type Stats struct {
	Scheduled, Failed, BindErrors, Preemptions int64
}

// New validates cfg and builds a Scheduler; Run starts it.
func New(cfg Config) (*Scheduler, error) {
	if cfg.RestConfig == nil {
		return nil, errors.New("scheduler config: RestConfig is required")
	}
	if cfg.SchedulerName == "" {
		cfg.SchedulerName = DefaultSchedulerName
	}
	if cfg.Parallelism <= 0 {
		cfg.Parallelism = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rc := rest.CopyConfig(cfg.RestConfig)
	rc.QPS = -1 // no client-side rate limiting
	rc.Burst = 0
	rc.UserAgent = "tether-scheduler"
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create scheduler client: %w", err)
	}
	s := &Scheduler{
		cfg:    cfg,
		log:    cfg.Logger.With("component", "scheduler"),
		cs:     cs,
		name:   cfg.SchedulerName,
		snap:   NewSnapshot(),
		dec:    NewDecider(uint64(time.Now().UnixNano())),
		q:      newQueue(),
		prio:   NewPriorityClasses(),
		wake:   make(chan struct{}, 1),
		binds:  make(chan bindJob, cfg.Parallelism),
		writes: make(chan func(context.Context), 4096),
	}
	if s.events, err = newEvents(rc, s.name, s.log); err != nil {
		return nil, err
	}
	return s, nil
}

// post hands fn to the loop goroutine. It never blocks.
func (s *Scheduler) post(fn func()) {
	s.mu.Lock()
	s.inbox = append(s.inbox, fn)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// drain runs everything posted so far.
func (s *Scheduler) drain() {
	s.mu.Lock()
	fns := s.inbox
	s.inbox = nil
	s.mu.Unlock()
	for i, fn := range fns {
		fn()
		fns[i] = nil
	}
}

// Run starts the informers, waits for them to sync and schedules until
// ctx is done.
func (s *Scheduler) Run(ctx context.Context) error {
	begin := time.Now()
	s.events.start(ctx)
	factory := informers.NewSharedInformerFactory(s.cs, 0)
	stripManagedFields := func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
		}
		return obj, nil
	}

	// The store holds every pod of the cluster, so it keeps only what
	// the scheduler reads of each (slimPod).
	pods := factory.Core().V1().Pods().Informer()
	_ = pods.SetTransform(slimPodTransform)
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p := obj.(*corev1.Pod); s.post(func() { s.onPod(nil, p) }) },
		UpdateFunc: func(old, obj any) { o, p := old.(*corev1.Pod), obj.(*corev1.Pod); s.post(func() { s.onPod(o, p) }) },
		DeleteFunc: func(obj any) {
			if p, ok := tombstone[*corev1.Pod](obj); ok {
				s.post(func() { s.onPodDelete(p) })
			}
		},
	}); err != nil {
		return fmt.Errorf("watch pods: %w", err)
	}
	nodes := factory.Core().V1().Nodes().Informer()
	_ = nodes.SetTransform(stripManagedFields)
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { n := obj.(*corev1.Node); s.post(func() { s.onNode(n) }) },
		UpdateFunc: func(_, obj any) { n := obj.(*corev1.Node); s.post(func() { s.onNode(n) }) },
		DeleteFunc: func(obj any) {
			if n, ok := tombstone[*corev1.Node](obj); ok {
				s.post(func() { s.snap.RemoveNode(n.Name) })
			}
		},
	}); err != nil {
		return fmt.Errorf("watch nodes: %w", err)
	}
	watchKind(s, factory.Core().V1().Namespaces().Informer(), func(o *corev1.Namespace) { s.snap.SetNamespace(o) },
		func(o *corev1.Namespace) { s.snap.RemoveNamespace(o.Name) }, evNamespace)
	watchKind(s, factory.Core().V1().PersistentVolumeClaims().Informer(), func(o *corev1.PersistentVolumeClaim) { s.snap.SetPVC(o) },
		func(o *corev1.PersistentVolumeClaim) { s.snap.RemovePVC(o.Namespace, o.Name) }, evPVC)
	watchKind(s, factory.Core().V1().PersistentVolumes().Informer(), func(o *corev1.PersistentVolume) { s.snap.SetPV(o) },
		func(o *corev1.PersistentVolume) { s.snap.RemovePV(o.Name) }, evPV)
	// Kinds the API server may not serve are watched only if discovery
	// lists them; without them the scheduler still works, knowing no
	// classes or budgets.
	if s.served("storage.k8s.io/v1", "storageclasses") {
		watchKind(s, factory.Storage().V1().StorageClasses().Informer(), func(o *storagev1.StorageClass) { s.snap.SetStorageClass(o) },
			func(o *storagev1.StorageClass) { s.snap.RemoveStorageClass(o.Name) }, evStorageClass)
	}
	if s.served("policy/v1", "poddisruptionbudgets") {
		watchKind(s, factory.Policy().V1().PodDisruptionBudgets().Informer(), func(o *policyv1.PodDisruptionBudget) { s.snap.SetPDB(o) },
			func(o *policyv1.PodDisruptionBudget) { s.snap.RemovePDB(o.Namespace, o.Name) }, 0)
	}
	if s.served("scheduling.k8s.io/v1", "priorityclasses") {
		watchKind(s, factory.Scheduling().V1().PriorityClasses().Informer(), func(o *schedulingv1.PriorityClass) { s.prio.Set(o) },
			func(o *schedulingv1.PriorityClass) { s.prio.Remove(o.Name) }, 0)
	}

	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("sync %v informer: not synced", typ)
		}
	}
	s.log.Info("scheduler started", "name", s.name, "parallelism", s.cfg.Parallelism,
		"synced", time.Since(begin).Round(time.Millisecond))

	var wg sync.WaitGroup
	for range s.cfg.Parallelism {
		wg.Go(func() { s.bindWorker(ctx) })
	}
	for range 8 {
		wg.Go(func() { s.writeWorker(ctx) })
	}
	s.loop(ctx)
	close(s.binds)
	close(s.writes)
	wg.Wait()
	return nil
}

// served tells whether discovery lists resource in groupVersion.
func (s *Scheduler) served(groupVersion, resource string) bool {
	l, err := s.cs.Discovery().ServerResourcesForGroupVersion(groupVersion)
	if err != nil {
		return false
	}
	for _, r := range l.APIResources {
		if r.Name == resource {
			return true
		}
	}
	return false
}

func tombstone[T any](obj any) (T, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	t, ok := obj.(T)
	return t, ok
}

// watchKind wires a simple informer: set on add and update, del on delete,
// and the queue event ev (if any) on each.
func watchKind[T any](s *Scheduler, inf cache.SharedIndexInformer, set, del func(T), ev eventMask) {
	now := time.Now
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			o := obj.(T)
			s.post(func() { set(o); s.q.event(ev, now()) })
		},
		UpdateFunc: func(_, obj any) {
			o := obj.(T)
			s.post(func() { set(o); s.q.event(ev, now()) })
		},
		DeleteFunc: func(obj any) {
			if o, ok := tombstone[T](obj); ok {
				s.post(func() { del(o) })
			}
		},
	})
}

// Stats returns a copy of the counters. Safe to call from any goroutine.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *Scheduler) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}
