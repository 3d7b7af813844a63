package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edge/imageshare"
	"github.com/tether-edge/tether/edge/localstate"
	"github.com/tether-edge/tether/internal/fleetapi"
	"github.com/tether-edge/tether/internal/sitedigest"
)

// ImageStager is a Runtime that pulls images ahead of pods (for the
// ImageStagings that select the node) and says which images the node
// holds, which the agent reports in its Node's status.images.
type ImageStager interface {
	// Images lists the images the node holds, the largest first, at
	// most 50, as the kubelet reports them.
	Images(ctx context.Context) ([]corev1.ContainerImage, error)
	// StageImage pulls image unless the node holds it, at most
	// bytesPerSecond (0: no cap), through the same path as pods' pulls,
	// and keeps it from image garbage collection. It reports whether it
	// pulled.
	StageImage(ctx context.Context, image string, bytesPerSecond int64) (pulled bool, err error)
	// SetStaged lets garbage collection have the staged images that are
	// not among images.
	SetStaged(ctx context.Context, images []string) error
}

// ContentSharer is a Runtime whose image content the site's members share
// (edge/imageshare).
type ContentSharer interface {
	// ContentShare lends the runtime's content store, leases and
	// registries.
	ContentShare() imageshare.Backend
	// UseShare makes the runtime's pulls fetch blobs through s.
	UseShare(s *imageshare.Sharer)
}

// AnnotationImageSharePort is the Node annotation in which an agent
// publishes the port of its image share server.
const AnnotationImageSharePort = "site.tether.io/image-share-port"

// DefaultImageSharePort is what `tether edge` serves image content to
// its site on, next to the gossip's DefaultGossipPort.
const DefaultImageSharePort = 7947

// keptImageStagings names the ImageStagings in the local state.
const keptImageStagings = "imagestagings"

// imagesRefresh is how long the node's image list is reused for status
// reports.
const imagesRefresh = 30 * time.Second

// stagingRetry is how soon an image whose pull failed is tried again.
const stagingRetry = 30 * time.Second

// imageStaging follows the ImageStagings and pulls the images of those
// that select the node.
type imageStaging struct {
	a      *Agent
	stager ImageStager
	store  cache.Store
	ctrl   cache.Controller
	wake   chan struct{}

	// failed are the images whose last pull failed, with when, so that
	// one Event is recorded per failure streak and retries wait.
	failed map[string]time.Time
}

// newImageStaging watches the ImageStagings, kept in the local state so
// that a node restarting offline still knows what to keep.
func newImageStaging(a *Agent, stager ImageStager) *imageStaging {
	s := &imageStaging{a: a, stager: stager, wake: make(chan struct{}, 1), failed: map[string]time.Time{}}
	res := a.client.ImageStagings()
	lw := &listWatch{
		list: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return res.List(ctx, opts)
		},
		watch: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return res.Watch(ctx, opts)
		},
	}
	if a.local != nil {
		lw.keep = &localstate.Spec{State: a.local.State, Kind: keptImageStagings, Watch: keptImageStagings}
	}
	poke := func(any) { s.poke() }
	s.store, s.ctrl = newInformer(lw, &fleetapi.ImageStaging{}, cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke,
	})
	return s
}

func (s *imageStaging) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *imageStaging) run(ctx context.Context, goRun func(func())) {
	goRun(func() { s.ctrl.RunWithContext(ctx) })
	goRun(func() { s.loop(ctx) })
}

// wanted is what the stagings that select the node ask of it now.
type wantedImage struct {
	image   string
	staging *fleetapi.ImageStaging
	limit   int64
	open    bool // within the staging's window
}

// nodeLabels are the node's labels as the hub last returned them, or its
// own before that.
func (s *imageStaging) nodeLabels() labels.Set {
	s.a.node.mu.Lock()
	n := s.a.node.node
	s.a.node.mu.Unlock()
	if n != nil && len(n.Labels) > 0 {
		return labels.Set(n.Labels)
	}
	return labels.Set(nodeLabels(nodeInput{name: s.a.name, zone: s.a.cfg.Zone, labels: s.a.cfg.Labels}))
}

// wanted lists the images of the stagings that select the node, each
// once (the strictest cap and any open window win).
func (s *imageStaging) wanted(now time.Time) []wantedImage {
	own := s.nodeLabels()
	byImage := map[string]*wantedImage{}
	var out []string
	objs := s.store.List()
	slices.SortFunc(objs, func(a, b any) int {
		return strings.Compare(a.(*fleetapi.ImageStaging).Name, b.(*fleetapi.ImageStaging).Name)
	})
	for _, o := range objs {
		st := o.(*fleetapi.ImageStaging)
		if st.DeletionTimestamp != nil {
			continue
		}
		sel := labels.Everything()
		if st.Spec.NodeSelector != nil {
			var err error
			if sel, err = metav1.LabelSelectorAsSelector(st.Spec.NodeSelector); err != nil {
				continue
			}
		}
		if !sel.Matches(own) {
			continue
		}
		open, _ := fleetapi.WindowOpen(st.Spec.Window, now)
		var limit int64
		if q := st.Spec.BandwidthLimit; q != nil && q.Value() > 0 {
			limit = q.Value()
		}
		for _, im := range st.Spec.Images {
			w, ok := byImage[im]
			if !ok {
				w = &wantedImage{image: im, staging: st, limit: limit, open: open}
				byImage[im] = w
				out = append(out, im)
				continue
			}
			if limit > 0 && (w.limit == 0 || limit < w.limit) {
				w.limit = limit
			}
			if open && !w.open {
				w.open, w.staging = true, st
			}
		}
	}
	res := make([]wantedImage, 0, len(out))
	for _, im := range out {
		res = append(res, *byImage[im])
	}
	return res
}

// loop stages what the stagings ask, one image at a time, whenever they
// change and every StagingInterval.
func (s *imageStaging) loop(ctx context.Context) {
	if !cache.WaitForCacheSync(ctx.Done(), s.ctrl.HasSynced) && ctx.Err() != nil {
		return
	}
	t := time.NewTicker(s.a.cfg.ImageStagingInterval)
	defer t.Stop()
	for {
		s.stage(ctx)
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-t.C:
		}
	}
}

// stage pulls the wanted images the node lacks, within their windows.
func (s *imageStaging) stage(ctx context.Context) {
	now := time.Now()
	want := s.wanted(now)
	var keep []string
	changed := false
	for _, w := range want {
		keep = append(keep, w.image)
		if !w.open {
			continue
		}
		if at, ok := s.failed[w.image]; ok && now.Sub(at) < stagingRetry {
			continue
		}
		pulled, err := s.stager.StageImage(ctx, w.image, w.limit)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if _, again := s.failed[w.image]; !again {
				s.a.log.Warn("stage image", "image", w.image, "staging", w.staging.Name, "err", err)
				if r := s.a.eventRecorder(); r != nil {
					ref := &corev1.ObjectReference{APIVersion: fleetapi.Group + "/" + fleetapi.Version, Kind: fleetapi.ImageStagingKind.Kind,
						Name: w.staging.Name, UID: w.staging.UID}
					r.emit(ref, true, fleetapi.ReasonImageStagingFailed, fmt.Sprintf("node %s: pull %s: %v", s.a.name, w.image, err))
				}
			}
			s.failed[w.image] = now
			continue
		}
		delete(s.failed, w.image)
		changed = changed || pulled
	}
	if err := s.stager.SetStaged(ctx, keep); err != nil && ctx.Err() == nil {
		s.a.log.Warn("mark staged images", "err", err)
	}
	if changed {
		// The next status check lists the images again and writes
		// them if they changed.
		s.a.images.invalidate()
		select {
		case s.a.node.kick <- struct{}{}:
		default:
		}
	}
}

// nodeImages caches the runtime's image list for the node's status.
type nodeImages struct {
	mu    sync.Mutex
	list  []corev1.ContainerImage
	at    time.Time
	stale bool
}

func (n *nodeImages) invalidate() {
	n.mu.Lock()
	n.stale = true
	n.mu.Unlock()
}

// get returns the images the node holds, listed at most every
// imagesRefresh unless invalidated; nil for runtimes that do not say.
func (n *nodeImages) get(ctx context.Context, rt Runtime) []corev1.ContainerImage {
	st, ok := rt.(ImageStager)
	if !ok {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.stale && !n.at.IsZero() && time.Since(n.at) < imagesRefresh {
		return n.list
	}
	list, err := st.Images(ctx)
	if err != nil {
		return n.list
	}
	n.list, n.at, n.stale = list, time.Now(), false
	return list
}

// imageShare serves the node's image content to its site and hands its
// runtime the Sharer that fetches from the site first.
type imageShare struct {
	a     *Agent
	share *imageshare.Sharer
	ln    net.Listener
	srv   *http.Server
}

// newImageShare listens on the share port; nil when the node has no site
// gossip or the runtime shares no content.
func newImageShare(a *Agent) (*imageShare, error) {
	cs, ok := a.cfg.Runtime.(ContentSharer)
	if !ok || a.gossip == nil || a.cfg.ImageSharePort <= 0 {
		return nil, nil
	}
	is := &imageShare{a: a}
	is.share = imageshare.New(imageshare.Config{
		Node: a.name, Backend: cs.ContentShare(), Members: is.members, Identity: a.id, Log: a.log,
	})
	bind := a.cfg.GossipBind
	ln, err := net.Listen("tcp", net.JoinHostPort(bind, strconv.Itoa(a.cfg.ImageSharePort)))
	if err != nil {
		return nil, fmt.Errorf("listen for the site's image sharing: %w", err)
	}
	is.ln = tls.NewListener(ln, imageshare.ServerTLS(a.id))
	is.srv = &http.Server{Handler: is.share.Handler(), ReadHeaderTimeout: 30 * time.Second}
	cs.UseShare(is.share)
	return is, nil
}

func (is *imageShare) run(ctx context.Context, goRun func(func())) {
	goRun(func() {
		if err := is.srv.Serve(is.ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			is.a.log.Error("image share server stopped", "err", err)
		}
	})
	goRun(func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = is.srv.Shutdown(shutdown)
		st := is.share.Stats()
		is.a.log.Info("image share", "fromPeers", st.FromPeers, "bytesFromPeers", st.BytesFromPeers,
			"fromRegistry", st.FromRegistry, "bytesFromRegistry", st.BytesFromRegistry, "rejected", st.Rejected,
			"served", st.Served, "bytesServed", st.BytesServed)
	})
}

// members are the site's members gossip sees alive, with the share
// servers their Nodes publish.
func (is *imageShare) members() []imageshare.Peer {
	g := is.a.gossip
	alive := map[string]bool{is.a.name: true}
	for _, m := range g.site.View().Members {
		if m.State == sitedigest.Alive {
			alive[m.Node] = true
		}
	}
	out := []imageshare.Peer{{Node: is.a.name}}
	for _, o := range g.nodes.List() {
		n := o.(*corev1.Node)
		if n.Name == is.a.name || !alive[n.Name] || n.Labels[LabelZone] != is.a.cfg.Zone {
			continue
		}
		port, err := strconv.ParseUint(n.Annotations[AnnotationImageSharePort], 10, 16)
		if err != nil || port == 0 {
			continue
		}
		for _, ad := range n.Status.Addresses {
			if ad.Type == corev1.NodeInternalIP {
				out = append(out, imageshare.Peer{Node: n.Name, Addr: net.JoinHostPort(ad.Address, strconv.FormatUint(port, 10))})
				break
			}
		}
	}
	return out
}

// ImageShareStats are what the node's image sharing moved, zero without
// one.
func (a *Agent) ImageShareStats() imageshare.Stats {
	if a.share == nil {
		return imageshare.Stats{}
	}
	return a.share.share.Stats()
}

// collectImageShare adds the site image sharing's counters to /metrics.
func (a *Agent) collectImageShare(out sampleWriter) {
	if a.share == nil {
		return
	}
	st := a.share.share.Stats()
	out.counter("tether_edge_image_share_fetched_blobs_total", "Image blobs this node fetched, by source: its site's members or the registry.", float64(st.FromPeers), "source", "peer")
	out.counter("tether_edge_image_share_fetched_blobs_total", "Image blobs this node fetched, by source: its site's members or the registry.", float64(st.FromRegistry), "source", "registry")
	out.counter("tether_edge_image_share_fetched_bytes_total", "Bytes of image blobs this node fetched, by source.", float64(st.BytesFromPeers), "source", "peer")
	out.counter("tether_edge_image_share_fetched_bytes_total", "Bytes of image blobs this node fetched, by source.", float64(st.BytesFromRegistry), "source", "registry")
	out.counter("tether_edge_image_share_rejected_total", "Blobs from site members discarded because they did not match their digest.", float64(st.Rejected))
	out.counter("tether_edge_image_share_served_bytes_total", "Bytes of image blobs served to site members.", float64(st.BytesServed))
}
