package aggregator

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/registry"
)

// Config configures an Aggregator.
type Config struct {
	// Dialer reaches Services' endpoints. Required for service-backed
	// APIServices; nil answers 503 for them.
	Dialer ServiceDialer
	// FrontProxy is the request-header CA and the client certificate the
	// hub presents to extension API servers. Required.
	FrontProxy *pki.FrontProxy
	// ClusterCAPEM is the cluster CA, published as client-ca-file.
	ClusterCAPEM []byte
	// Kinds returns the kinds the hub serves itself, whose group/versions
	// get Local APIServices. Required.
	Kinds func() []*registry.Kind
	// Changed, when set, returns a channel closed at the next change of
	// what Kinds returns (registry.Registry's Changed); nil means Kinds is
	// read again every few seconds.
	Changed func() <-chan struct{}
	// ProbeInterval is how often service-backed APIServices are checked;
	// zero means every 2 seconds.
	ProbeInterval time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Aggregator routes requests and discovery for service-backed
// APIServices and keeps the APIServices' state. Its handlers work before
// Run (nothing is proxied then).
type Aggregator struct {
	cfg    Config
	log    *slog.Logger
	client *tls.Certificate

	mu       sync.RWMutex
	services map[string]*entry // by APIService name

	kick chan struct{}
	kube kubernetes.Interface
	reg  aggregatorclient.Interface
}

// entry is what the aggregator knows of one APIService.
type entry struct {
	svc       *apiregistrationv1.APIService
	backend   *backend // nil for Local
	available bool
	// discovery is the last APIResourceList the service answered
	// /apis/<group>/<version> with (JSON), nil before one did.
	discovery []byte
}

// New returns an Aggregator for cfg.
func New(cfg Config) (*Aggregator, error) {
	if cfg.FrontProxy == nil || cfg.Kinds == nil {
		return nil, fmt.Errorf("create aggregator: front-proxy certificate and kinds are required")
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = 2 * time.Second
	}
	a := &Aggregator{cfg: cfg, log: cfg.Logger, client: &cfg.FrontProxy.Client,
		services: map[string]*entry{}, kick: make(chan struct{}, 1)}
	if a.log == nil {
		a.log = slog.Default()
	}
	return a, nil
}

// ProxyFor returns the handler of group/version when a service-backed
// APIService registers it, or nil when the hub serves it (or nothing
// does).
func (a *Aggregator) ProxyFor(group, version string) http.Handler {
	a.mu.RLock()
	defer a.mu.RUnlock()
	e := a.services[version+"."+group]
	if e == nil || e.svc.Spec.Service == nil {
		return nil
	}
	if e.backend == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeStatus(w, serviceUnavailable())
		})
	}
	return &proxyHandler{b: e.backend, available: e.available}
}

// snapshot returns the APIServices known now, by name.
func (a *Aggregator) snapshot() map[string]*apiregistrationv1.APIService {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make(map[string]*apiregistrationv1.APIService, len(a.services))
	for n, e := range a.services {
		out[n] = e.svc
	}
	return out
}

// observe records an APIService the informer saw (nil svc: deleted).
func (a *Aggregator) observe(name string, svc *apiregistrationv1.APIService) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if svc == nil {
		if e := a.services[name]; e != nil && e.backend != nil {
			e.backend.transport.CloseIdleConnections()
		}
		delete(a.services, name)
		return
	}
	e := a.services[name]
	if e == nil {
		e = &entry{}
		a.services[name] = e
	}
	if e.svc == nil || !reflect.DeepEqual(e.svc.Spec, svc.Spec) {
		if e.backend != nil {
			e.backend.transport.CloseIdleConnections()
		}
		e.backend, e.discovery = nil, nil
		if svc.Spec.Service != nil && a.cfg.Dialer != nil {
			e.backend = newBackend(svc, a.cfg.Dialer, a.client)
		}
		a.poke()
	}
	e.svc = svc
	e.available = isAvailable(svc)
}

func isAvailable(s *apiregistrationv1.APIService) bool {
	for _, c := range s.Status.Conditions {
		if c.Type == apiregistrationv1.Available {
			return c.Status == apiregistrationv1.ConditionTrue
		}
	}
	return false
}

// poke asks the availability loop for a check now.
func (a *Aggregator) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// Run keeps the APIServices until ctx ends: it publishes the front-proxy
// configuration in kube-system/extension-apiserver-authentication, keeps
// the Local APIServices in step with the served kinds and checks the
// service-backed ones. rc reaches the hub's API with rights over
// APIServices, ConfigMaps and Roles in kube-system.
func (a *Aggregator) Run(ctx context.Context, rc *rest.Config) error {
	var err error
	if a.kube, err = kubernetes.NewForConfig(rc); err != nil {
		return fmt.Errorf("create aggregator client: %w", err)
	}
	if a.reg, err = aggregatorclient.NewForConfig(rc); err != nil {
		return fmt.Errorf("create aggregator client: %w", err)
	}
	a.retry(ctx, "publish the front-proxy configuration", a.publishAuthentication)

	lw := cache.NewListWatchFromClient(a.reg.ApiregistrationV1().RESTClient(), "apiservices", metav1.NamespaceAll, fieldsEverything())
	inf := cache.NewSharedIndexInformer(lw, &apiregistrationv1.APIService{}, 0, cache.Indexers{})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s := obj.(*apiregistrationv1.APIService); a.observe(s.Name, s) },
		UpdateFunc: func(_, obj any) { s := obj.(*apiregistrationv1.APIService); a.observe(s.Name, s) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if s, ok := obj.(*apiregistrationv1.APIService); ok {
				a.observe(s.Name, nil)
			}
		},
	})
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	go a.runAvailability(ctx)
	for {
		var changed <-chan struct{}
		if a.cfg.Changed != nil {
			changed = a.cfg.Changed()
		}
		if err := a.syncLocal(ctx, a.cfg.Kinds()); err != nil && ctx.Err() == nil {
			a.log.Warn("sync local APIServices", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-time.After(3 * time.Second):
		}
	}
}

// retry calls f until it succeeds or ctx ends.
func (a *Aggregator) retry(ctx context.Context, what string, f func(context.Context) error) {
	for {
		err := f(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		a.log.Warn(what, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}
