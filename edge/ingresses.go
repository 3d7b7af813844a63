package edge

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edge/ingress"
	"github.com/tether-edge/tether/edge/localstate"
)

// The node's ingress controller (edge/ingress) is fed from the agent's
// kept informers: the Service and EndpointSlice watches it shares with
// the dataplane and DNS (it is one of their sinks), and watches of its
// own on Ingresses, IngressClasses and, one at a time by name, the TLS
// Secrets the served Ingresses name. All of them are kept in the local
// state, so a node cut off from the hub, or restarted while cut off,
// routes as it last knew.

// Kinds and watches of the local state for the ingress controller. TLS
// Secrets are kept apart from the Secrets pods reference, which the
// agent forgets when no pod needs them.
const (
	keptIngresses      = "ingresses"
	keptIngressClasses = "ingressclasses"
	keptIngressSecrets = "ingresssecrets"
)

// ingressWatch runs the node's ingress controller and its watches.
type ingressWatch struct {
	a     *Agent
	ctrl  *ingress.Controller
	ctrls []cache.Controller

	mu      sync.Mutex
	ctx     context.Context // set by run
	secrets map[types.NamespacedName]context.CancelFunc
}

func newIngressWatch(a *Agent) (*ingressWatch, error) {
	w := &ingressWatch{a: a, secrets: map[types.NamespacedName]context.CancelFunc{}}
	cfg := *a.cfg.Ingress
	if a.nodeIP.IsValid() && len(cfg.Addresses) == 0 {
		cfg.Addresses = []string{a.nodeIP.String()}
	}
	cfg.HTTPAddr = ingressListenAddr(cfg.HTTPAddr, ":80", a.cfg.APIRelayAddr, a.nodeIP)
	cfg.HTTPSAddr = ingressListenAddr(cfg.HTTPSAddr, ":443", a.cfg.APIRelayAddr, a.nodeIP)
	if cfg.Status == nil {
		cfg.Status = func(ns string) ingress.IngressClient { return a.client.Ingresses(ns) }
	}
	cfg.OnSecrets = w.setSecrets
	if cfg.Logger == nil {
		cfg.Logger = a.log
	}
	ctrl, err := ingress.New(cfg)
	if err != nil {
		return nil, err
	}
	w.ctrl = ctrl
	_, c := newInformer(&listWatch{
		keep: a.keep(keptIngresses),
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return a.client.Ingresses(metav1.NamespaceAll).List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return a.client.Ingresses(metav1.NamespaceAll).Watch(ctx, o)
		},
	}, &networkingv1.Ingress{}, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { ctrl.UpsertIngress(obj.(*networkingv1.Ingress)) },
		UpdateFunc: func(_, obj any) { ctrl.UpsertIngress(obj.(*networkingv1.Ingress)) },
		DeleteFunc: func(obj any) {
			if ing, ok := deletedObject(obj).(*networkingv1.Ingress); ok {
				ctrl.DeleteIngress(ing.Namespace, ing.Name)
			}
		},
	})
	w.ctrls = append(w.ctrls, c)
	_, c = newInformer(&listWatch{
		keep: a.keep(keptIngressClasses),
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return a.client.IngressClasses().List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return a.client.IngressClasses().Watch(ctx, o)
		},
	}, &networkingv1.IngressClass{}, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { ctrl.UpsertIngressClass(obj.(*networkingv1.IngressClass)) },
		UpdateFunc: func(_, obj any) { ctrl.UpsertIngressClass(obj.(*networkingv1.IngressClass)) },
		DeleteFunc: func(obj any) {
			if ic, ok := deletedObject(obj).(*networkingv1.IngressClass); ok {
				ctrl.DeleteIngressClass(ic.Name)
			}
		},
	})
	w.ctrls = append(w.ctrls, c)
	return w, nil
}

// run runs the watches and the controller until ctx ends. A controller
// that cannot listen is logged: the rest of the node keeps working.
func (w *ingressWatch) run(ctx context.Context, goRun func(func())) {
	w.mu.Lock()
	w.ctx = ctx
	w.mu.Unlock()
	for _, c := range w.ctrls {
		goRun(func() { c.RunWithContext(ctx) })
	}
	goRun(func() {
		if err := w.ctrl.Run(ctx); err != nil {
			w.a.log.Error("ingress controller stopped", "err", err)
		}
	})
}

// ingressListenAddr returns where the ingress controller listens for
// addr (def when empty). A listener on every address cannot share a port
// that a listener on one address holds, and the pods' API relay holds
// port 443 of its node-local address by default: a wildcard address on
// the relay's port becomes the node's address on that port, where the
// Ingresses' status sends clients.
func ingressListenAddr(addr, def string, relay netip.AddrPort, nodeIP netip.Addr) string {
	if addr == "" {
		addr = def
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || !relay.IsValid() || !nodeIP.IsValid() || port != strconv.Itoa(int(relay.Port())) {
		return addr
	}
	if ip, err := netip.ParseAddr(host); host != "" && (err != nil || !ip.IsUnspecified()) {
		return addr
	}
	return net.JoinHostPort(nodeIP.String(), port)
}

// ingressSecretWatch is the local state's name of a TLS Secret's watch.
func ingressSecretWatch(ref types.NamespacedName) string {
	return keptIngressSecrets + "/" + ref.Namespace + "/" + ref.Name
}

// isIngressSecretWatch tells the watches setSecrets owns.
func isIngressSecretWatch(name string) bool {
	return strings.HasPrefix(name, keptIngressSecrets+"/")
}

// setSecrets watches exactly the TLS Secrets refs, each by name, and
// forgets the others with what the local state kept of them.
func (w *ingressWatch) setSecrets(refs []types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx == nil {
		// Before run: the first rebuild after run calls again.
		return
	}
	want := make(map[types.NamespacedName]bool, len(refs))
	for _, ref := range refs {
		want[ref] = true
		if w.secrets[ref] == nil {
			w.secrets[ref] = w.watchSecret(ref)
		}
	}
	for ref, stop := range w.secrets {
		if want[ref] {
			continue
		}
		stop()
		delete(w.secrets, ref)
		w.ctrl.DeleteSecret(ref.Namespace, ref.Name)
		if w.a.local != nil {
			w.a.local.Forget(keptIngressSecrets, ingressSecretWatch(ref), ref.Namespace, ref.Name)
		}
	}
}

// watchSecret starts the kept watch of one TLS Secret.
func (w *ingressWatch) watchSecret(ref types.NamespacedName) context.CancelFunc {
	ctx, cancel := context.WithCancel(w.ctx)
	client := w.a.client.Secrets(ref.Namespace)
	lw := namedListWatch(fields.OneTermEqualSelector("metadata.name", ref.Name).String(), client.List, client.Watch)
	if w.a.local != nil {
		lw.keep = &localstate.Spec{State: w.a.local.State, Kind: keptIngressSecrets, Watch: ingressSecretWatch(ref), Namespace: ref.Namespace, Name: ref.Name}
	}
	upsert := func(obj any) {
		if s, ok := obj.(*corev1.Secret); ok {
			w.ctrl.UpsertSecret(s)
		}
	}
	_, c := newInformer(lw, &corev1.Secret{}, cache.ResourceEventHandlerFuncs{
		AddFunc:    upsert,
		UpdateFunc: func(_, obj any) { upsert(obj) },
		DeleteFunc: func(obj any) {
			if s, ok := deletedObject(obj).(*corev1.Secret); ok {
				w.ctrl.DeleteSecret(s.Namespace, s.Name)
			}
		},
	})
	go c.RunWithContext(ctx)
	return cancel
}

// validateIngress checks the ingress settings of c.
func (c *Config) validateIngress() error {
	if c.Ingress == nil {
		return nil
	}
	if !c.WatchServices {
		return fmt.Errorf("the ingress controller needs WatchServices")
	}
	labels := make(map[string]string, len(c.Labels)+1)
	for k, v := range c.Labels {
		labels[k] = v
	}
	labels[ingress.NodeLabel] = "true"
	c.Labels = labels
	return nil
}
