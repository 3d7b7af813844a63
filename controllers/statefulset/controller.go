// Package statefulset runs tether's StatefulSet controller: pods with
// stable ordinal names (<set>-0 … <set>-N-1), stable hostnames under the
// governing Service, and one PersistentVolumeClaim per volumeClaimTemplate
// and ordinal that outlives its pod. Pods are created in order and removed
// in reverse (OrderedReady) or all at once (Parallel); template changes
// roll out from the highest ordinal down to the partition, at most
// maxUnavailable at a time (RollingUpdate), or when the user deletes pods
// (OnDelete). Each template is kept as a ControllerRevision, so kubectl
// rollout history and undo work.
package statefulset

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
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

var controllerKind = appsv1.SchemeGroupVersion.WithKind("StatefulSet")

// Labels the controller puts on each pod.
const (
	PodNameLabel  = appsv1.StatefulSetPodNameLabel // statefulset.kubernetes.io/pod-name
	PodIndexLabel = appsv1.PodIndexLabel           // apps.kubernetes.io/pod-index
)

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client reaches the hub with rights over statefulsets, pods,
	// persistentvolumeclaims, controllerrevisions and events.
	Client kubernetes.Interface
	// Informers is the shared factory New registers its informers on.
	Informers informers.SharedInformerFactory
	// Workers is the number of StatefulSets synced at once; 0 means 5.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock for minReadySeconds; nil means time.Now.
	Now func() time.Time
}

// Controller is the StatefulSet controller.
type Controller struct {
	client   kubernetes.Interface
	log      *slog.Logger
	workers  int
	now      func() time.Time
	sets     appslisters.StatefulSetLister
	podIndex cache.Indexer
	revIndex cache.Indexer
	claims   corelisters.PersistentVolumeClaimLister
	synced   []cache.InformerSynced
	queue    *kit.Queue
	recorder *kit.Recorder
}

// New registers the controller's informers on cfg.Informers.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create statefulset controller: client and informers are required")
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
	log := cfg.Logger.With("controller", "statefulset")
	setInf := cfg.Informers.Apps().V1().StatefulSets()
	podInf := cfg.Informers.Core().V1().Pods()
	revInf := cfg.Informers.Apps().V1().ControllerRevisions()
	pvcInf := cfg.Informers.Core().V1().PersistentVolumeClaims()
	for _, inf := range []cache.SharedIndexInformer{podInf.Informer(), revInf.Informer()} {
		if err := kit.AddControllerIndex(inf); err != nil {
			return nil, fmt.Errorf("create statefulset controller: %w", err)
		}
	}
	c := &Controller{
		client: cfg.Client, log: log, workers: cfg.Workers, now: cfg.Now,
		sets: setInf.Lister(), podIndex: podInf.Informer().GetIndexer(), revIndex: revInf.Informer().GetIndexer(),
		claims: pvcInf.Lister(),
		synced: []cache.InformerSynced{setInf.Informer().HasSynced, podInf.Informer().HasSynced,
			revInf.Informer().HasSynced, pvcInf.Informer().HasSynced},
		queue:    kit.NewQueue("statefulset"),
		recorder: kit.NewRecorder(cfg.Client, "statefulset-controller", log),
	}
	if _, err := setInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.queue.Enqueue,
		UpdateFunc: func(_, cur any) { c.queue.Enqueue(cur) },
		DeleteFunc: c.queue.Enqueue,
	}); err != nil {
		return nil, fmt.Errorf("watch statefulsets: %w", err)
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.podChanged,
		UpdateFunc: func(old, cur any) {
			if old.(*corev1.Pod).ResourceVersion != cur.(*corev1.Pod).ResourceVersion {
				c.podChanged(old)
				c.podChanged(cur)
			}
		},
		DeleteFunc: c.podChanged,
	}); err != nil {
		return nil, fmt.Errorf("watch pods: %w", err)
	}
	return c, nil
}

// Run waits for the informers, then syncs StatefulSets until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.recorder.Start(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("statefulset controller running", "workers", c.workers)
	c.queue.Run(ctx, c.workers, c.log, c.sync)
	return nil
}

// podChanged queues the set controlling a pod, or for an orphan every set
// whose selector matches it.
func (c *Controller) podChanged(obj any) {
	pod, ok := kit.Tombstone(obj).(*corev1.Pod)
	if !ok {
		return
	}
	if ref := metav1.GetControllerOfNoCopy(pod); ref != nil {
		if ref.Kind != controllerKind.Kind {
			return
		}
		set, err := c.sets.StatefulSets(pod.Namespace).Get(ref.Name)
		if err == nil && set.UID == ref.UID {
			c.queue.Enqueue(set)
		}
		return
	}
	all, err := c.sets.StatefulSets(pod.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	for _, set := range all {
		sel, err := metav1.LabelSelectorAsSelector(set.Spec.Selector)
		if err == nil && !sel.Empty() && sel.Matches(labels.Set(pod.Labels)) {
			c.queue.Enqueue(set)
		}
	}
}
