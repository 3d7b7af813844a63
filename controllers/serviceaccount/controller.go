// Package serviceaccount gives every namespace what pods expect to find
// there: a ServiceAccount named default, and the kube-root-ca.crt
// ConfigMap holding the hub's CA certificate under ca.crt, with which a pod
// verifies the hub when it calls https://kubernetes.default.svc.
//
// Both are recreated when deleted, and the ConfigMap is put back when its
// content is changed. Terminating namespaces are left alone: creating in
// them fails, and would only delay their end.
package serviceaccount

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Names and keys of what the controller publishes, as upstream's.
const (
	DefaultServiceAccount = "default"
	RootCAConfigMap       = "kube-root-ca.crt"
	RootCAKey             = "ca.crt"
	descriptionAnnotation = "kubernetes.io/description"
	rootCADescription     = "Contains a CA bundle that can be used to verify the hub when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."
)

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client creates ServiceAccounts and ConfigMaps.
	Client kubernetes.Interface
	// Informers is the shared factory the controller registers its
	// Namespace, ServiceAccount and ConfigMap informers on; New must be
	// called before it starts.
	Informers informers.SharedInformerFactory
	// Workers is the number of namespaces handled at once; zero means 2.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// RootCA is the hub's CA certificate bundle, PEM-encoded, published
	// as ca.crt in every namespace's kube-root-ca.crt. Empty means no
	// ConfigMap is published.
	RootCA []byte
}

// Controller keeps each namespace's default ServiceAccount and root CA
// ConfigMap.
type Controller struct {
	cfg    Config
	log    *slog.Logger
	queue  *kit.Queue
	ns     corelisters.NamespaceLister
	sas    corelisters.ServiceAccountLister
	cms    corelisters.ConfigMapLister
	synced []cache.InformerSynced
}

// New registers the controller's informers; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create serviceaccount controller: client and informers are required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{
		cfg:   cfg,
		log:   log.With("controller", "serviceaccount"),
		queue: kit.NewQueue("serviceaccount", kit.WithBackoff(50*time.Millisecond, time.Minute)),
	}
	nsInf := cfg.Informers.Core().V1().Namespaces()
	saInf := cfg.Informers.Core().V1().ServiceAccounts()
	cmInf := cfg.Informers.Core().V1().ConfigMaps()
	c.ns, c.sas, c.cms = nsInf.Lister(), saInf.Lister(), cmInf.Lister()
	c.synced = []cache.InformerSynced{nsInf.Informer().HasSynced, saInf.Informer().HasSynced, cmInf.Informer().HasSynced}

	nsKey := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if n, ok := obj.(*corev1.Namespace); ok {
			c.queue.Add(n.Name)
		}
	}
	// Only the objects the controller owns by name bring their namespace
	// back into the queue.
	named := func(name string) func(any) {
		return func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if m, ok := obj.(metav1.Object); ok && m.GetName() == name {
				c.queue.Add(m.GetNamespace())
			}
		}
	}
	regs := []struct {
		inf cache.SharedIndexInformer
		f   func(any)
		add bool
	}{
		{nsInf.Informer(), nsKey, true},
		{saInf.Informer(), named(DefaultServiceAccount), false},
		{cmInf.Informer(), named(RootCAConfigMap), false},
	}
	for _, r := range regs {
		h := cache.ResourceEventHandlerFuncs{UpdateFunc: func(_, n any) { r.f(n) }, DeleteFunc: r.f}
		if r.add {
			h.AddFunc = r.f
		}
		if _, err := r.inf.AddEventHandler(h); err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
	}
	return c, nil
}

// Run waits for the informers, then keeps namespaces stocked until ctx
// ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("serviceaccount controller running")
	c.queue.Run(ctx, c.cfg.Workers, c.log, c.sync)
	return nil
}

func (c *Controller) sync(ctx context.Context, name string) error {
	ns, err := c.ns.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get namespace: %w", err)
	}
	if ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating {
		return nil
	}
	return errors.Join(c.syncServiceAccount(ctx, name), c.syncRootCA(ctx, name))
}

func (c *Controller) syncServiceAccount(ctx context.Context, ns string) error {
	if _, err := c.sas.ServiceAccounts(ns).Get(DefaultServiceAccount); err == nil {
		return nil
	}
	_, err := c.cfg.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultServiceAccount},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) && !isTerminating(err) {
		return fmt.Errorf("create default service account: %w", err)
	}
	return nil
}

func (c *Controller) syncRootCA(ctx context.Context, ns string) error {
	if len(c.cfg.RootCA) == 0 {
		return nil
	}
	want := map[string]string{RootCAKey: string(c.cfg.RootCA)}
	api := c.cfg.Client.CoreV1().ConfigMaps(ns)
	cur, err := c.cms.ConfigMaps(ns).Get(RootCAConfigMap)
	if apierrors.IsNotFound(err) {
		_, err := api.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: RootCAConfigMap, Annotations: map[string]string{descriptionAnnotation: rootCADescription}},
			Data:       want,
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) && !isTerminating(err) {
			return fmt.Errorf("create root CA configmap: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get root CA configmap: %w", err)
	}
	if maps.Equal(cur.Data, want) && len(cur.BinaryData) == 0 && cur.Annotations[descriptionAnnotation] == rootCADescription {
		return nil
	}
	u := cur.DeepCopy()
	u.Data, u.BinaryData = want, nil
	if u.Annotations == nil {
		u.Annotations = map[string]string{}
	}
	u.Annotations[descriptionAnnotation] = rootCADescription
	if _, err := api.Update(ctx, u, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("update root CA configmap: %w", err)
	}
	return nil
}

// isTerminating says whether a create failed because the namespace is
// being deleted.
func isTerminating(err error) bool {
	return apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause)
}
