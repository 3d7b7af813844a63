// Package deployment runs tether's Deployment controller. A Deployment owns
// ReplicaSets named <deployment>-<pod-template-hash>, one per pod template
// it has had; the controller moves pods from the old ones to the new one
// with the RollingUpdate (bounded by maxSurge and maxUnavailable) or
// Recreate strategy, numbers the ReplicaSets as revisions so kubectl
// rollout history and undo work, keeps revisionHistoryLimit old ones,
// spreads scaling during a rollout proportionally, and reports progress in
// status and the Progressing and Available conditions that kubectl rollout
// status reads.
//
// The pods themselves are the ReplicaSet controller's business: this
// controller only sets ReplicaSet sizes and reads their status.
package deployment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

var controllerKind = appsv1.SchemeGroupVersion.WithKind("Deployment")

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client reaches the hub with rights over deployments, replicasets,
	// pods (read) and events.
	Client kubernetes.Interface
	// Informers is the shared factory New registers its informers on.
	Informers informers.SharedInformerFactory
	// Workers is the number of Deployments synced at once; 0 means 5.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock for progress deadlines; nil means time.Now.
	Now func() time.Time
}

// Controller is the Deployment controller.
type Controller struct {
	client   kubernetes.Interface
	log      *slog.Logger
	workers  int
	now      func() time.Time
	dLister  appslisters.DeploymentLister
	rsLister appslisters.ReplicaSetLister
	rsIndex  cache.Indexer
	podIndex cache.Indexer
	synced   []cache.InformerSynced
	queue    *kit.Queue
	recorder *kit.Recorder
}

// New registers the controller's informers on cfg.Informers.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create deployment controller: client and informers are required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 5
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger.With("controller", "deployment")
	dInf := cfg.Informers.Apps().V1().Deployments()
	rsInf := cfg.Informers.Apps().V1().ReplicaSets()
	podInf := cfg.Informers.Core().V1().Pods()
	for _, inf := range []cache.SharedIndexInformer{rsInf.Informer(), podInf.Informer()} {
		if err := kit.AddControllerIndex(inf); err != nil {
			return nil, fmt.Errorf("create deployment controller: %w", err)
		}
	}
	c := &Controller{
		client: cfg.Client, log: log, workers: cfg.Workers, now: cfg.Now,
		dLister: dInf.Lister(), rsLister: rsInf.Lister(), rsIndex: rsInf.Informer().GetIndexer(),
		podIndex: podInf.Informer().GetIndexer(),
		synced:   []cache.InformerSynced{dInf.Informer().HasSynced, rsInf.Informer().HasSynced, podInf.Informer().HasSynced},
		queue:    kit.NewQueue("deployment"),
		recorder: kit.NewRecorder(cfg.Client, "deployment-controller", log),
	}
	if _, err := dInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.queue.Enqueue,
		UpdateFunc: func(_, cur any) { c.queue.Enqueue(cur) },
		DeleteFunc: c.queue.Enqueue,
	}); err != nil {
		return nil, fmt.Errorf("watch deployments: %w", err)
	}
	if _, err := rsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.addRS,
		UpdateFunc: c.updateRS,
		DeleteFunc: c.deleteRS,
	}); err != nil {
		return nil, fmt.Errorf("watch replicasets: %w", err)
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: c.deletePod,
	}); err != nil {
		return nil, fmt.Errorf("watch pods: %w", err)
	}
	return c, nil
}

// Run waits for the informers, then syncs Deployments until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.recorder.Start(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("deployment controller running", "workers", c.workers)
	c.queue.Run(ctx, c.workers, c.log, c.sync)
	return nil
}

func (c *Controller) ownerOf(ns string, ref *metav1.OwnerReference) *appsv1.Deployment {
	if ref == nil || ref.Kind != controllerKind.Kind {
		return nil
	}
	d, err := c.dLister.Deployments(ns).Get(ref.Name)
	if err != nil || d.UID != ref.UID {
		return nil
	}
	return d
}

// matching returns the Deployments whose selector matches an orphan
// ReplicaSet's labels.
func (c *Controller) matching(rs *appsv1.ReplicaSet) []*appsv1.Deployment {
	all, err := c.dLister.Deployments(rs.Namespace).List(labels.Everything())
	if err != nil {
		return nil
	}
	var out []*appsv1.Deployment
	for _, d := range all {
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(rs.Labels)) {
			continue
		}
		out = append(out, d)
	}
	return out
}

func (c *Controller) addRS(obj any) {
	rs := obj.(*appsv1.ReplicaSet)
	if ref := metav1.GetControllerOfNoCopy(rs); ref != nil {
		if d := c.ownerOf(rs.Namespace, ref); d != nil {
			c.queue.Enqueue(d)
		}
		return
	}
	for _, d := range c.matching(rs) {
		c.queue.Enqueue(d)
	}
}

func (c *Controller) updateRS(oldObj, curObj any) {
	old, cur := oldObj.(*appsv1.ReplicaSet), curObj.(*appsv1.ReplicaSet)
	if old.ResourceVersion == cur.ResourceVersion {
		return
	}
	curRef, oldRef := metav1.GetControllerOfNoCopy(cur), metav1.GetControllerOfNoCopy(old)
	if oldRef != nil && (curRef == nil || curRef.UID != oldRef.UID) {
		if d := c.ownerOf(old.Namespace, oldRef); d != nil {
			c.queue.Enqueue(d)
		}
	}
	if curRef != nil {
		if d := c.ownerOf(cur.Namespace, curRef); d != nil {
			c.queue.Enqueue(d)
		}
		return
	}
	if !labels.Equals(old.Labels, cur.Labels) || oldRef != nil {
		for _, d := range c.matching(cur) {
			c.queue.Enqueue(d)
		}
	}
}

func (c *Controller) deleteRS(obj any) {
	rs, ok := kit.Tombstone(obj).(*appsv1.ReplicaSet)
	if !ok {
		return
	}
	if d := c.ownerOf(rs.Namespace, metav1.GetControllerOfNoCopy(rs)); d != nil {
		c.queue.Enqueue(d)
	}
}

// deletePod wakes a Recreate Deployment when an old pod is finally gone:
// nothing else changes then, as the pod stopped counting in its
// ReplicaSet's status when its deletion began.
func (c *Controller) deletePod(obj any) {
	pod, ok := kit.Tombstone(obj).(*corev1.Pod)
	if !ok {
		return
	}
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil || ref.Kind != "ReplicaSet" {
		return
	}
	rs, err := c.rsLister.ReplicaSets(pod.Namespace).Get(ref.Name)
	if err != nil || rs.UID != ref.UID {
		return
	}
	d := c.ownerOf(rs.Namespace, metav1.GetControllerOfNoCopy(rs))
	if d != nil && d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		c.queue.Enqueue(d)
	}
}
