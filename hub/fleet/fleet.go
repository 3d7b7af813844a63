// Package fleet serves the hub's fleet page: the sites, their nodes and
// how the hub hears them (connected, partitioned, dark, dead; when each
// node was last heard), the pods on each, and the agent upgrades rolling
// out (EdgeUpgrades, and each node's upgrade under way) and the images
// being staged to sites (ImageStagings), for the person who looks
// at the fleet first in the morning. It is read-only, answers GET at
// /fleet/ on the API port for users allowed to list nodes (opened through
// `kubectl proxy` as any API path), and is plain server-rendered HTML
// whose small script, served beside it, refreshes the figures every two
// seconds. It reads the hub's own API through informers started at the
// first request, so a hub whose page nobody opens pays nothing for it;
// the pod informer keeps only what the page counts.
package fleet

import (
	"bytes"
	"context"
	"html/template"
	"net/http"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// Page serves the fleet page.
type Page struct {
	config func() (*rest.Config, error)
	ctx    context.Context
	now    func() time.Time
	tmpl   *template.Template

	once    sync.Once
	err     error
	nodes   cache.Indexer
	pods    cache.Indexer
	leases  cache.Indexer
	ups     cache.Indexer // EdgeUpgrades
	stages  cache.Indexer // ImageStagings
	started chan struct{} // closed once the informers have synced
}

// New returns the page. config gives the configuration of the API client
// it reads through (the hub's own, in-process); the informers run until
// ctx ends.
func New(ctx context.Context, config func() (*rest.Config, error)) *Page {
	return &Page{config: config, ctx: ctx, now: time.Now, tmpl: newTemplates(), started: make(chan struct{})}
}

// start runs the informers, once.
func (p *Page) start() error {
	p.once.Do(func() {
		cfg, err := p.config()
		var c kubernetes.Interface
		var dc dynamic.Interface
		if err == nil {
			c, err = kubernetes.NewForConfig(cfg)
		}
		if err == nil {
			dc, err = dynamic.NewForConfig(cfg)
		}
		if err != nil {
			p.err = err
			close(p.started)
			return
		}
		f := informers.NewSharedInformerFactory(c, 0)
		nodes := f.Core().V1().Nodes().Informer()
		pods := f.Core().V1().Pods().Informer()
		// Only the node and phase of a pod count here.
		_ = pods.SetTransform(func(o any) (any, error) {
			pod, ok := o.(*corev1.Pod)
			if !ok {
				return o, nil
			}
			return &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion},
				Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName},
				Status:     corev1.PodStatus{Phase: pod.Status.Phase},
			}, nil
		})
		lf := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(corev1.NamespaceNodeLease))
		leases := lf.Coordination().V1().Leases().Informer()
		df := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
		ups := df.ForResource(fleetapi.EdgeUpgradesResource).Informer()
		stages := df.ForResource(fleetapi.ImageStagingsResource).Informer()
		p.nodes, p.pods, p.leases = nodes.GetIndexer(), pods.GetIndexer(), leases.GetIndexer()
		p.ups, p.stages = ups.GetIndexer(), stages.GetIndexer()
		f.Start(p.ctx.Done())
		lf.Start(p.ctx.Done())
		df.Start(p.ctx.Done())
		go func() {
			defer close(p.started)
			if !cache.WaitForCacheSync(p.ctx.Done(), nodes.HasSynced, pods.HasSynced, leases.HasSynced, ups.HasSynced, stages.HasSynced) {
				p.err = p.ctx.Err()
			}
		}()
	})
	select {
	case <-p.started:
		return p.err
	case <-time.After(30 * time.Second):
		return errNotSynced
	}
}

// view summarizes what the informers hold now.
func (p *Page) view() View {
	v := Summarize(p.now(), items[*corev1.Node](p.nodes), items[*corev1.Pod](p.pods), items[*coordinationv1.Lease](p.leases))
	var ups []*fleetapi.EdgeUpgrade
	for _, o := range p.ups.List() {
		if u, ok := edgeUpgradeOf(o); ok {
			ups = append(ups, u)
		}
	}
	v.Rollouts = Rollouts(ups)
	var ss []*fleetapi.ImageStaging
	for _, o := range p.stages.List() {
		if s, ok := imageStagingOf(o); ok {
			ss = append(ss, s)
		}
	}
	v.Stagings = Stagings(ss)
	return v
}

// items lists what an informer holds, as the type it holds.
func items[T any](s cache.Store) []T {
	objs := s.List()
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(T))
	}
	return out
}

// ServeHTTP answers /fleet/ (the page), /fleet/?part=body (its body, which
// the script fetches) and /fleet/fleet.js and /fleet/fleet.css.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the fleet page is read-only", http.StatusMethodNotAllowed)
		return
	}
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	switch r.URL.Path {
	case "/fleet":
		http.Redirect(w, r, "fleet/", http.StatusMovedPermanently)
		return
	case "/fleet/fleet.js":
		h.Set("Content-Type", "text/javascript; charset=utf-8")
		_, _ = w.Write([]byte(script))
		return
	case "/fleet/fleet.css":
		h.Set("Content-Type", "text/css; charset=utf-8")
		_, _ = w.Write([]byte(style))
		return
	case "/fleet/":
	default:
		http.NotFound(w, r)
		return
	}
	if err := p.start(); err != nil {
		http.Error(w, "the fleet page cannot read the fleet: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	h.Set("Content-Type", "text/html; charset=utf-8")
	// Only the page's own script and style run in it.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'")
	v := p.view()
	var b bytes.Buffer
	var err error
	if r.URL.Query().Get("part") == "body" {
		err = p.renderBody(&b, v)
	} else {
		err = p.renderPage(&b, v)
	}
	if err != nil {
		http.Error(w, "render the fleet page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = b.WriteTo(w)
}
