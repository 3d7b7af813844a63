package disruption

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client writes budget status and reads /scale subresources.
	Client kubernetes.Interface
	// Informers is the shared factory the controller registers its
	// PodDisruptionBudget, Pod, ReplicaSet, Deployment and StatefulSet
	// informers on; New must be called before it starts.
	Informers informers.SharedInformerFactory
	// Workers is the number of budgets synced at once; zero means 2.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// Clock decides when disruptedPods entries expire; nil means the real
	// clock.
	Clock clock.PassiveClock
}

// Controller keeps PodDisruptionBudget status.
type Controller struct {
	cfg    Config
	log    *slog.Logger
	queue  *kit.Queue
	events *kit.Recorder
	mapper meta.ResettableRESTMapper

	pdbs   policylisters.PodDisruptionBudgetLister
	pods   corelisters.PodLister
	rss    appslisters.ReplicaSetLister
	deps   appslisters.DeploymentLister
	stss   appslisters.StatefulSetLister
	synced []cache.InformerSynced
}

// New registers the controller's informers; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create disruption controller: client and informers are required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{
		cfg:    cfg,
		log:    log.With("controller", "disruption"),
		queue:  kit.NewQueue("disruption"),
		events: kit.NewRecorder(cfg.Client, "controllermanager", log),
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cfg.Client.Discovery())),
	}
	f := cfg.Informers
	pdbInf := f.Policy().V1().PodDisruptionBudgets()
	podInf := f.Core().V1().Pods()
	rsInf, depInf, stsInf := f.Apps().V1().ReplicaSets(), f.Apps().V1().Deployments(), f.Apps().V1().StatefulSets()
	c.pdbs, c.pods = pdbInf.Lister(), podInf.Lister()
	c.rss, c.deps, c.stss = rsInf.Lister(), depInf.Lister(), stsInf.Lister()
	c.synced = []cache.InformerSynced{
		pdbInf.Informer().HasSynced, podInf.Informer().HasSynced, rsInf.Informer().HasSynced,
		depInf.Informer().HasSynced, stsInf.Informer().HasSynced,
	}
	add := func(inf cache.SharedIndexInformer, h cache.ResourceEventHandler) error {
		_, err := inf.AddEventHandler(h)
		return err
	}
	podHandler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.podChanged(nil, o) },
		UpdateFunc: c.podChanged,
		DeleteFunc: func(o any) { c.podChanged(nil, o) },
	}
	// A workload's scale change concerns the budgets of its namespace.
	scaleHandler := cache.ResourceEventHandlerFuncs{
		AddFunc:    c.namespaceChanged,
		UpdateFunc: func(_, n any) { c.namespaceChanged(n) },
		DeleteFunc: c.namespaceChanged,
	}
	errs := []error{
		add(pdbInf.Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: c.queue.Enqueue, UpdateFunc: func(_, n any) { c.queue.Enqueue(n) },
		}),
		add(podInf.Informer(), podHandler),
		add(rsInf.Informer(), scaleHandler), add(depInf.Informer(), scaleHandler),
		add(stsInf.Informer(), scaleHandler),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("add event handlers: %w", err)
	}
	return c, nil
}

// Run waits for the informers, then keeps budgets' status until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("disruption controller running")
	c.events.Start(ctx)
	c.queue.Run(ctx, c.cfg.Workers, c.log, c.sync)
	return nil
}

func (c *Controller) podChanged(oldObj, obj any) {
	p, ok := kit.Tombstone(obj).(*corev1.Pod)
	if !ok {
		return
	}
	sets := []labels.Set{p.Labels}
	if o, ok := oldObj.(*corev1.Pod); ok {
		sets = append(sets, o.Labels)
	}
	pdbs, err := c.pdbs.PodDisruptionBudgets(p.Namespace).List(labels.Everything())
	if err != nil {
		return
	}
	for _, pdb := range pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			continue
		}
		for _, s := range sets {
			if sel.Matches(s) {
				c.queue.Add(pdb.Namespace + "/" + pdb.Name)
				break
			}
		}
	}
}

func (c *Controller) namespaceChanged(obj any) {
	m, ok := kit.Tombstone(obj).(metav1.Object)
	if !ok {
		return
	}
	pdbs, err := c.pdbs.PodDisruptionBudgets(m.GetNamespace()).List(labels.Everything())
	if err != nil {
		return
	}
	for _, pdb := range pdbs {
		c.queue.Add(pdb.Namespace + "/" + pdb.Name)
	}
}

func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name := kit.SplitKey(key)
	cached, err := c.pdbs.PodDisruptionBudgets(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get budget: %w", err)
	}
	pdb := cached.DeepCopy()
	now := c.cfg.Clock.Now()

	pods, err := c.matchingPods(pdb)
	if err == nil && NeedsScale(pdb.Spec) {
		var expected int32
		expected, err = c.expectedScale(ctx, pdb, pods)
		if err == nil {
			c.setStatus(pdb, pods, expected, now)
		}
	} else if err == nil {
		c.setStatus(pdb, pods, 0, now)
	}
	if err != nil {
		// The budget cannot be computed: allow nothing.
		c.events.Eventf(pdb, corev1.EventTypeWarning, "CalculateExpectedPodCountFailed", "Failed to calculate the number of expected pods: %v", err)
		pdb.Status.DisruptionsAllowed = 0
		pdb.Status.ObservedGeneration = pdb.Generation
		meta.SetStatusCondition(&pdb.Status.Conditions, metav1.Condition{
			Type: policyv1.DisruptionAllowedCondition, Status: metav1.ConditionFalse,
			Reason: policyv1.SyncFailedReason, Message: err.Error(), ObservedGeneration: pdb.Generation,
		})
	}
	if !apiequality.Semantic.DeepEqual(pdb.Status, cached.Status) {
		if _, uerr := c.cfg.Client.PolicyV1().PodDisruptionBudgets(ns).UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); uerr != nil {
			return fmt.Errorf("update budget status: %w", uerr)
		}
	}
	return err
}

func (c *Controller) matchingPods(pdb *policyv1.PodDisruptionBudget) ([]*corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("parse selector: %w", err)
	}
	pods, err := c.pods.Pods(pdb.Namespace).List(sel)
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	return pods, nil
}

// setStatus fills the budget's status from its pods.
func (c *Controller) setStatus(pdb *policyv1.PodDisruptionBudget, pods []*corev1.Pod, expected int32, now time.Time) {
	disrupted, recheck := keptDisruptions(pdb.Status.DisruptedPods, pods, now)
	var healthy int32
	for _, p := range pods {
		if _, ok := disrupted[p.Name]; ok {
			continue
		}
		if isHealthy(p) {
			healthy++
		}
	}
	counts := Compute(pdb.Spec, healthy, int32(len(pods)), expected)
	st := &pdb.Status
	st.ExpectedPods, st.DesiredHealthy, st.CurrentHealthy, st.DisruptionsAllowed = counts.Expected, counts.DesiredHealthy, counts.CurrentHealthy, counts.DisruptionsAllowed
	st.ObservedGeneration = pdb.Generation
	st.DisruptedPods = disrupted
	cond := metav1.Condition{Type: policyv1.DisruptionAllowedCondition, ObservedGeneration: pdb.Generation}
	if counts.DisruptionsAllowed > 0 {
		cond.Status, cond.Reason = metav1.ConditionTrue, policyv1.SufficientPodsReason
	} else {
		cond.Status, cond.Reason = metav1.ConditionFalse, policyv1.InsufficientPodsReason
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	if !recheck.IsZero() {
		c.queue.AddAfter(pdb.Namespace+"/"+pdb.Name, recheck.Sub(now))
	}
}

// keptDisruptions returns the disruptedPods entries still in force: pods
// the eviction API let go that are not yet being deleted, for at most
// DeletionTimeout. It also returns when the next one expires.
func keptDisruptions(in map[string]metav1.Time, pods []*corev1.Pod, now time.Time) (map[string]metav1.Time, time.Time) {
	if len(in) == 0 {
		return nil, time.Time{}
	}
	byName := make(map[string]*corev1.Pod, len(pods))
	for _, p := range pods {
		byName[p.Name] = p
	}
	out := map[string]metav1.Time{}
	var next time.Time
	for name, t := range in {
		p, ok := byName[name]
		if !ok || p.DeletionTimestamp != nil {
			continue
		}
		exp := t.Add(DeletionTimeout)
		if !now.Before(exp) {
			continue
		}
		out[name] = t
		if next.IsZero() || exp.Before(next) {
			next = exp
		}
	}
	if len(out) == 0 {
		return nil, next
	}
	return out, next
}

// controllerKey identifies a pod's controller.
type controllerKey struct {
	apiVersion, kind, name string
	uid                    types.UID
}

// expectedScale sums the scale of the controllers of the budget's pods.
func (c *Controller) expectedScale(ctx context.Context, pdb *policyv1.PodDisruptionBudget, pods []*corev1.Pod) (int32, error) {
	seen := map[types.UID]bool{}
	var total int32
	var unmanaged []string
	for _, p := range pods {
		ref := metav1.GetControllerOf(p)
		if ref == nil {
			unmanaged = append(unmanaged, p.Name)
			continue
		}
		top, scale, err := c.scaleOf(ctx, p.Namespace, controllerKey{ref.APIVersion, ref.Kind, ref.Name, ref.UID})
		if err != nil {
			return 0, fmt.Errorf("find the scale of pod %s's controller: %w", p.Name, err)
		}
		if seen[top] {
			continue
		}
		seen[top] = true
		total += scale
	}
	if len(unmanaged) > 0 {
		c.events.Eventf(pdb, corev1.EventTypeWarning, "UnmanagedPods",
			"Pods selected by this PodDisruptionBudget (selector: %v) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value.",
			metav1.FormatLabelSelector(pdb.Spec.Selector))
	}
	return total, nil
}

// scaleOf returns the UID and wanted replicas of the workload at the top of
// a controller chain: a ReplicaSet's Deployment when it has one.
func (c *Controller) scaleOf(ctx context.Context, ns string, k controllerKey) (types.UID, int32, error) {
	replicas := func(r *int32) int32 {
		if r == nil {
			return 1
		}
		return *r
	}
	check := func(uid types.UID) error {
		if uid != k.uid {
			return fmt.Errorf("%s %s was replaced", k.kind, k.name)
		}
		return nil
	}
	switch k.apiVersion + "/" + k.kind {
	case "apps/v1/ReplicaSet":
		rs, err := c.rss.ReplicaSets(ns).Get(k.name)
		if err != nil {
			return "", 0, fmt.Errorf("get replicaset: %w", err)
		}
		if err := check(rs.UID); err != nil {
			return "", 0, err
		}
		if ref := metav1.GetControllerOf(rs); ref != nil && ref.Kind == "Deployment" {
			return c.scaleOf(ctx, ns, controllerKey{ref.APIVersion, ref.Kind, ref.Name, ref.UID})
		}
		return rs.UID, replicas(rs.Spec.Replicas), nil
	case "apps/v1/Deployment":
		d, err := c.deps.Deployments(ns).Get(k.name)
		if err != nil {
			return "", 0, fmt.Errorf("get deployment: %w", err)
		}
		return d.UID, replicas(d.Spec.Replicas), check(d.UID)
	case "apps/v1/StatefulSet":
		s, err := c.stss.StatefulSets(ns).Get(k.name)
		if err != nil {
			return "", 0, fmt.Errorf("get statefulset: %w", err)
		}
		return s.UID, replicas(s.Spec.Replicas), check(s.UID)
	}
	return c.genericScale(ctx, ns, k)
}

// genericScale reads the /scale subresource of any other controller kind.
func (c *Controller) genericScale(ctx context.Context, ns string, k controllerKey) (types.UID, int32, error) {
	gv, err := schema.ParseGroupVersion(k.apiVersion)
	if err != nil {
		return "", 0, fmt.Errorf("parse apiVersion: %w", err)
	}
	m, err := c.mapper.RESTMapping(gv.WithKind(k.kind).GroupKind(), gv.Version)
	if err != nil {
		c.mapper.Reset()
		return "", 0, fmt.Errorf("map %s: %w", k.kind, err)
	}
	path := []string{"/apis", gv.Group, gv.Version}
	if gv.Group == "" {
		path = []string{"/api", gv.Version}
	}
	path = append(path, "namespaces", ns, m.Resource.Resource, k.name, "scale")
	raw, err := c.cfg.Client.Discovery().RESTClient().Get().AbsPath(strings.Join(path, "/")).DoRaw(ctx)
	if err != nil {
		return "", 0, fmt.Errorf("get scale of %s %s: %w", k.kind, k.name, err)
	}
	var s autoscalingv1.Scale
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", 0, fmt.Errorf("decode scale: %w", err)
	}
	if s.UID != "" && s.UID != k.uid {
		return "", 0, fmt.Errorf("%s %s was replaced", k.kind, k.name)
	}
	return k.uid, s.Spec.Replicas, nil
}
