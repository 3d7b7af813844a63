package podgc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Upstream's defaults.
const (
	// DefaultTerminatedPodThreshold is kube-controller-manager's
	// --terminated-pod-gc-threshold default.
	DefaultTerminatedPodThreshold = 12500
	// DefaultQuarantine is how long a node must stay absent before its
	// pods are taken as orphans.
	DefaultQuarantine = 40 * time.Second
	// DefaultPeriod is how often a full pass runs.
	DefaultPeriod = 20 * time.Second
)

// The condition an orphaned pod gets before it is deleted, as upstream.
const (
	ReasonDeletionByPodGC = "DeletionByPodGC"
	MessageNodeGone       = "PodGC: node no longer exists"
)

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client deletes pods and writes their status.
	Client kubernetes.Interface
	// Informers is the shared factory the controller registers its Pod
	// and Node informers on; New must be called before it starts.
	Informers informers.SharedInformerFactory
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// TerminatedPodThreshold is how many finished pods may exist before
	// the oldest are deleted (--terminated-pod-gc-threshold); zero means
	// DefaultTerminatedPodThreshold, negative turns that collection off.
	TerminatedPodThreshold int
	// Quarantine is how long a node must be absent before its pods are
	// deleted; zero means DefaultQuarantine.
	Quarantine time.Duration
	// Period is how often every pod is looked at; zero means
	// DefaultPeriod.
	Period time.Duration
}

// Controller deletes orphaned, unscheduled terminating and excess
// finished pods.
type Controller struct {
	cfg    Config
	log    *slog.Logger
	pods   corelisters.PodLister
	nodes  corelisters.NodeLister
	synced []cache.InformerSynced

	// quarantined holds the names of absent nodes; each comes out of the
	// queue once its quarantine is over.
	quarantined *kit.Queue

	mu      sync.Mutex      // guards waiting
	waiting map[string]bool // nodes in quarantine, so each is queued once
}

// New registers the controller's informers; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create pod garbage collector: client and informers are required")
	}
	if cfg.TerminatedPodThreshold == 0 {
		cfg.TerminatedPodThreshold = DefaultTerminatedPodThreshold
	}
	if cfg.Quarantine <= 0 {
		cfg.Quarantine = DefaultQuarantine
	}
	if cfg.Period <= 0 {
		cfg.Period = DefaultPeriod
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	podInf := cfg.Informers.Core().V1().Pods()
	nodeInf := cfg.Informers.Core().V1().Nodes()
	c := &Controller{
		cfg:   cfg,
		log:   log.With("controller", "pod-garbage-collector"),
		pods:  podInf.Lister(),
		nodes: nodeInf.Lister(),
		synced: []cache.InformerSynced{
			podInf.Informer().HasSynced, nodeInf.Informer().HasSynced,
		},
		quarantined: kit.NewQueue("podgc-nodes"),
		waiting:     map[string]bool{},
	}
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				c.quarantine(n.Name)
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("add node handler: %w", err)
	}
	return c, nil
}

// Run waits for the informers, then collects pods until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.quarantined.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("pod garbage collector running", "terminated_pod_threshold", c.cfg.TerminatedPodThreshold,
		"quarantine", c.cfg.Quarantine, "period", c.cfg.Period)
	var wg sync.WaitGroup
	wg.Go(func() { c.quarantined.Run(ctx, 1, c.log, c.collectQuarantined) })
	t := time.NewTicker(c.cfg.Period)
	defer t.Stop()
	for {
		c.pass(ctx)
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case <-t.C:
		}
	}
}

// quarantine starts the quarantine of an absent node, unless it is in one.
func (c *Controller) quarantine(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiting[node] {
		return
	}
	c.waiting[node] = true
	c.quarantined.AddAfter(node, c.cfg.Quarantine)
}

// pass runs one round of every collection.
func (c *Controller) pass(ctx context.Context) {
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		c.log.Warn("list pods", "err", err)
		return
	}
	if c.cfg.TerminatedPodThreshold > 0 {
		c.gcTerminated(ctx, pods)
	}
	c.gcTerminating(ctx, pods)
	c.gcOrphaned(pods)
	c.gcUnscheduledTerminating(ctx, pods)
}

// gcTerminating deletes the terminating pods of nodes that are not ready
// and carry the node.kubernetes.io/out-of-service taint: their kubelet is
// known to be gone for good, so nothing else will finish them.
func (c *Controller) gcTerminating(ctx context.Context, pods []*corev1.Pod) {
	var doomed []*corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp == nil || isTerminated(p) || p.Spec.NodeName == "" {
			continue
		}
		n, err := c.nodes.Get(p.Spec.NodeName)
		if err != nil || isNodeReady(n) || !hasTaint(n, corev1.TaintNodeOutOfService) {
			continue
		}
		doomed = append(doomed, p)
	}
	slices.SortStableFunc(doomed, func(a, b *corev1.Pod) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	for _, p := range doomed {
		c.log.Info("garbage collecting terminating pod of out-of-service node", "pod", p.Namespace+"/"+p.Name, "node", p.Spec.NodeName)
		if err := c.markAndDelete(ctx, p, nil); err != nil {
			c.log.Info("delete terminating pod", "pod", p.Namespace+"/"+p.Name, "err", err)
		}
	}
}

func isNodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func hasTaint(n *corev1.Node, key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
}

func isTerminated(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// gcTerminated deletes the oldest finished pods beyond the threshold.
func (c *Controller) gcTerminated(ctx context.Context, pods []*corev1.Pod) {
	var done []*corev1.Pod
	for _, p := range pods {
		if isTerminated(p) {
			done = append(done, p)
		}
	}
	excess := len(done) - c.cfg.TerminatedPodThreshold
	if excess <= 0 {
		return
	}
	slices.SortStableFunc(done, func(a, b *corev1.Pod) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	c.log.Info("garbage collecting terminated pods", "count", excess, "threshold", c.cfg.TerminatedPodThreshold)
	for _, p := range done[:excess] {
		if err := c.forceDelete(ctx, p); err != nil {
			c.log.Info("delete terminated pod", "pod", p.Namespace+"/"+p.Name, "err", err)
		}
	}
}

// gcOrphaned quarantines the absent nodes pods are bound to.
func (c *Controller) gcOrphaned(pods []*corev1.Pod) {
	for _, p := range pods {
		if p.Spec.NodeName == "" {
			continue
		}
		if _, err := c.nodes.Get(p.Spec.NodeName); apierrors.IsNotFound(err) {
			c.quarantine(p.Spec.NodeName)
		}
	}
}

// gcUnscheduledTerminating deletes terminating pods no node will finish.
func (c *Controller) gcUnscheduledTerminating(ctx context.Context, pods []*corev1.Pod) {
	for _, p := range pods {
		if p.DeletionTimestamp == nil || p.Spec.NodeName != "" {
			continue
		}
		c.log.Info("garbage collecting unscheduled terminating pod", "pod", p.Namespace+"/"+p.Name)
		if err := c.markAndDelete(ctx, p, nil); err != nil {
			c.log.Info("delete unscheduled terminating pod", "pod", p.Namespace+"/"+p.Name, "err", err)
		}
	}
}

// collectQuarantined deletes the pods of a node whose quarantine is over
// if the hub confirms it is gone. A failure starts a new quarantine.
func (c *Controller) collectQuarantined(ctx context.Context, node string) error {
	c.mu.Lock()
	delete(c.waiting, node)
	c.mu.Unlock()
	if err := c.collectNode(ctx, node); err != nil {
		c.log.Info("garbage collect pods of deleted node; retrying", "node", node, "err", err)
		c.quarantine(node)
	}
	return nil
}

// collectNode deletes the pods of node if the hub has no such node.
func (c *Controller) collectNode(ctx context.Context, node string) error {
	if _, err := c.nodes.Get(node); err == nil {
		return nil
	}
	_, err := c.cfg.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("get node: %w", err)
	}
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	var errs []error
	for _, p := range pods {
		if p.Spec.NodeName != node {
			continue
		}
		c.log.Info("garbage collecting orphaned pod", "pod", p.Namespace+"/"+p.Name, "node", node)
		cond := &corev1.PodCondition{
			Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: ReasonDeletionByPodGC, Message: MessageNodeGone,
			LastTransitionTime: metav1.Now(),
		}
		if err := c.markAndDelete(ctx, p, cond); err != nil {
			errs = append(errs, fmt.Errorf("delete pod %s/%s: %w", p.Namespace, p.Name, err))
		}
	}
	return errors.Join(errs...)
}

// markAndDelete sets an unfinished pod's phase to Failed, gives it cond
// if not nil, and deletes it with no grace period, as upstream's
// markFailedAndDeletePodWithCondition.
func (c *Controller) markAndDelete(ctx context.Context, p *corev1.Pod, cond *corev1.PodCondition) error {
	api := c.cfg.Client.CoreV1().Pods(p.Namespace)
	cur, err := api.Get(ctx, p.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get pod: %w", err)
	}
	if cur.UID != p.UID {
		return nil
	}
	u := cur.DeepCopy()
	if !isTerminated(u) {
		u.Status.Phase = corev1.PodFailed
	}
	if cond != nil {
		setCondition(u, *cond)
	}
	if u.Status.Phase != cur.Status.Phase || cond != nil {
		if _, err := api.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("mark pod failed: %w", err)
		}
	}
	return c.forceDelete(ctx, cur)
}

// setCondition sets cond on the pod, keeping its transition time when the
// status does not change.
func setCondition(p *corev1.Pod, cond corev1.PodCondition) {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type != cond.Type {
			continue
		}
		if p.Status.Conditions[i].Status == cond.Status {
			cond.LastTransitionTime = p.Status.Conditions[i].LastTransitionTime
		}
		p.Status.Conditions[i] = cond
		return
	}
	p.Status.Conditions = append(p.Status.Conditions, cond)
}

// forceDelete deletes a pod with no grace period.
func (c *Controller) forceDelete(ctx context.Context, p *corev1.Pod) error {
	err := c.cfg.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &p.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod: %w", err)
	}
	return nil
}
