// Package hollow runs many edge agents in one process against a hub: each
// is a real edge.Agent with the sim runtime, its own data directory, key,
// certificate and tunnel connection, sharing nothing a real agent on its
// own machine would not have. A fleet of them loads a hub with as many
// nodes as a large deployment, to measure joins, reconnect storms after a
// hub restart, and list/watch traffic.
package hollow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/sim"
)

// Config configures a Fleet. HubURL, Token, N and DataDir are required.
type Config struct {
	// HubURL is the hub's API address, https://HOST:PORT.
	HubURL string
	// Token is the join token every agent presents the first time.
	Token string
	// N is the number of agents.
	N int
	// DataDir holds one directory per agent, named after the node.
	DataDir string
	// NamePrefix starts every node name; empty means "hollow-".
	NamePrefix string
	// Sites spreads the nodes over that many zones (site-0, site-1, ...)
	// round-robin. Zero means one site per 10 nodes.
	Sites int
	// StartWindow spreads the agents' starts evenly over this duration.
	// Zero starts them all at once.
	StartWindow time.Duration
	// Sim configures each agent's runtime.
	Sim sim.Config
	// WatchServices makes every agent watch Services and EndpointSlices;
	// off by default, as a large fleet would make the hub send each change
	// to every agent.
	WatchServices bool
	// StatusInterval, StatusCheckInterval and HeartbeatInterval are passed
	// to the agents; zero means the agents' defaults.
	StatusInterval, StatusCheckInterval, HeartbeatInterval time.Duration
	// MetricsPeriod is how often each node pushes its pods' synthetic
	// usage (edge.Config.MetricsPeriod); zero: never.
	MetricsPeriod time.Duration
	// TunnelBackoffBase and TunnelBackoffCap shape the agents' reconnect
	// backoff; zero means the tunnel's defaults.
	TunnelBackoffBase, TunnelBackoffCap time.Duration
	// Gossip runs the site gossip of edge/site between the nodes of each
	// site: every node's InternalIP is then its own loopback address
	// (127.64.0.0/10, see gossipIP), which its gossip binds with
	// GossipPort, so that the fleet's gossip stays on the host as a
	// site's stays on its LAN. Off, the nodes keep addresses that are not
	// the host's and run no gossip.
	Gossip bool
	// GossipPort is every node's gossip port (each on its own address);
	// required with Gossip.
	GossipPort int
	// Logger receives the agents' logs. Nil discards them.
	Logger *slog.Logger
}

// Fleet is a set of hollow nodes.
type Fleet struct {
	cfg    Config
	agents []*edge.Agent
	failed atomic.Int64

	mu   sync.Mutex
	errs []error
}

// New creates the fleet's agents; nothing runs until Run.
func New(cfg Config) (*Fleet, error) {
	if cfg.N <= 0 || cfg.DataDir == "" || cfg.HubURL == "" {
		return nil, errors.New("create hollow fleet: N, DataDir and HubURL are required")
	}
	if cfg.Gossip && cfg.GossipPort <= 0 {
		return nil, errors.New("create hollow fleet: Gossip needs a GossipPort")
	}
	if cfg.NamePrefix == "" {
		cfg.NamePrefix = "hollow-"
	}
	if cfg.Sites <= 0 {
		cfg.Sites = max(1, cfg.N/10)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	f := &Fleet{cfg: cfg}
	for i := range cfg.N {
		name := fmt.Sprintf("%s%05d", cfg.NamePrefix, i)
		ip, gossipPort, gossipBind := nodeIP(i), -1, "" // hollow addresses are not on the host
		if cfg.Gossip {
			ip = gossipIP(i)
			gossipPort, gossipBind = cfg.GossipPort, ip.String()
		}
		a, err := edge.New(edge.Config{
			HubURL:              cfg.HubURL,
			Token:               cfg.Token,
			DataDir:             filepath.Join(cfg.DataDir, name),
			NodeName:            name,
			Runtime:             sim.New(cfg.Sim),
			Zone:                fmt.Sprintf("site-%d", i%cfg.Sites),
			NodeIP:              ip,
			GossipPort:          gossipPort,
			GossipBind:          gossipBind,
			StatusInterval:      cfg.StatusInterval,
			StatusCheckInterval: cfg.StatusCheckInterval,
			HeartbeatInterval:   cfg.HeartbeatInterval,
			MetricsPeriod:       cfg.MetricsPeriod,
			WatchServices:       cfg.WatchServices,
			TunnelBackoffBase:   cfg.TunnelBackoffBase,
			TunnelBackoffCap:    cfg.TunnelBackoffCap,
			Version:             "hollow",
			Logger:              cfg.Logger.With("node", name),
		})
		if err != nil {
			return nil, fmt.Errorf("create hollow node %s: %w", name, err)
		}
		f.agents = append(f.agents, a)
	}
	return f, nil
}

// nodeIP gives agent i a distinct address in 100.64.0.0/10, so that the
// hub sees as many nodes as there are agents.
func nodeIP(i int) netip.Addr {
	n := uint32(i) + 1
	return netip.AddrFrom4([4]byte{100, 64 | byte(n>>16&0x3f), byte(n >> 8), byte(n)})
}

// gossipIP gives agent i a distinct loopback address in 127.64.0.0/10:
// Linux routes all of 127.0.0.0/8 to the loopback interface, so each
// node's gossip binds its own address without any interface set up.
func gossipIP(i int) netip.Addr {
	a := nodeIP(i).As4()
	a[0] = 127
	return netip.AddrFrom4(a)
}

// Agents returns the fleet's agents.
func (f *Fleet) Agents() []*edge.Agent { return f.agents }

// Run starts the agents over StartWindow and runs them until ctx ends. It
// returns the errors of agents that stopped on their own.
func (f *Fleet) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	step := time.Duration(0)
	if f.cfg.N > 1 {
		step = f.cfg.StartWindow / time.Duration(f.cfg.N)
	}
	for i, a := range f.agents {
		if i > 0 && step > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(step):
			}
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Run(ctx); err != nil {
				f.failed.Add(1)
				f.mu.Lock()
				f.errs = append(f.errs, err)
				f.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.errs...)
}

// Stats are a fleet's counters, summed over its agents.
type Stats struct {
	Agents, Connected, Registered, Failed int
	// Connects and Disconnects count tunnel connections.
	Connects, Disconnects int64
	// Lists, Watches, Gets and Writes count API requests by kind.
	Lists, Watches, Gets, Writes int64
	// BytesSent and BytesReceived are the tunnels' wire bytes.
	BytesSent, BytesReceived uint64
	Pods                     int
	// GossipMembers sums the site members each agent's gossip sees
	// (itself included); GossipFormed counts the agents that see every
	// node of their site.
	GossipMembers, GossipFormed int
}

// Stats sums the agents' counters.
func (f *Fleet) Stats() Stats {
	s := Stats{Agents: len(f.agents), Failed: int(f.failed.Load())}
	for i, a := range f.agents {
		as := a.Stats()
		if as.Connected {
			s.Connected++
		}
		if as.Registered {
			s.Registered++
		}
		s.Connects += as.Connects
		s.Disconnects += as.Disconnects
		s.Lists += as.Lists
		s.Watches += as.Watches
		s.Gets += as.Gets
		s.Writes += as.Writes
		s.BytesSent += as.TunnelBytesSent
		s.BytesReceived += as.TunnelBytesReceived
		s.Pods += as.Pods
		s.GossipMembers += as.GossipMembers
		if as.GossipMembers > 0 && as.GossipMembers >= f.siteSize(i) {
			s.GossipFormed++
		}
	}
	return s
}

// Sites is the number of sites the nodes are spread over.
func (f *Fleet) Sites() int { return f.cfg.Sites }

// siteSize is the number of nodes in agent i's site.
func (f *Fleet) siteSize(i int) int {
	site := i % f.cfg.Sites
	n := f.cfg.N / f.cfg.Sites
	if site < f.cfg.N%f.cfg.Sites {
		n++
	}
	return n
}

func (s Stats) String() string {
	return fmt.Sprintf("agents=%d connected=%d registered=%d failed=%d connects=%d disconnects=%d lists=%d watches=%d gets=%d writes=%d sent=%dB received=%dB pods=%d gossip_members=%d gossip_formed=%d",
		s.Agents, s.Connected, s.Registered, s.Failed, s.Connects, s.Disconnects, s.Lists, s.Watches, s.Gets, s.Writes, s.BytesSent, s.BytesReceived, s.Pods, s.GossipMembers, s.GossipFormed)
}
