// Package site runs an edge agent's side of its site's gossip: the agents
// of one site (the nodes sharing a topology.kubernetes.io/zone label) form
// a hashicorp/memberlist cluster on the site's LAN, so that they can tell
// each other's death from a cut uplink without asking the hub.
//
// memberlist is used because it is SWIM with the Lifeguard refinements:
// every member probes one random peer per interval and asks others to
// probe indirectly before suspecting it, so a site of any size detects a
// dead member in a few seconds with constant traffic per member, and it
// carries AES-GCM encryption with a rotatable keyring. A site keeps working
// when its uplink is down: the view needs no hub.
//
// Timings (LAN, see lanConfig): probe every 1s with a 500ms timeout,
// suspicion for 3 probe intervals (up to 9 while no other member confirms
// it), gossip every 200ms to 3 members, push/pull every 15s. A member
// killed without leaving is Suspect after about 1-2s and Dead in every
// view after about 5-8s.
//
// Gossip is always encrypted with the site's keys (the hub's site key
// Secret): Run waits for SetKeys before it opens a socket. Packets and
// streams that no installed key opens are dropped before memberlist sees
// them and counted (Stats.DroppedKey); alive announcements of nodes that
// are not in the peer set (SetPeers) are refused and counted
// (Stats.DroppedNonMember), so a node with the key but not of the site
// does not become a member.
//
// View is this member's view: every member memberlist knows (and every
// member it has forgotten after declaring it dead) with its state and
// incarnation: memberlist's, behind the member's generation (its count of
// starts, Config.Generation), so that it grows across restarts. Each
// member gossips in its node meta whether its tunnel to the hub is up
// (SetConnected); the connected member with the lowest name that is not
// dead or gone is the site's Sender, the one that reports the view to the
// hub.
//
// Packets and streams travel over the site's own memberlist Transport
// (transport.go) rather than memberlist's NetTransport, which allocates
// a 64 KiB buffer for every packet it reads; see transport for what that
// cost an idle agent.
package site

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/tether-edge/tether/internal/sitedigest"
)

// DefaultPort is memberlist's usual port.
const DefaultPort = 7946

// Config configures a Site.
type Config struct {
	// Site is the site's name (the zone label value). Required.
	Site string
	// Node is this member's name, the Node's name. Required.
	Node string
	// BindAddr is the address gossip listens on. Empty: all addresses.
	BindAddr string
	// BindPort is the gossip port (UDP and TCP). Zero: DefaultPort.
	BindPort int
	// AdvertiseAddr is the address other members reach this one at.
	// Empty: memberlist picks one (BindAddr when it is not a wildcard).
	AdvertiseAddr string
	// Keys are the site's gossip keys (16, 24 or 32 bytes), the one to
	// encrypt with first. Gossip starts once there is a key.
	Keys [][]byte
	// Peers are other members' host:port addresses.
	Peers []string
	// Generation counts this member's starts; the caller keeps it across
	// restarts. A member's incarnation in View carries it in its high 16
	// bits, so that it grows across restarts of the whole site.
	Generation uint16
	// RetryInterval is how often peers that are not alive members are
	// joined. Zero: 5s.
	RetryInterval time.Duration
	// PollInterval is how often the view is read from memberlist besides
	// its events (suspicion has no event). Zero: 250ms.
	PollInterval time.Duration
	// KeyGrace is how long a new primary key is only installed before it
	// is used, so that the other members can install it too. Zero: 5s.
	KeyGrace time.Duration
	// Log receives the site's own log lines; memberlist's go to it at
	// debug level. Nil: slog.Default().
	Log *slog.Logger

	// deadForget, when set (by tests), is how long memberlist keeps a
	// dead member (GossipToTheDeadTime).
	deadForget time.Duration
}

// Stats are the site's counters.
type Stats struct {
	// Members is the number of members this one sees alive or suspect,
	// itself included.
	Members int
	// DroppedKey counts packets and streams that no installed key opens.
	DroppedKey uint64
	// DroppedNonMember counts alive announcements refused because the node
	// is not in the peer set.
	DroppedNonMember uint64
}

// Site is one member of a site's gossip cluster.
type Site struct {
	cfg Config
	log *slog.Logger

	keyring *memberlist.Keyring // set when gossip starts
	started chan struct{}       // closed when ml is set

	droppedKey       atomic.Uint64
	droppedNonMember atomic.Uint64

	mu      sync.Mutex
	ml      *memberlist.Memberlist
	table   *nodeTable // ml's node table, read by refresh alone
	keys    [][]byte   // latest keys
	keysSet chan struct{}
	peers   []string
	peerSet map[string]bool
	// peersChanged is set when SetPeers changes the peers, for refresh.
	peersChanged bool
	connected    bool
	leaving      bool
	view         sitedigest.Digest
	metas        map[string]meta   // last meta of each member
	addrs        map[string]string // last host:port of each member
	changed      chan struct{}
	grace        *time.Timer
	poke         chan struct{}
	joinNow      chan struct{}
	killed       chan struct{}
}

// New validates cfg and returns a Site; Run starts it.
func New(cfg Config) (*Site, error) {
	if cfg.Site == "" || cfg.Node == "" {
		return nil, errors.New("create site: site and node names are required")
	}
	if cfg.BindPort == 0 {
		cfg.BindPort = DefaultPort
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = 5 * time.Second
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 250 * time.Millisecond
	}
	if cfg.KeyGrace == 0 {
		cfg.KeyGrace = 5 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &Site{
		cfg:     cfg,
		log:     cfg.Log.With("site", cfg.Site),
		started: make(chan struct{}),
		keysSet: make(chan struct{}, 1),
		metas:   map[string]meta{},
		addrs:   map[string]string{},
		changed: make(chan struct{}),
		poke:    make(chan struct{}, 1),
		joinNow: make(chan struct{}, 1),
		killed:  make(chan struct{}),
		view: sitedigest.Digest{Site: cfg.Site, Members: []sitedigest.Member{
			{Node: cfg.Node, State: sitedigest.Alive}}},
	}
	if err := s.SetKeys(cfg.Keys); err != nil {
		return nil, err
	}
	s.SetPeers(cfg.Peers)
	return s, nil
}

// Run gossips until ctx ends, then leaves the cluster. It waits for a key
// before it opens the gossip port.
func (s *Site) Run(ctx context.Context) error {
	for {
		s.mu.Lock()
		keys := s.keys
		s.mu.Unlock()
		if len(keys) > 0 {
			break
		}
		s.log.Info("site gossip waits for the site key: gossip is never sent unencrypted")
		select {
		case <-ctx.Done():
			return nil
		case <-s.keysSet:
		}
	}
	ml, err := s.start()
	if err != nil {
		return err
	}
	defer s.stop(ml)

	retry := time.NewTicker(s.cfg.RetryInterval)
	defer retry.Stop()
	poll := time.NewTicker(s.cfg.PollInterval)
	defer poll.Stop()
	var joining atomic.Bool
	join := func() {
		if joining.CompareAndSwap(false, true) {
			go func() {
				defer joining.Store(false)
				s.joinMissing(ml)
			}()
		}
	}
	join()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.killed:
			return nil
		case <-retry.C:
			join()
		case <-s.joinNow:
			join()
		case <-poll.C:
		case <-s.poke:
		}
		s.refresh()
	}
}

// start creates the memberlist with the current keys.
func (s *Site) start() (*memberlist.Memberlist, error) {
	s.mu.Lock()
	keys := slices.Clone(s.keys)
	s.mu.Unlock()
	kr, err := memberlist.NewKeyring(keys, keys[0])
	if err != nil {
		return nil, fmt.Errorf("create site keyring: %w", err)
	}
	mlLog := log.New(slogWriter{s.log}, "", 0)
	inner, err := newTransport(bindAddr(s.cfg.BindAddr), s.cfg.BindPort, mlLog)
	if err != nil {
		return nil, fmt.Errorf("open site gossip port: %w", err)
	}
	c := lanConfig()
	if s.cfg.deadForget > 0 {
		c.GossipToTheDeadTime = s.cfg.deadForget
	}
	c.Name = s.cfg.Node
	c.BindAddr = bindAddr(s.cfg.BindAddr)
	c.BindPort = inner.port()
	c.AdvertisePort = c.BindPort
	if s.cfg.AdvertiseAddr != "" {
		c.AdvertiseAddr = s.cfg.AdvertiseAddr
	}
	c.Keyring = kr
	c.Transport = newGate(inner, kr, &s.droppedKey)
	c.Logger = mlLog
	d := delegate{s}
	c.Delegate = d
	c.Events = d
	c.Alive = d
	s.keyring = kr
	ml, err := memberlist.Create(c)
	if err != nil {
		_ = c.Transport.Shutdown()
		return nil, fmt.Errorf("start site gossip: %w", err)
	}
	table, err := newNodeTable(ml)
	if err != nil {
		_ = ml.Shutdown()
		return nil, fmt.Errorf("start site gossip: %w", err)
	}
	s.mu.Lock()
	s.ml, s.table = ml, table
	keysNow := s.keys
	s.mu.Unlock()
	close(s.started)
	// Keys set between the snapshot and now.
	s.installKeys(keysNow, false)
	s.log.Info("site gossip started", "addr", net.JoinHostPort(ml.LocalNode().Addr.String(), strconv.Itoa(int(ml.LocalNode().Port))))
	return ml, nil
}

// stop leaves the cluster (members see this one Left) and closes the port.
func (s *Site) stop(ml *memberlist.Memberlist) {
	select {
	case <-s.killed:
		return
	default:
	}
	s.mu.Lock()
	s.leaving = true
	s.mu.Unlock()
	if err := ml.Leave(2 * time.Second); err != nil {
		s.log.Warn("leave site gossip", "err", err)
	}
	if err := ml.Shutdown(); err != nil {
		s.log.Warn("stop site gossip", "err", err)
	}
}

// Kill stops gossip without leaving, as a crash or power loss would: the
// other members declare this one dead, and Run returns. For tests and the
// lab; call it once.
func (s *Site) Kill() {
	<-s.started
	s.mu.Lock()
	ml := s.ml
	s.mu.Unlock()
	_ = ml.Shutdown()
	close(s.killed)
}

// lanConfig is memberlist's LAN configuration tuned so that a dead member
// is declared dead within about 5-8s (see the package doc).
func lanConfig() *memberlist.Config {
	c := memberlist.DefaultLANConfig()
	c.ProbeInterval = time.Second
	c.ProbeTimeout = 500 * time.Millisecond
	c.SuspicionMult = 3
	c.SuspicionMaxTimeoutMult = 3
	c.GossipInterval = 200 * time.Millisecond
	c.GossipNodes = 3
	c.PushPullInterval = 15 * time.Second
	c.GossipToTheDeadTime = 15 * time.Second
	c.DeadNodeReclaimTime = 15 * time.Second
	c.TCPTimeout = 3 * time.Second
	c.GossipVerifyIncoming = true
	c.GossipVerifyOutgoing = true
	// A site's messages are small and stay on its LAN: compressing each
	// one (LZW, with a fresh table per message) cost a gossiping agent
	// more CPU than anything else it did at rest. Compressed messages
	// from other members are still read.
	c.EnableCompression = false
	return c
}

func bindAddr(a string) string {
	if a == "" {
		return "0.0.0.0"
	}
	return a
}

// joinMissing joins the peers that are not alive members. A node that
// reaches none keeps working alone and tries again at the next retry.
func (s *Site) joinMissing(ml *memberlist.Memberlist) {
	alive := map[string]bool{}
	for _, n := range ml.Members() {
		alive[n.Address()] = true
	}
	self := ml.LocalNode().Address()
	s.mu.Lock()
	var missing []string
	for _, p := range s.peers {
		if !alive[p] && p != self {
			missing = append(missing, p)
		}
	}
	s.mu.Unlock()
	if len(missing) == 0 {
		return
	}
	if n, err := ml.Join(missing); n == 0 && err != nil {
		s.log.Debug("join site peers", "peers", missing, "err", err)
	}
}

// SetPeers sets the other members' host:port addresses: the ones not yet
// members are joined, and only nodes at these addresses are accepted as
// members.
func (s *Site) SetPeers(peers []string) {
	set := make(map[string]bool, len(peers))
	var list []string
	for _, p := range peers {
		if host, port, err := net.SplitHostPort(p); err == nil {
			p = net.JoinHostPort(host, port)
		}
		if !set[p] {
			set[p] = true
			list = append(list, p)
		}
	}
	slices.Sort(list)
	s.mu.Lock()
	if !slices.Equal(list, s.peers) || s.peerSet == nil {
		s.peers, s.peerSet, s.peersChanged = list, set, true
	}
	s.mu.Unlock()
	select {
	case s.joinNow <- struct{}{}:
	default:
	}
}

// Peers returns the peer addresses last set.
func (s *Site) Peers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.peers)
}

// SetConnected says whether this agent's tunnel to the hub is up; the
// other members learn it from this member's meta.
func (s *Site) SetConnected(up bool) {
	s.mu.Lock()
	if s.connected == up {
		s.mu.Unlock()
		return
	}
	s.connected = up
	ml := s.ml
	s.mu.Unlock()
	if ml != nil {
		go func() {
			if err := ml.UpdateNode(2 * time.Second); err != nil {
				s.log.Debug("gossip site meta", "err", err)
			}
		}()
	}
	s.kick()
}

// Sender reports whether this member sends the site's view to the hub:
// it is the member with the lowest name among those whose tunnel is up
// and that the site has not declared dead or seen leave. A suspect member
// keeps the role: on a loaded or lossy LAN suspicions come and go within
// seconds, and each change of sender would cost the uplink a report of
// the whole view from a member that sends it for a moment. A sender that
// really died hands the role on once the site declares it dead, which is
// also the first moment its death can be reported.
func (s *Site) Sender() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.view.Members {
		if (m.State == sitedigest.Alive || m.State == sitedigest.Suspect) && s.metas[m.Node].connected {
			return m.Node == s.cfg.Node
		}
	}
	return false
}

// View returns this member's view of the site, normalized.
func (s *Site) View() sitedigest.Digest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sitedigest.Digest{Site: s.view.Site, Members: slices.Clone(s.view.Members)}
}

// Changed returns a channel closed at the next change of View (or of a
// member's connected flag); call it again for the change after.
func (s *Site) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Stats returns the site's counters.
func (s *Site) Stats() Stats {
	s.mu.Lock()
	n := 0
	for _, m := range s.view.Members {
		if m.State == sitedigest.Alive || m.State == sitedigest.Suspect {
			n++
		}
	}
	s.mu.Unlock()
	return Stats{Members: n, DroppedKey: s.droppedKey.Load(), DroppedNonMember: s.droppedNonMember.Load()}
}

// Addr returns the address gossip listens on, once started.
func (s *Site) Addr(ctx context.Context) (string, error) {
	select {
	case <-s.started:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	s.mu.Lock()
	ml := s.ml
	s.mu.Unlock()
	// Not under s.mu: memberlist calls the delegate, which takes s.mu,
	// while it holds its node lock.
	return ml.LocalNode().Address(), nil
}

func (s *Site) kick() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// slogWriter sends memberlist's log lines to slog at debug level.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Debug("memberlist", "msg", string(trimNewline(p)))
	return len(p), nil
}

func trimNewline(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return p
}

var _ io.Writer = slogWriter{}
