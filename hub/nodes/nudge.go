package nodes

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/storage"
)

// NudgeConfig configures a Nudges.
type NudgeConfig struct {
	// Storage is watched for Nodes. Required.
	Storage storage.API
	// Connected reports whether this hub holds node's tunnel. Required.
	Connected func(node string) bool
	// Send asks node's agent to write its status again. Required.
	Send func(ctx context.Context, node string) error
	// Timeout bounds one Send; zero means 5s.
	Timeout time.Duration
	// Concurrency bounds the Sends in flight; zero means 32. A loaded hub
	// that marks many connected nodes Unknown at once asks them a few at
	// a time rather than dialling every tunnel in one burst.
	Concurrency int
	// Logger receives logs; nil means slog.Default().
	Logger *slog.Logger
}

// Nudges tells an agent to write its node status again when its Node's
// Ready condition turns Unknown while the node's tunnel is up on this hub.
//
// The node lifecycle controller marks a node Unknown when its heartbeats
// came late (a loaded hub, a slow link) or its site's members said it
// was gone; an agent writes its status only when it changed or every
// five minutes, and nothing it sees changed. Without a word from the hub
// a node that is alive and connected would read Unknown, and keep its
// unreachable taint, for up to five minutes. A watch of its own Node by
// every agent would tell it too, at about 70 KB of hub memory per node;
// this costs one watch per hub, and only the hub that holds a node's
// tunnel sends, so it holds however many hubs there are.
type Nudges struct {
	cfg NudgeConfig
	log *slog.Logger

	mu      sync.Mutex
	unknown map[string]bool // nodes whose Ready reads Unknown now
	slots   chan struct{}   // one per Send in flight

	sent, failed atomic.Int64
}

// NewNudges returns a Nudges that acts once Run is called.
func NewNudges(cfg NudgeConfig) *Nudges {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Nudges{cfg: cfg, log: log.With("component", "node-nudges"), unknown: map[string]bool{},
		slots: make(chan struct{}, cfg.Concurrency)}
}

// Run follows Nodes until ctx ends (see storage.Follow).
func (n *Nudges) Run(ctx context.Context) {
	storage.Follow(ctx, n.cfg.Storage, nodesKind, "", storage.FollowOptions{Shared: true, Logger: n.log},
		storage.FollowFuncs{
			ReplaceFunc: func(list runtime.Object) error {
				items := list.(*corev1.NodeList).Items
				n.mu.Lock()
				clear(n.unknown)
				for i := range items {
					if readyUnknown(&items[i]) {
						n.unknown[items[i].Name] = true
					}
				}
				n.mu.Unlock()
				return nil
			},
			ApplyFunc: func(ev watch.EventType, obj runtime.Object) {
				if node, ok := obj.(*corev1.Node); ok {
					n.apply(ctx, ev, node)
				}
			},
		})
}

// apply sends a nudge when node's Ready condition has just turned
// Unknown. Nodes already Unknown when the hub started, or when its watch
// started again, are left alone: an agent asks for a full write at every
// connect.
func (n *Nudges) apply(ctx context.Context, ev watch.EventType, node *corev1.Node) {
	now := ev != watch.Deleted && readyUnknown(node)
	n.mu.Lock()
	was := n.unknown[node.Name]
	if now {
		n.unknown[node.Name] = true
	} else {
		delete(n.unknown, node.Name)
	}
	n.mu.Unlock()
	if !now || was || !n.cfg.Connected(node.Name) {
		return
	}
	go n.send(ctx, node.Name)
}

func (n *Nudges) send(ctx context.Context, node string) {
	select {
	case n.slots <- struct{}{}:
		defer func() { <-n.slots }()
	case <-ctx.Done():
		return
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	if err := n.cfg.Send(ctx, node); err != nil {
		n.failed.Add(1)
		// The tunnel of a node that died without closing it is still up
		// for a while: the nudge goes unanswered, as it should.
		n.log.Debug("ask a node to report its status", "node", node, "err", err)
		return
	}
	n.sent.Add(1)
}

// Collectors returns the nudge counters for the hub's /metrics.
func (n *Nudges) Collectors() []prometheus.Collector {
	return countersBy("tether_node_status_nudges_total",
		"Requests to connected agents to write their node status again after their Node turned Unknown, by result.",
		"result", map[string]func() int64{"sent": n.sent.Load, "failed": n.failed.Load})
}

func readyUnknown(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionUnknown
		}
	}
	return false
}
