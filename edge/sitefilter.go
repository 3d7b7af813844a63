package edge

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge/site"
	"github.com/tether-edge/tether/internal/sitedigest"
)

// SiteView is the node's view of its site's gossip membership: which
// members of the site its peers see alive, suspect, dead or gone. The
// site's gossip (edge/site) provides it.
type SiteView interface {
	// View returns the current view.
	View() sitedigest.Digest
	// Changed returns a channel that is closed when the view changes;
	// call it again for the next change.
	Changed() <-chan struct{}
}

// siteFilter stands between the Service watches and the node's sinks (the
// eBPF dataplane and the DNS server): it passes Services on as they are,
// and EndpointSlices without the endpoints whose node the site's gossip
// sees Dead. When the view changes it passes on again, at once, the slices
// that have endpoints on the nodes that died or came back.
//
// This is what keeps a site that is cut off from the hub serving when one
// of its nodes dies: nobody updates the EndpointSlices then, so without it
// the load balancer and DNS would go on sending a share of every
// connection to pods that are gone. Suspect nodes (the gossip is not sure
// yet) and nodes that left cleanly (their pods were drained through the
// API) keep their endpoints; so do nodes the view does not know, such as
// those of other sites. While the hub is reachable its node lifecycle
// changes the slices too; the filter is a plain function of the slices
// and the view, so the two agree and nothing flaps.
type siteFilter struct {
	sinks []serviceSink
	self  string
	log   *slog.Logger

	// mu orders what the sinks get: a slice is passed on under it, so a
	// view change never overtakes a newer version of the slice.
	mu     sync.Mutex
	slices map[types.NamespacedName]*discoveryv1.EndpointSlice // as the watch gave them
	byNode map[string]map[types.NamespacedName]struct{}        // slices with endpoints on each node
	dead   map[string]bool

	leftOut *atomic.Int64 // endpoints left out now
}

func newSiteFilter(self string, sinks []serviceSink, log *slog.Logger, leftOut *atomic.Int64) *siteFilter {
	return &siteFilter{
		sinks:   sinks,
		leftOut: leftOut,
		self:    self,
		log:     log,
		slices:  map[types.NamespacedName]*discoveryv1.EndpointSlice{},
		byNode:  map[string]map[types.NamespacedName]struct{}{},
		dead:    map[string]bool{},
	}
}

// follow applies the view and every change of it until ctx ends.
func (f *siteFilter) follow(ctx context.Context, v SiteView) {
	for {
		changed := v.Changed() // before View: no change falls between
		f.setView(v.View())
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// setView takes a new view and passes on again the slices with endpoints
// on nodes that died or came back.
func (f *siteFilter) setView(d sitedigest.Digest) {
	dead := map[string]bool{}
	for _, m := range d.Members {
		if m.State == sitedigest.Dead && m.Node != f.self {
			dead[m.Node] = true
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var flipped []string
	for n := range dead {
		if !f.dead[n] {
			flipped = append(flipped, n)
		}
	}
	for n := range f.dead {
		if !dead[n] {
			flipped = append(flipped, n)
		}
	}
	if len(flipped) == 0 {
		return
	}
	slices.Sort(flipped)
	f.dead = dead
	touched := map[types.NamespacedName]struct{}{}
	for _, n := range flipped {
		for k := range f.byNode[n] {
			touched[k] = struct{}{}
		}
		if dead[n] {
			f.log.Info("site peer is dead: leaving its endpoints out of Services", "peer", n, "slices", len(f.byNode[n]))
		} else {
			f.log.Info("site peer is no longer dead: its endpoints count again", "peer", n, "slices", len(f.byNode[n]))
		}
	}
	keys := make([]types.NamespacedName, 0, len(touched))
	for k := range touched {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b types.NamespacedName) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	for _, k := range keys {
		f.passLocked(f.slices[k])
	}
	f.countLocked()
}

// passLocked gives the sinks s without the endpoints of dead nodes.
func (f *siteFilter) passLocked(s *discoveryv1.EndpointSlice) {
	out := f.filterLocked(s)
	for _, sink := range f.sinks {
		sink.UpsertEndpointSlice(out)
	}
}

// filterLocked returns s itself when none of its endpoints is on a dead
// node, or else a copy without them; s is never modified, since the
// informer's store holds it.
func (f *siteFilter) filterLocked(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	if len(f.dead) == 0 || !slices.ContainsFunc(s.Endpoints, f.deadEndpoint) {
		return s
	}
	out := *s
	out.Endpoints = make([]discoveryv1.Endpoint, 0, len(s.Endpoints))
	for _, ep := range s.Endpoints {
		if !f.deadEndpoint(ep) {
			out.Endpoints = append(out.Endpoints, ep)
		}
	}
	return &out
}

func (f *siteFilter) deadEndpoint(ep discoveryv1.Endpoint) bool {
	return ep.NodeName != nil && f.dead[*ep.NodeName]
}

// countLocked recounts the endpoints left out.
func (f *siteFilter) countLocked() {
	var n int64
	for node := range f.dead {
		for k := range f.byNode[node] {
			for _, ep := range f.slices[k].Endpoints {
				if ep.NodeName != nil && *ep.NodeName == node {
					n++
				}
			}
		}
	}
	f.leftOut.Store(n)
}

// indexLocked adds (or with add false removes) s under the nodes of its
// endpoints.
func (f *siteFilter) indexLocked(k types.NamespacedName, s *discoveryv1.EndpointSlice, add bool) {
	for _, ep := range s.Endpoints {
		if ep.NodeName == nil || *ep.NodeName == "" {
			continue
		}
		n := *ep.NodeName
		if add {
			if f.byNode[n] == nil {
				f.byNode[n] = map[types.NamespacedName]struct{}{}
			}
			f.byNode[n][k] = struct{}{}
		} else if m := f.byNode[n]; m != nil {
			delete(m, k)
			if len(m) == 0 {
				delete(f.byNode, n)
			}
		}
	}
}

// UpsertService passes svc on.
func (f *siteFilter) UpsertService(svc *corev1.Service) {
	for _, sink := range f.sinks {
		sink.UpsertService(svc)
	}
}

// DeleteService passes the delete on.
func (f *siteFilter) DeleteService(namespace, name string) {
	for _, sink := range f.sinks {
		sink.DeleteService(namespace, name)
	}
}

// UpsertEndpointSlice records s and passes it on without the endpoints of
// dead nodes.
func (f *siteFilter) UpsertEndpointSlice(s *discoveryv1.EndpointSlice) {
	k := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	f.mu.Lock()
	defer f.mu.Unlock()
	if old := f.slices[k]; old != nil {
		f.indexLocked(k, old, false)
	}
	f.slices[k] = s
	f.indexLocked(k, s, true)
	f.passLocked(s)
	if len(f.dead) > 0 {
		f.countLocked()
	}
}

// DeleteEndpointSlice forgets the slice and passes the delete on.
func (f *siteFilter) DeleteEndpointSlice(namespace, name string) {
	k := types.NamespacedName{Namespace: namespace, Name: name}
	f.mu.Lock()
	defer f.mu.Unlock()
	if old := f.slices[k]; old != nil {
		f.indexLocked(k, old, false)
		delete(f.slices, k)
	}
	for _, sink := range f.sinks {
		sink.DeleteEndpointSlice(namespace, name)
	}
	if len(f.dead) > 0 {
		f.countLocked()
	}
}

var (
	_ serviceSink = (*siteFilter)(nil)
	// The site's gossip is the view the agent follows.
	_ SiteView = (*site.Site)(nil)
)
