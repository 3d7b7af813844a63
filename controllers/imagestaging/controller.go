package imagestaging

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/internal/fleetapi"
)

// Name is the controller's name in --controllers.
const Name = "imagestaging"

// windowCheck is how often a staging with a window and nodes left is
// looked at again, so that its phase follows the window.
const windowCheck = time.Minute

// Config configures the controller. Informers and RestConfig are
// required.
type Config struct {
	// Informers are the shared informers; the controller reads Nodes.
	Informers informers.SharedInformerFactory
	// RestConfig reaches the API as the controller: it watches
	// ImageStagings and writes their status.
	RestConfig *rest.Config
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// Clock is the controller's time; nil means the real clock.
	Clock clock.WithTicker
	// ResyncPeriod is how often the ImageStaging informer replays its
	// cache; zero means 10 minutes.
	ResyncPeriod time.Duration
}

// Controller writes ImageStagings' status.
type Controller struct {
	cfg      Config
	log      *slog.Logger
	clock    clock.WithTicker
	queue    *kit.Queue
	dyn      dynamic.Interface
	dynInf   dynamicinformer.DynamicSharedInformerFactory
	stagings cache.GenericLister
	nodes    corelisters.NodeLister
	synced   []cache.InformerSynced
}

// New registers the controller's informers; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Informers == nil || cfg.RestConfig == nil {
		return nil, errors.New("create imagestaging controller: informers and rest config are required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ResyncPeriod <= 0 {
		cfg.ResyncPeriod = 10 * time.Minute
	}
	dyn, err := dynamic.NewForConfig(cfg.RestConfig)
	if err != nil {
		return nil, fmt.Errorf("create imagestaging controller: %w", err)
	}
	c := &Controller{
		cfg:    cfg,
		log:    log,
		clock:  cfg.Clock,
		queue:  kit.NewQueue(Name, kit.WithBackoff(100*time.Millisecond, time.Minute), kit.WithClock(cfg.Clock)),
		dyn:    dyn,
		dynInf: dynamicinformer.NewDynamicSharedInformerFactory(dyn, cfg.ResyncPeriod),
	}
	stInf := c.dynInf.ForResource(fleetapi.ImageStagingsResource)
	nodeInf := cfg.Informers.Core().V1().Nodes()
	c.stagings, c.nodes = stInf.Lister(), nodeInf.Lister()
	c.synced = []cache.InformerSynced{stInf.Informer().HasSynced, nodeInf.Informer().HasSynced}
	if _, err := stInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.queue.Enqueue,
		UpdateFunc: func(_, cur any) { c.queue.Enqueue(cur) },
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	// Only labels and images matter: heartbeats change neither.
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { c.enqueueAll() },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			if !ok1 || !ok2 || !apiequality.Semantic.DeepEqual(o.Labels, n.Labels) || !apiequality.Semantic.DeepEqual(o.Status.Images, n.Status.Images) {
				c.enqueueAll()
			}
		},
		DeleteFunc: func(any) { c.enqueueAll() },
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	return c, nil
}

// enqueueAll queues every staging: few exist, and a node may matter to
// any of them.
func (c *Controller) enqueueAll() {
	objs, err := c.stagings.List(labels.Everything())
	if err != nil {
		return
	}
	for _, o := range objs {
		c.queue.Enqueue(o)
	}
}

// Run waits for the informers, then keeps the stagings' status until ctx
// ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	c.dynInf.Start(ctx.Done())
	defer c.dynInf.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("imagestaging controller running")
	c.queue.Run(ctx, 1, c.log, c.sync)
	return nil
}

// sync writes the status of the staging key names.
func (c *Controller) sync(ctx context.Context, key string) error {
	obj, err := c.stagings.Get(key)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return fmt.Errorf("imagestaging informer object is %T", obj)
	}
	st := &fleetapi.ImageStaging{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, st); err != nil {
		return fmt.Errorf("decode imagestaging %s: %w", key, err)
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	status := Aggregate(st, nodes, c.clock.Now())
	if !sameStatus(st.Status, status) {
		body, err := json.Marshal(map[string]any{"status": status})
		if err != nil {
			return err
		}
		if _, err := c.dyn.Resource(fleetapi.ImageStagingsResource).Patch(ctx, st.Name, types.MergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("write status of imagestaging %s: %w", st.Name, err)
		}
	}
	if st.Spec.Window != nil && status.Phase != fleetapi.StagingStaged {
		return kit.RequeueAfter(windowCheck)
	}
	return nil
}

// sameStatus compares two statuses leaving out the conditions' transition
// times.
func sameStatus(a, b fleetapi.ImageStagingStatus) bool {
	strip := func(s fleetapi.ImageStagingStatus) fleetapi.ImageStagingStatus {
		s.Conditions = append([]metav1.Condition(nil), s.Conditions...)
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metav1.Time{}
		}
		return s
	}
	return apiequality.Semantic.DeepEqual(strip(a), strip(b))
}
