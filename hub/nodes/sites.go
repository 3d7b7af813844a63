package nodes

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/controllers/nodelifecycle"
	"github.com/tether-edge/tether/internal/sitedigest"
)

// SitesConfig configures Sites.
type SitesConfig struct {
	// Zones tells each Node's site. Required; it must be running.
	Zones *Zones
	// Live reports whether node's tunnel is up and its heartbeats arrive
	// (Leases.Alive). Required.
	Live func(node string) bool
	// Probe asks node's agent to answer over its tunnel now (nil error:
	// it did). A node its site says is dead is taken as dead only once a
	// probe goes unanswered, so the hub never acts on the peers' word
	// alone: a node whose LAN is cut but whose uplink works answers.
	// Nil means no probing: the peers' word is passed on as it is.
	Probe func(ctx context.Context, node string) error
	// ProbeTimeout bounds a probe; zero means 3s.
	ProbeTimeout time.Duration
	// LastHeartbeat, when set, tells when the hub last heard node's
	// heartbeat (Leases.LastHeartbeat). A heartbeat heard after an
	// unanswered probe started overrides the probe: the node lives, its
	// agent only answered late (an overloaded machine), and it is not
	// taken as dead until a new probe goes unanswered with no heartbeat
	// after it.
	LastHeartbeat func(node string) time.Time
	// Logger receives logs; nil means slog.Default().
	Logger *slog.Logger
}

// probe is what the hub learnt by asking a node its site says is dead.
type probe struct {
	incarnation uint32
	done        bool
	answered    bool
	started     time.Time
	finished    time.Time
}

// probeAgain is how long an answered probe stands before a node still
// said to be dead is asked again.
const probeAgain = 10 * time.Second

// Sites holds each site's latest view of its members, gathered from the
// digests (sitedigest) that the sites' agents report over their tunnels,
// and answers the node lifecycle controller's question: what do a node's
// site peers say of it? Everything is in memory: a digest costs no store
// write, and a restarted hub learns the views again as the edges
// reconnect, since their tunnel clients send their latest report at every
// connect.
//
// A digest is taken only from a node of its site (the reporter's Node
// carries the site as its topology.kubernetes.io/zone label), and only
// about nodes of that site. Views merge member by member with
// sitedigest.Newer, so a reporter with an older view cannot bring back a
// node its site already saw dead, while a node that came back (a higher
// incarnation) is alive again.
type Sites struct {
	cfg SitesConfig
	log *slog.Logger

	mu sync.Mutex
	// views maps a site to its members' latest states.
	views map[string]map[string]sitedigest.Member
	// last is the hash of the last payload of each reporter: a digest
	// identical to it is dropped unread.
	last map[string][sha256.Size]byte
	// held keeps the last digest refused because its reporter was not (or
	// not yet) a node of the digest's site; it is tried again when the
	// reporter's Node appears or changes zone, since an agent reports as
	// soon as it connects, which may be before its Node is registered.
	held map[string][]byte
	// digests keeps each site's last accepted digest, so that a member
	// whose Node registers after the digest came is taken in then.
	digests map[string]sitedigest.Digest

	// probes holds, by node, the probe of a node its site says is dead.
	probes map[string]*probe

	accepted, duplicate, rejected, ignored atomic.Uint64
}

// NewSites returns an empty Sites and subscribes it to cfg.Zones.
func NewSites(cfg SitesConfig) *Sites {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 3 * time.Second
	}
	s := &Sites{
		cfg:   cfg,
		log:   cfg.Logger,
		views: map[string]map[string]sitedigest.Member{},
		last:  map[string][sha256.Size]byte{},
		held:  map[string][]byte{},

		digests: map[string]sitedigest.Digest{},
		probes:  map[string]*probe{},
	}
	cfg.Zones.OnChange(s.nodeChanged)
	return s
}

// Report takes a digest payload reported by node (the tunnel's
// authenticated node). It does not block.
func (s *Sites) Report(reporter string, payload []byte) {
	sum := sha256.Sum256(payload)
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.last[reporter]; ok && prev == sum {
		s.duplicate.Add(1)
		return
	}
	s.last[reporter] = sum
	delete(s.held, reporter)
	s.applyLocked(reporter, payload)
}

// applyLocked decodes, checks and merges one digest.
func (s *Sites) applyLocked(reporter string, payload []byte) {
	d, err := sitedigest.Unmarshal(payload)
	if err != nil {
		s.rejected.Add(1)
		s.log.Info("site digest refused", "node", reporter, "err", err)
		return
	}
	zone, known := s.cfg.Zones.Zone(reporter)
	if !known || zone != d.Site {
		s.rejected.Add(1)
		s.held[reporter] = payload
		why := fmt.Sprintf("node %s is in site %q", reporter, zone)
		if !known {
			why = fmt.Sprintf("node %s is not registered", reporter)
		}
		s.log.Info("site digest refused", "node", reporter, "site", d.Site, "err", why)
		return
	}
	for _, m := range d.Members {
		if z, ok := s.cfg.Zones.Zone(m.Node); !ok || z != d.Site {
			s.ignored.Add(1)
			continue
		}
		s.mergeLocked(d.Site, m)
	}
	s.digests[d.Site] = d
	s.accepted.Add(1)
}

// mergeLocked takes m into site's view unless the view knows better.
func (s *Sites) mergeLocked(site string, m sitedigest.Member) {
	view := s.views[site]
	if view == nil {
		view = map[string]sitedigest.Member{}
		s.views[site] = view
	}
	if cur, ok := view[m.Node]; ok && !sitedigest.Newer(m, cur) {
		return
	}
	view[m.Node] = m
}

// nodeChanged follows Zones: a node that left a site leaves its view, and
// a held digest of the node is tried again.
func (s *Sites) nodeChanged(node, from, to string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if from != to {
		if v := s.views[from]; v != nil && from != "" {
			delete(v, node)
			if len(v) == 0 {
				delete(s.views, from)
			}
		}
	}
	if _, known := s.cfg.Zones.Zone(node); !known {
		delete(s.last, node)
		delete(s.held, node)
		return
	}
	if d, ok := s.digests[to]; ok && to != "" {
		if i, found := slices.BinarySearchFunc(d.Members, node, func(m sitedigest.Member, n string) int {
			return strings.Compare(m.Node, n)
		}); found {
			s.mergeLocked(to, d.Members[i])
		}
	}
	if p, ok := s.held[node]; ok {
		delete(s.held, node)
		s.applyLocked(node, p)
	}
}

// Peers reports what node's site says of it: PeersSeeAlive or
// PeersSeeDead from the site's view; PeersUnknown when the node has no
// site, the site has sent no view or none that names the node, no member
// of the site is heard by the hub now (a view from a site that went dark
// is no evidence of anything), or the view has the node suspect or gone
// cleanly (left: its agent stopped, which says nothing of its
// containers). A node said to be dead reads dead only once the hub's own
// probe of it went unanswered (see SitesConfig.Probe) and no heartbeat of
// it came after the probe started (SitesConfig.LastHeartbeat); until then
// it is unknown. It does not block: a probe runs in the background.
func (s *Sites) Peers(node string) nodelifecycle.PeerView {
	zone, known := s.cfg.Zones.Zone(node)
	if !known || zone == "" {
		return nodelifecycle.PeersUnknown
	}
	s.mu.Lock()
	m, ok := s.views[zone][node]
	s.mu.Unlock()
	if !ok || !s.cfg.Zones.AnyMember(zone, s.cfg.Live) {
		return nodelifecycle.PeersUnknown
	}
	switch m.State {
	case sitedigest.Alive:
		return nodelifecycle.PeersSeeAlive
	case sitedigest.Dead:
		return s.confirmDead(node, m.Incarnation)
	}
	return nodelifecycle.PeersUnknown
}

// confirmDead returns PeersSeeDead once a probe of node, said to be dead
// at incarnation, went unanswered, and starts one when none stands.
func (s *Sites) confirmDead(node string, incarnation uint32) nodelifecycle.PeerView {
	if s.cfg.Probe == nil {
		return nodelifecycle.PeersSeeDead
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.probes[node]
	heardSince := func(t time.Time) bool {
		return s.cfg.LastHeartbeat != nil && s.cfg.LastHeartbeat(node).After(t)
	}
	switch {
	case p != nil && p.incarnation == incarnation && p.done && !p.answered && !heardSince(p.started):
		return nodelifecycle.PeersSeeDead
	case p != nil && p.incarnation == incarnation && (!p.done || now.Sub(p.finished) < probeAgain):
		return nodelifecycle.PeersUnknown
	}
	p = &probe{incarnation: incarnation, started: now}
	s.probes[node] = p
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ProbeTimeout)
		err := s.cfg.Probe(ctx, node)
		cancel()
		s.mu.Lock()
		p.done, p.answered, p.finished = true, err == nil, time.Now()
		s.mu.Unlock()
		if err == nil {
			s.log.Info("node its site says is dead answered the hub", "node", node)
		} else {
			s.log.Info("node its site says is dead did not answer the hub", "node", node, "err", err)
		}
	}()
	return nodelifecycle.PeersUnknown
}

// SiteDigestStats are Sites' counters.
type SiteDigestStats struct {
	Accepted, Duplicate, Rejected uint64
	// IgnoredMembers counts members of accepted digests that were not
	// nodes of the digest's site.
	IgnoredMembers uint64
}

// Stats returns the counters.
func (s *Sites) Stats() SiteDigestStats {
	return SiteDigestStats{Accepted: s.accepted.Load(), Duplicate: s.duplicate.Load(),
		Rejected: s.rejected.Load(), IgnoredMembers: s.ignored.Load()}
}

// Collectors returns the digest counters for the hub's /metrics.
func (s *Sites) Collectors() []prometheus.Collector {
	return append(countersBy("tether_site_digests_total",
		"Site digests reported by edges, by result: accepted, duplicate (identical to the reporter's previous one, dropped unread) "+
			"or rejected (undecodable, or the reporter is not a node of the digest's site).",
		"result", map[string]func() uint64{"accepted": s.accepted.Load, "duplicate": s.duplicate.Load, "rejected": s.rejected.Load}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tether_site_digest_members_ignored_total",
			Help: "Members of accepted site digests that are not nodes of the digest's site.",
		}, func() float64 { return float64(s.ignored.Load()) }))
}
