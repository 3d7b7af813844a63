// Package daemonset runs tether's DaemonSet controller: one pod on every
// eligible node (nodeSelector, required node affinity, and taints against
// the pod's tolerations plus those every daemon gets), added when a node
// joins or starts to qualify and removed when it stops. Pods are created
// pinned to their node by a matchFields metadata.name node affinity and
// placed by the scheduler. Template changes roll out node by node within
// maxUnavailable and maxSurge (RollingUpdate) or when the user deletes pods
// (OnDelete); each template is a ControllerRevision for kubectl rollout
// history and undo.
package daemonset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

var controllerKind = appsv1.SchemeGroupVersion.WithKind("DaemonSet")

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client reaches the hub with rights over daemonsets, pods, nodes
	// (read), controllerrevisions and events.
	Client kubernetes.Interface
	// Informers is the shared factory New registers its informers on.
	Informers informers.SharedInformerFactory
	// Workers is the number of DaemonSets synced at once; 0 means 2.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// BurstReplicas caps the pods created or deleted per sync; 0 means 250.
	BurstReplicas int
	// Now is the clock for minReadySeconds; nil means time.Now.
	Now func() time.Time
}

// Controller is the DaemonSet controller.
type Controller struct {
	client   kubernetes.Interface
	log      *slog.Logger
	workers  int
	burst    int
	now      func() time.Time
	sets     appslisters.DaemonSetLister
	nodes    corelisters.NodeLister
	podIndex cache.Indexer
	revIndex cache.Indexer
	synced   []cache.InformerSynced
	queue    *kit.Queue
	exp      *kit.Expectations
	recorder *kit.Recorder
	control  kit.PodControl
}

// New registers the controller's informers on cfg.Informers.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create daemonset controller: client and informers are required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.BurstReplicas <= 0 {
		cfg.BurstReplicas = 250
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger.With("controller", "daemonset")
	dsInf := cfg.Informers.Apps().V1().DaemonSets()
	podInf := cfg.Informers.Core().V1().Pods()
	nodeInf := cfg.Informers.Core().V1().Nodes()
	revInf := cfg.Informers.Apps().V1().ControllerRevisions()
	for _, inf := range []cache.SharedIndexInformer{podInf.Informer(), revInf.Informer()} {
		if err := kit.AddControllerIndex(inf); err != nil {
			return nil, fmt.Errorf("create daemonset controller: %w", err)
		}
	}
	rec := kit.NewRecorder(cfg.Client, "daemonset-controller", log)
	c := &Controller{
		client: cfg.Client, log: log, workers: cfg.Workers, burst: cfg.BurstReplicas, now: cfg.Now,
		sets: dsInf.Lister(), nodes: nodeInf.Lister(),
		podIndex: podInf.Informer().GetIndexer(), revIndex: revInf.Informer().GetIndexer(),
		synced: []cache.InformerSynced{dsInf.Informer().HasSynced, podInf.Informer().HasSynced,
			nodeInf.Informer().HasSynced, revInf.Informer().HasSynced},
		queue:    kit.NewQueue("daemonset"),
		exp:      kit.NewExpectations(0, cfg.Now),
		recorder: rec,
		control:  kit.PodControl{Client: cfg.Client, Recorder: rec},
	}
	if _, err := dsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.queue.Enqueue,
		UpdateFunc: func(_, cur any) { c.queue.Enqueue(cur) },
		DeleteFunc: func(obj any) {
			if key, ok := kit.Key(obj); ok {
				c.exp.Forget(key)
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("watch daemonsets: %w", err)
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			pod := obj.(*corev1.Pod)
			if pod.DeletionTimestamp != nil {
				c.podGone(pod)
				return
			}
			if ds := c.ownerOf(pod); ds != nil {
				key, _ := kit.Key(ds)
				c.exp.CreationObserved(key)
				c.queue.Add(key)
			}
		},
		UpdateFunc: func(oldObj, curObj any) {
			old, cur := oldObj.(*corev1.Pod), curObj.(*corev1.Pod)
			if old.ResourceVersion == cur.ResourceVersion {
				return
			}
			if cur.DeletionTimestamp != nil && old.DeletionTimestamp == nil {
				c.podGone(cur)
				return
			}
			if ds := c.ownerOf(cur); ds != nil {
				c.queue.Enqueue(ds)
				if ds.Spec.MinReadySeconds > 0 && !kit.IsPodReady(old) && kit.IsPodReady(cur) {
					key, _ := kit.Key(ds)
					c.queue.AddAfter(key, time.Duration(ds.Spec.MinReadySeconds)*time.Second+time.Second)
				}
			}
		},
		DeleteFunc: func(obj any) {
			if pod, ok := kit.Tombstone(obj).(*corev1.Pod); ok {
				c.podGone(pod)
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("watch pods: %w", err)
	}
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { c.enqueueAll() },
		UpdateFunc: func(oldObj, curObj any) {
			old, cur := oldObj.(*corev1.Node), curObj.(*corev1.Node)
			if nodeChanged(old, cur) {
				c.enqueueAll()
			}
		},
		DeleteFunc: func(any) { c.enqueueAll() },
	}); err != nil {
		return nil, fmt.Errorf("watch nodes: %w", err)
	}
	return c, nil
}

// nodeChanged reports a change that can alter which daemons a node runs;
// heartbeats and other status updates are ignored.
func nodeChanged(old, cur *corev1.Node) bool {
	return !labels.Equals(old.Labels, cur.Labels) ||
		!apiequality.Semantic.DeepEqual(old.Spec.Taints, cur.Spec.Taints) ||
		old.Spec.Unschedulable != cur.Spec.Unschedulable
}

// Run waits for the informers, then syncs DaemonSets until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.recorder.Start(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("daemonset controller running", "workers", c.workers)
	c.queue.Run(ctx, c.workers, c.log, c.sync)
	return nil
}

func (c *Controller) enqueueAll() {
	all, err := c.sets.List(labels.Everything())
	if err != nil {
		return
	}
	for _, ds := range all {
		c.queue.Enqueue(ds)
	}
}

func (c *Controller) ownerOf(pod *corev1.Pod) *appsv1.DaemonSet {
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil || ref.Kind != controllerKind.Kind {
		return nil
	}
	ds, err := c.sets.DaemonSets(pod.Namespace).Get(ref.Name)
	if err != nil || ds.UID != ref.UID {
		return nil
	}
	return ds
}

func (c *Controller) podGone(pod *corev1.Pod) {
	if ds := c.ownerOf(pod); ds != nil {
		key, _ := kit.Key(ds)
		c.exp.DeletionObserved(key, pod.UID)
		c.queue.Add(key)
	}
}
