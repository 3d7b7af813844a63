package batch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client creates and deletes Jobs and pods and writes their status.
	Client kubernetes.Interface
	// Informers is the shared factory the controller registers its Job,
	// CronJob and Pod informers on; New must be called before it starts.
	Informers informers.SharedInformerFactory
	// Workers is the number of Jobs, and of CronJobs, synced at once;
	// zero means 4.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// Clock is the CronJob controller's time: schedules are evaluated
	// and requeued on it. Nil means the real clock. The Job controller
	// always uses the real clock.
	Clock clock.WithTicker
	// BackoffBase is the delay before a failed Job pod is replaced,
	// doubled for each further failure; zero means 10s.
	BackoffBase time.Duration
	// BackoffMax caps that delay; zero means 6 minutes.
	BackoffMax time.Duration
}

// Controller runs Jobs to completion and starts Jobs from CronJobs.
type Controller struct {
	cfg    Config
	log    *slog.Logger
	events *kit.Recorder

	jobs     batchlisters.JobLister
	jobIdx   cache.Indexer
	cronJobs batchlisters.CronJobLister
	pods     corelisters.PodLister
	podIdx   cache.Indexer
	synced   []cache.InformerSynced

	cronQueue *kit.Queue
	jobQueue  *kit.Queue
	expect    *kit.Expectations

	mu     sync.Mutex            // guards the following field
	jobMem map[string]*jobMemory // by Job key
}

var (
	jobGVK     = batchv1.SchemeGroupVersion.WithKind("Job")
	cronJobGVK = batchv1.SchemeGroupVersion.WithKind("CronJob")
)

// New registers the controller's informers; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create batch controller: client and informers are required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 10 * time.Second
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 6 * time.Minute
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{
		cfg:    cfg,
		log:    log.With("controller", "batch"),
		events: kit.NewRecorder(cfg.Client, "job-controller", log),
		// Start times are waited for on the configured clock; failures
		// back off in real time.
		cronQueue: kit.NewQueue("cronjob", kit.WithClock(cfg.Clock), kit.WithBackoff(50*time.Millisecond, 5*time.Minute)),
		jobQueue:  kit.NewQueue("job"),
		expect:    kit.NewExpectations(kit.DefaultExpectationsTTL, time.Now),
		jobMem:    map[string]*jobMemory{},
	}
	jobInf := cfg.Informers.Batch().V1().Jobs()
	cjInf := cfg.Informers.Batch().V1().CronJobs()
	podInf := cfg.Informers.Core().V1().Pods()
	c.jobs, c.cronJobs, c.pods = jobInf.Lister(), cjInf.Lister(), podInf.Lister()
	c.jobIdx, c.podIdx = jobInf.Informer().GetIndexer(), podInf.Informer().GetIndexer()
	for _, inf := range []cache.SharedIndexInformer{jobInf.Informer(), podInf.Informer()} {
		if err := kit.AddControllerIndex(inf); err != nil {
			return nil, fmt.Errorf("index by controller: %w", err)
		}
	}
	c.synced = []cache.InformerSynced{jobInf.Informer().HasSynced, cjInf.Informer().HasSynced, podInf.Informer().HasSynced}
	if err := c.registerCronJobHandlers(cjInf.Informer(), jobInf.Informer()); err != nil {
		return nil, err
	}
	if err := c.registerJobHandlers(jobInf.Informer(), podInf.Informer()); err != nil {
		return nil, err
	}
	return c, nil
}

// Run waits for the informers, then syncs Jobs and CronJobs until ctx
// ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.cronQueue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("job and cronjob controllers running", "workers", c.cfg.Workers)
	c.events.Start(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { c.jobQueue.Run(ctx, c.cfg.Workers, c.log.With("kind", "Job"), c.syncJob) })
	wg.Go(func() { c.cronQueue.Run(ctx, c.cfg.Workers, c.log.With("kind", "CronJob"), c.syncCron) })
	wg.Wait()
	return nil
}
