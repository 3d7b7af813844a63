package autoscaling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	autoscalinglisters "k8s.io/client-go/listers/autoscaling/v2"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/scale"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	metricsclient "k8s.io/metrics/pkg/client/clientset/versioned"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Defaults of kube-controller-manager's --horizontal-pod-autoscaler-*
// flags.
const (
	DefaultSyncPeriod              = 15 * time.Second
	DefaultDownscaleStabilization  = 5 * time.Minute
	DefaultTolerance               = 0.1
	DefaultCPUInitializationPeriod = 5 * time.Minute
	DefaultInitialReadinessDelay   = 30 * time.Second
)

// Config configures the controller. Client and Informers are required,
// and one of Metrics and RestConfig.
type Config struct {
	// Client writes autoscaler status and events and discovers the
	// resources a target may be.
	Client kubernetes.Interface
	// Informers is the shared factory the controller registers its Pod,
	// Node and HorizontalPodAutoscaler informers on; New must be called
	// before it starts. The autoscaler informer is added once the hub
	// serves autoscaling/v2, and Run starts it.
	Informers informers.SharedInformerFactory
	// RestConfig reaches the hub's API as the controller; it builds the
	// metrics.k8s.io client when Metrics is nil.
	RestConfig *rest.Config
	// Metrics measures pods; nil means the metrics.k8s.io API.
	Metrics MetricsSource
	// Scales reads and writes /scale subresources; nil means client-go's
	// scale client over Client's discovery.
	Scales scale.ScalesGetter
	// Workers is the number of autoscalers synced at once; zero means 1.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// Clock is the time the algorithm sees; nil means the real clock.
	Clock clock.PassiveClock
	// SyncPeriod is how often each autoscaler is synced; zero means 15s.
	SyncPeriod time.Duration
	// DownscaleStabilization is the scale-down stabilization window of an
	// autoscaler that sets none; zero means five minutes.
	DownscaleStabilization time.Duration
	// Tolerance is how far the usage ratio must be from 1 to scale; zero
	// means 0.1.
	Tolerance float64
	// CPUInitializationPeriod is how long after a pod starts its CPU
	// samples may be left out; zero means five minutes.
	CPUInitializationPeriod time.Duration
	// InitialReadinessDelay is how long after a pod starts it may turn
	// unready without having been ready; zero means 30s.
	InitialReadinessDelay time.Duration
}

// Controller runs HorizontalPodAutoscalers.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	queue   *kit.Queue
	events  *kit.Recorder
	mapper  meta.ResettableRESTMapper
	scales  scale.ScalesGetter
	calc    *calculator
	history *history

	pods   corelisters.PodLister
	nodes  corelisters.NodeLister
	hpas   autoscalinglisters.HorizontalPodAutoscalerLister
	synced []cache.InformerSynced
}

// New registers the controller's Pod and Node informers; nothing runs
// until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create horizontal pod autoscaler controller: client and informers are required")
	}
	if cfg.Metrics == nil {
		if cfg.RestConfig == nil {
			return nil, errors.New("create horizontal pod autoscaler controller: a metrics source or a rest config is required")
		}
		mc, err := metricsclient.NewForConfig(cfg.RestConfig)
		if err != nil {
			return nil, fmt.Errorf("create metrics client: %w", err)
		}
		cfg.Metrics = APIMetrics{Client: mc}
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.SyncPeriod <= 0 {
		cfg.SyncPeriod = DefaultSyncPeriod
	}
	if cfg.DownscaleStabilization <= 0 {
		cfg.DownscaleStabilization = DefaultDownscaleStabilization
	}
	if cfg.Tolerance <= 0 {
		cfg.Tolerance = DefaultTolerance
	}
	if cfg.CPUInitializationPeriod <= 0 {
		cfg.CPUInitializationPeriod = DefaultCPUInitializationPeriod
	}
	if cfg.InitialReadinessDelay <= 0 {
		cfg.InitialReadinessDelay = DefaultInitialReadinessDelay
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	disc := cfg.Client.Discovery()
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	if cfg.Scales == nil {
		cfg.Scales = scale.New(disc.RESTClient(), mapper, dynamic.LegacyAPIPathResolverFunc, scale.NewDiscoveryScaleKindResolver(disc))
	}
	podInf, nodeInf := cfg.Informers.Core().V1().Pods(), cfg.Informers.Core().V1().Nodes()
	c := &Controller{
		cfg:     cfg,
		log:     log.With("controller", "horizontalpodautoscaling"),
		queue:   kit.NewQueue("horizontalpodautoscaler"),
		events:  kit.NewRecorder(cfg.Client, "horizontal-pod-autoscaler", log),
		mapper:  mapper,
		scales:  cfg.Scales,
		history: newHistory(),
		pods:    podInf.Lister(),
		nodes:   nodeInf.Lister(),
		synced:  []cache.InformerSynced{podInf.Informer().HasSynced, nodeInf.Informer().HasSynced},
	}
	c.calc = &calculator{
		metrics: cfg.Metrics, pods: c.pods, clock: cfg.Clock, tolerance: cfg.Tolerance,
		cpuInitialization: cfg.CPUInitializationPeriod, readinessDelay: cfg.InitialReadinessDelay,
	}
	return c, nil
}

// Run waits until the hub serves autoscaling/v2 HorizontalPodAutoscalers,
// watches them, and syncs each every SyncPeriod until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	if c.waitForAPI(ctx) != nil {
		return nil // ctx ended
	}
	inf := c.cfg.Informers.Autoscaling().V2().HorizontalPodAutoscalers()
	_, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.queue.Enqueue,
		UpdateFunc: c.updated,
		DeleteFunc: c.deleted,
	})
	if err != nil {
		return fmt.Errorf("add event handler: %w", err)
	}
	c.hpas = inf.Lister()
	c.cfg.Informers.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), append(c.synced, inf.Informer().HasSynced)...) {
		return nil
	}
	c.log.Info("horizontal pod autoscaler controller running", "syncPeriod", c.cfg.SyncPeriod)
	c.events.Start(ctx)
	c.queue.Run(ctx, c.cfg.Workers, c.log, c.sync)
	return nil
}

// waitForAPI polls discovery until autoscaling/v2 serves
// horizontalpodautoscalers, so a hub without them gets no failing watch.
func (c *Controller) waitForAPI(ctx context.Context) error {
	served := func(ctx context.Context) (bool, error) {
		list, err := c.cfg.Client.Discovery().ServerResourcesForGroupVersion("autoscaling/v2")
		if err != nil {
			return false, nil
		}
		for _, r := range list.APIResources {
			if r.Name == "horizontalpodautoscalers" {
				return true, nil
			}
		}
		return false, nil
	}
	return wait.PollUntilContextCancel(ctx, 10*time.Second, true, served)
}

// updated syncs an autoscaler at once when its spec changed; status
// writes, the controller's own included, wait for the next period.
func (c *Controller) updated(oldObj, newObj any) {
	o, ok1 := oldObj.(*autoscalingv2.HorizontalPodAutoscaler)
	n, ok2 := newObj.(*autoscalingv2.HorizontalPodAutoscaler)
	if ok1 && ok2 && apiequality.Semantic.DeepEqual(o.Spec, n.Spec) {
		return
	}
	c.queue.Enqueue(newObj)
}

func (c *Controller) deleted(obj any) {
	if key, ok := kit.Key(obj); ok {
		c.history.forget(key)
	}
}

// sync reconciles one autoscaler and schedules its next sync; a failure
// is retried at the next period too, as upstream does.
func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name := kit.SplitKey(key)
	hpa, err := c.hpas.HorizontalPodAutoscalers(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.history.forget(key)
		return nil
	}
	if err != nil {
		return fmt.Errorf("get autoscaler: %w", err)
	}
	if err := c.reconcile(ctx, hpa.DeepCopy(), key); err != nil {
		c.log.Debug("reconcile autoscaler", "key", key, "err", err)
	}
	return kit.RequeueAfter(c.cfg.SyncPeriod)
}

// reconcile is one pass of the algorithm over hpa, a copy it may change.
func (c *Controller) reconcile(ctx context.Context, hpa *autoscalingv2.HorizontalPodAutoscaler, key string) error {
	now := c.cfg.Clock.Now()
	original := hpa.Status.DeepCopy()
	ref := hpa.Spec.ScaleTargetRef
	reference := fmt.Sprintf("%s/%s/%s", ref.Kind, hpa.Namespace, ref.Name)

	sc, gr, err := c.getScale(ctx, hpa)
	if err != nil {
		c.events.Eventf(hpa, corev1.EventTypeWarning, "FailedGetScale", "%s", err.Error())
		setCondition(hpa, autoscalingv2.AbleToScale, corev1.ConditionFalse, "FailedGetScale", "the HPA controller was unable to get the target's current scale: %v", err)
		c.writeStatus(ctx, original, hpa)
		return fmt.Errorf("failed to query scale subresource for %s: %w", reference, err)
	}
	setCondition(hpa, autoscalingv2.AbleToScale, corev1.ConditionTrue, "SucceededGetScale", "the HPA controller was able to get the target's current scale")
	current := sc.Spec.Replicas
	c.history.initial(key, current, now)

	minReplicas := int32(1)
	if hpa.Spec.MinReplicas != nil {
		minReplicas = *hpa.Spec.MinReplicas
	}
	var (
		desired  int32
		reason   string
		statuses []autoscalingv2.MetricStatus
		retErr   error
	)
	rescale := true
	switch {
	case current == 0 && minReplicas != 0:
		desired, rescale = 0, false
		setCondition(hpa, autoscalingv2.ScalingActive, corev1.ConditionFalse, "ScalingDisabled", "scaling is disabled since the replica count of the target is zero")
	case current > hpa.Spec.MaxReplicas:
		reason, desired = "Current number of replicas above Spec.MaxReplicas", hpa.Spec.MaxReplicas
	case current < minReplicas:
		reason, desired = "Current number of replicas below Spec.MinReplicas", minReplicas
	default:
		selector, err := c.parseSelector(hpa, sc.Status.Selector)
		if err != nil {
			c.setCurrent(hpa, current, nil)
			c.writeStatus(ctx, original, hpa)
			c.events.Eventf(hpa, corev1.EventTypeWarning, "FailedComputeMetricsReplicas", "%s", err.Error())
			return fmt.Errorf("failed to compute desired number of replicas based on listed metrics for %s: %w", reference, err)
		}
		if held, msg := c.unreachable(hpa.Namespace, selector, current); held {
			// The pods' samples are missing because the hub cannot
			// hear their nodes, not because they idle: keep the
			// scale, and the metrics last seen, until they are back.
			setCondition(hpa, autoscalingv2.ScalingActive, corev1.ConditionFalse, ReasonNodesUnreachable, "%s", msg)
			c.events.Eventf(hpa, corev1.EventTypeWarning, ReasonNodesUnreachable, "%s", msg)
			c.setCurrent(hpa, current, hpa.Status.CurrentMetrics)
			hpa.Status.DesiredReplicas = current
			c.writeStatus(ctx, original, hpa)
			return nil
		}
		proposed, metric, st, err := c.computeReplicasForMetrics(ctx, hpa, sc, selector)
		statuses = st
		if err != nil && proposed == -1 {
			c.setCurrent(hpa, current, statuses)
			c.writeStatus(ctx, original, hpa)
			c.events.Eventf(hpa, corev1.EventTypeWarning, "FailedComputeMetricsReplicas", "%s", err.Error())
			return fmt.Errorf("failed to compute desired number of replicas based on listed metrics for %s: %w", reference, err)
		}
		retErr = err // some metrics failed; scale on the others
		desired = proposed
		if desired > current {
			reason = fmt.Sprintf("%s above target", metric)
		}
		if desired < current {
			reason = "All metrics below target"
		}
		desired = c.normalize(hpa, key, current, desired, minReplicas, now)
		rescale = desired != current
	}

	if rescale {
		sc.Spec.Replicas = desired
		if _, err := c.scales.Scales(hpa.Namespace).Update(ctx, gr, sc, metav1.UpdateOptions{}); err != nil {
			c.events.Eventf(hpa, corev1.EventTypeWarning, "FailedRescale", "New size: %d; reason: %s; error: %v", desired, reason, err.Error())
			setCondition(hpa, autoscalingv2.AbleToScale, corev1.ConditionFalse, "FailedUpdateScale", "the HPA controller was unable to update the target scale: %v", err)
			c.setCurrent(hpa, current, statuses)
			c.writeStatus(ctx, original, hpa)
			return fmt.Errorf("failed to rescale %s: %w", reference, err)
		}
		setCondition(hpa, autoscalingv2.AbleToScale, corev1.ConditionTrue, "SucceededRescale", "the HPA controller was able to update the target scale to %d", desired)
		c.events.Eventf(hpa, corev1.EventTypeNormal, "SuccessfulRescale", "New size: %d; reason: %s", desired, reason)
		if hpa.Spec.Behavior != nil {
			c.history.storeScale(key, withDefaults(hpa.Spec.Behavior, c.cfg.DownscaleStabilization), current, desired, now)
		}
		c.log.Info("rescaled", "hpa", key, "from", current, "to", desired, "reason", reason)
	} else {
		desired = current
	}
	hpa.Status = autoscalingv2.HorizontalPodAutoscalerStatus{
		ObservedGeneration: hpa.Status.ObservedGeneration,
		CurrentReplicas:    current,
		DesiredReplicas:    desired,
		LastScaleTime:      hpa.Status.LastScaleTime,
		CurrentMetrics:     statuses,
		Conditions:         hpa.Status.Conditions,
	}
	if rescale {
		t := metav1.NewTime(now)
		hpa.Status.LastScaleTime = &t
	}
	if err := c.writeStatus(ctx, original, hpa); err != nil {
		return err
	}
	return retErr
}

// getScale reads the target's /scale through each REST mapping of its
// kind until one answers.
func (c *Controller) getScale(ctx context.Context, hpa *autoscalingv2.HorizontalPodAutoscaler) (*autoscalingv1.Scale, schema.GroupResource, error) {
	ref := hpa.Spec.ScaleTargetRef
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return nil, schema.GroupResource{}, err
	}
	mappings, err := c.mapper.RESTMappings(schema.GroupKind{Group: gv.Group, Kind: ref.Kind})
	if err != nil {
		// A kind served since the mapper last looked (a new custom
		// resource) is found on the next sync.
		c.mapper.Reset()
		return nil, schema.GroupResource{}, err
	}
	var first error
	for i, m := range mappings {
		gr := m.Resource.GroupResource()
		sc, err := c.scales.Scales(hpa.Namespace).Get(ctx, gr, ref.Name, metav1.GetOptions{})
		if err == nil {
			return sc, gr, nil
		}
		if i == 0 {
			first = err
		}
	}
	if first == nil {
		first = errors.New("unrecognized resource")
	}
	return nil, schema.GroupResource{}, first
}

// setCurrent records the current replicas and metrics, keeping the
// desired count, as a failed pass does.
func (c *Controller) setCurrent(hpa *autoscalingv2.HorizontalPodAutoscaler, current int32, metrics []autoscalingv2.MetricStatus) {
	hpa.Status.CurrentReplicas = current
	hpa.Status.CurrentMetrics = metrics
}

// writeStatus writes hpa's status if it changed.
func (c *Controller) writeStatus(ctx context.Context, original *autoscalingv2.HorizontalPodAutoscalerStatus, hpa *autoscalingv2.HorizontalPodAutoscaler) error {
	if apiequality.Semantic.DeepEqual(original, &hpa.Status) {
		return nil
	}
	if _, err := c.cfg.Client.AutoscalingV2().HorizontalPodAutoscalers(hpa.Namespace).UpdateStatus(ctx, hpa, metav1.UpdateOptions{}); err != nil {
		c.events.Eventf(hpa, corev1.EventTypeWarning, "FailedUpdateStatus", "%s", err.Error())
		return fmt.Errorf("failed to update status for %s: %w", hpa.Name, err)
	}
	return nil
}
