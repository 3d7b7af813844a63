package servicelb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Name is the controller's name in --controllers and its events' source.
const Name = "service-lb-controller"

// syncKey is the queue's one key: the Services share the node addresses,
// so a change of one may change another's ingress, and every sync looks at
// all of them.
const syncKey = "services"

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client writes Services' status and events.
	Client kubernetes.Interface
	// Informers is the shared factory the Service and Node informers are
	// registered on; New must be called before it starts.
	Informers informers.SharedInformerFactory
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Controller keeps LoadBalancer Services' ingress at the node addresses.
type Controller struct {
	cfg      Config
	log      *slog.Logger
	queue    *kit.Queue
	recorder *kit.Recorder
	services corelisters.ServiceLister
	nodes    corelisters.NodeLister
	synced   []cache.InformerSynced
	// reported is the conflict last reported of each Service, so that a
	// conflict is an event once, not once per sync. Only the one worker
	// touches it.
	reported map[string]string
	// served are the Services whose ingress this controller wrote or
	// found as it would write it, by UID: the ones whose ingress it may
	// clear once another class is set. Only the one worker touches it.
	served map[types.UID]bool
}

// New registers the controller's informers; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create service-lb controller: client and informers are required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{
		cfg:      cfg,
		log:      log,
		queue:    kit.NewQueue(Name, kit.WithBackoff(100*time.Millisecond, time.Minute)),
		recorder: kit.NewRecorder(cfg.Client, Name, log),
		reported: map[string]string{},
		served:   map[types.UID]bool{},
	}
	svcInf := cfg.Informers.Core().V1().Services()
	nodeInf := cfg.Informers.Core().V1().Nodes()
	c.services, c.nodes = svcInf.Lister(), nodeInf.Lister()
	c.synced = []cache.InformerSynced{svcInf.Informer().HasSynced, nodeInf.Informer().HasSynced}
	all := func(any) { c.queue.Add(syncKey) }
	if _, err := svcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    all,
		UpdateFunc: func(_, cur any) { all(cur) },
		DeleteFunc: all,
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	// A node's heartbeats change nothing the Services see: only a change
	// of what makes it eligible, or of its addresses, brings a sync.
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: all,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			if !ok1 || !ok2 || nodeView(o) != nodeView(n) {
				all(cur)
			}
		},
		DeleteFunc: all,
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	return c, nil
}

// nodeView is what of a node the controller decides on.
func nodeView(n *corev1.Node) string {
	_, excluded := n.Labels[corev1.LabelNodeExcludeBalancers]
	return fmt.Sprintf("%v %v %v %q %v %v", ready(n), n.Spec.Unschedulable, n.DeletionTimestamp != nil,
		n.Labels[LabelLoadBalancer], excluded, n.Status.Addresses)
}

// Run waits for the informers, then keeps the Services' ingress until ctx
// ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	c.recorder.Start(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("service-lb controller running")
	c.queue.Add(syncKey)
	c.queue.Run(ctx, 1, c.log, func(ctx context.Context, _ string) error { return c.sync(ctx) })
	return nil
}

// sync writes the ingress of every Service whose ingress is not what it
// should be, and reports new conflicts.
func (c *Controller) sync(ctx context.Context) error {
	svcs, err := c.services.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	// The nodes matter only to Services served here or showing an
	// ingress: a fleet without such Services costs no pass over its
	// nodes at each node change.
	var addrs []string
	var owned sets.Set[string]
	if slices.ContainsFunc(svcs, func(s *corev1.Service) bool { return Served(s) || len(s.Status.LoadBalancer.Ingress) > 0 }) {
		nodes, err := c.nodes.List(labels.Everything())
		if err != nil {
			return fmt.Errorf("list nodes: %w", err)
		}
		addrs, owned = Addresses(Eligible(nodes)), allAddresses(nodes)
	}
	conflicts := Conflicts(svcs)
	var errs []error
	seen := map[string]bool{}
	seenUID := map[types.UID]bool{}
	for _, svc := range svcs {
		key := svc.Namespace + "/" + svc.Name
		seen[key] = true
		msg, conflict := conflicts[key]
		if !conflict {
			delete(c.reported, key)
		} else if c.reported[key] != msg {
			c.recorder.Eventf(svc, corev1.EventTypeWarning, ReasonPortConflict, "%s", msg)
			c.reported[key] = msg
		}
		seenUID[svc.UID] = true
		want, write := Desired(svc, addrs, conflict, owned, c.served[svc.UID])
		if !write {
			continue
		}
		if !Equal(svc.Status.LoadBalancer.Ingress, want) {
			if err := c.writeIngress(ctx, svc, want); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if len(want) > 0 {
			c.served[svc.UID] = true
		} else {
			delete(c.served, svc.UID)
		}
	}
	for uid := range c.served {
		if !seenUID[uid] {
			delete(c.served, uid)
		}
	}
	for key := range c.reported {
		if !seen[key] {
			delete(c.reported, key)
		}
	}
	return errors.Join(errs...)
}

// writeIngress sets svc's ingress to want through the status subresource.
func (c *Controller) writeIngress(ctx context.Context, svc *corev1.Service, want []corev1.LoadBalancerIngress) error {
	upd := svc.DeepCopy()
	upd.Status.LoadBalancer.Ingress = slices.Clone(want)
	_, err := c.cfg.Client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("update status of service %s/%s: %w", svc.Namespace, svc.Name, err)
	}
	c.log.Info("service load balancer ingress", "service", svc.Namespace+"/"+svc.Name, "ingress", ingressIPs(want))
	return nil
}

func ingressIPs(in []corev1.LoadBalancerIngress) []string {
	out := make([]string, len(in))
	for i, x := range in {
		out[i] = x.IP
	}
	return out
}
