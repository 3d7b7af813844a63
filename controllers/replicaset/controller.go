// Package replicaset runs tether's ReplicaSet controller: it keeps
// spec.replicas pods matching a ReplicaSet's selector, creating them from
// its template and deleting the surplus, adopts matching orphans, releases
// pods whose labels stop matching, and reports the counts in status. The
// same controller, working on ReplicaSet views of them, runs core/v1
// ReplicationControllers (see [NewForReplicationControllers]).
//
// The controller is level-based: informer events queue ReplicaSet keys, and
// a worker compares the cached pods with the desired count. Expectations
// (see package kit) keep a sync from acting on a cache that does not yet
// show the controller's own creates and deletes. At most BurstReplicas pods
// are created or deleted per sync, in batches of 1, 2, 4, … so a failing
// template costs one failed create, not thousands; a scale-up spanning
// several syncs, all of whose creates succeeded, goes on at full batch
// size in the next sync instead of starting from one again.
package replicaset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client reaches the hub with rights over pods, the owners' kind
	// (replicasets or replicationcontrollers) and events.
	Client kubernetes.Interface
	// Informers is the shared factory New registers its informers on; the
	// caller starts it after New.
	Informers informers.SharedInformerFactory
	// Workers is the number of ReplicaSets synced at once; 0 means 5.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// BurstReplicas caps the pods created or deleted by one sync; 0 means
	// 500.
	BurstReplicas int
	// Now is the clock for availability (minReadySeconds); nil means
	// time.Now.
	Now func() time.Time
}

// Controller is the ReplicaSet controller, or the ReplicationController
// one.
type Controller struct {
	client   kubernetes.Interface
	log      *slog.Logger
	workers  int
	burst    int
	now      func() time.Time
	owners   *owners
	pods     corelisters.PodLister
	podIndex cache.Indexer
	synced   []cache.InformerSynced

	queue    *kit.Queue
	exp      *kit.Expectations
	recorder *kit.Recorder
	control  kit.PodControl

	batchMu sync.Mutex
	batches map[string]carriedBatch // by ReplicaSet key; see firstBatch

	statusMu      sync.Mutex
	statusWritten map[string]time.Time // by ReplicaSet key; see statusDue
}

// countsInterval is how often a ReplicaSet's status is written at most
// while only its counts move towards the settled state: scaling up
// thousands of pods would otherwise write a status for every few pods that
// become ready.
const countsInterval = time.Second

// batchCarryOver bounds how long a scale-up's slow start carries over to
// the ReplicaSet's next sync.
const batchCarryOver = time.Minute

// carriedBatch is the first create batch of a ReplicaSet's next sync.
type carriedBatch struct {
	size int
	at   time.Time
}

var errNeedClient = errors.New("create replicaset controller: client and informers are required")

// New registers the ReplicaSet controller's informers on cfg.Informers.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errNeedClient
	}
	return newController(cfg, replicaSets(cfg.Client, cfg.Informers))
}

// newController registers a controller of o on cfg.Informers.
func newController(cfg Config, o *owners) (*Controller, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 5
	}
	if cfg.BurstReplicas <= 0 {
		cfg.BurstReplicas = 500
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger.With("controller", o.name)
	podInf := cfg.Informers.Core().V1().Pods()
	if err := kit.AddControllerIndex(podInf.Informer()); err != nil {
		return nil, fmt.Errorf("create %s controller: %w", o.name, err)
	}
	if err := kit.AddControllerIndex(o.informer); err != nil {
		return nil, fmt.Errorf("create %s controller: %w", o.name, err)
	}
	rec := kit.NewRecorder(cfg.Client, o.component, log)
	c := &Controller{
		client: cfg.Client, log: log, workers: cfg.Workers, burst: cfg.BurstReplicas, now: cfg.Now,
		owners: o,
		pods:   podInf.Lister(), podIndex: podInf.Informer().GetIndexer(),
		synced:  []cache.InformerSynced{o.informer.HasSynced, podInf.Informer().HasSynced},
		queue:   kit.NewQueue(o.name),
		exp:     kit.NewExpectations(0, cfg.Now),
		batches: map[string]carriedBatch{},

		statusWritten: map[string]time.Time{},
		recorder:      rec,
		control:       kit.PodControl{Client: cfg.Client, Recorder: rec},
	}
	if _, err := o.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.queue.Enqueue,
		UpdateFunc: func(_, cur any) { c.queue.Enqueue(cur) },
		DeleteFunc: func(obj any) {
			if key, ok := kit.Key(obj); ok {
				c.exp.Forget(key)
				c.batchMu.Lock()
				delete(c.batches, key)
				c.batchMu.Unlock()
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("watch %ss: %w", o.name, err)
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.addPod,
		UpdateFunc: c.updatePod,
		DeleteFunc: c.deletePod,
	}); err != nil {
		return nil, fmt.Errorf("watch pods: %w", err)
	}
	return c, nil
}

// Run waits for the informers, then syncs ReplicaSets until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.recorder.Start(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil // ctx ended first
	}
	c.log.Info(c.owners.name+" controller running", "workers", c.workers)
	c.queue.Run(ctx, c.workers, c.log, c.sync)
	return nil
}

// ownerOf returns the ReplicaSet a controller reference names, if it is
// in the cache with the same UID.
func (c *Controller) ownerOf(ns string, ref *metav1.OwnerReference) *appsv1.ReplicaSet {
	if ref == nil || ref.Kind != c.owners.gvk.Kind {
		return nil
	}
	rs, ok := c.owners.cached(cache.NewObjectName(ns, ref.Name).String())
	if !ok || rs.UID != ref.UID {
		return nil
	}
	return rs
}

// matching returns the ReplicaSets of ns whose selector matches pod.
func (c *Controller) matching(pod *corev1.Pod) []*appsv1.ReplicaSet {
	var out []*appsv1.ReplicaSet
	for _, rs := range c.owners.list(pod.Namespace) {
		sel, err := metav1.LabelSelectorAsSelector(rs.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		out = append(out, rs)
	}
	return out
}

func (c *Controller) addPod(obj any) {
	pod := obj.(*corev1.Pod)
	if pod.DeletionTimestamp != nil {
		c.deletePod(pod)
		return
	}
	if ref := metav1.GetControllerOfNoCopy(pod); ref != nil {
		if rs := c.ownerOf(pod.Namespace, ref); rs != nil {
			key, _ := kit.Key(rs)
			c.exp.CreationObserved(key)
			c.queue.Add(key)
		}
		return
	}
	for _, rs := range c.matching(pod) {
		c.queue.Enqueue(rs)
	}
}

func (c *Controller) updatePod(oldObj, curObj any) {
	old, cur := oldObj.(*corev1.Pod), curObj.(*corev1.Pod)
	if old.ResourceVersion == cur.ResourceVersion {
		return // a resync: nothing changed
	}
	labelsChanged := !labels.Equals(old.Labels, cur.Labels)
	if cur.DeletionTimestamp != nil && old.DeletionTimestamp == nil {
		// Being deleted counts as deleted: the pod stops counting now,
		// and a replacement is made without waiting for the node.
		c.deletePod(cur)
		if labelsChanged {
			c.deletePod(old)
		}
		return
	}
	curRef, oldRef := metav1.GetControllerOfNoCopy(cur), metav1.GetControllerOfNoCopy(old)
	if oldRef != nil && (curRef == nil || oldRef.UID != curRef.UID) {
		if rs := c.ownerOf(old.Namespace, oldRef); rs != nil {
			c.queue.Enqueue(rs)
		}
	}
	if curRef != nil {
		rs := c.ownerOf(cur.Namespace, curRef)
		if rs == nil {
			return
		}
		c.queue.Enqueue(rs)
		// A pod that just became ready becomes available minReadySeconds
		// later, with no event to say so.
		if rs.Spec.MinReadySeconds > 0 && !kit.IsPodReady(old) && kit.IsPodReady(cur) {
			key, _ := kit.Key(rs)
			c.queue.AddAfter(key, time.Duration(rs.Spec.MinReadySeconds)*time.Second+time.Second)
		}
		return
	}
	if labelsChanged || oldRef != nil {
		for _, rs := range c.matching(cur) {
			c.queue.Enqueue(rs)
		}
	}
}

func (c *Controller) deletePod(obj any) {
	pod, ok := kit.Tombstone(obj).(*corev1.Pod)
	if !ok {
		return
	}
	rs := c.ownerOf(pod.Namespace, metav1.GetControllerOfNoCopy(pod))
	if rs == nil {
		return
	}
	key, _ := kit.Key(rs)
	c.exp.DeletionObserved(key, pod.UID)
	c.queue.Add(key)
}
