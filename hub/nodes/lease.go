package nodes

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/storage"
)

// Leases keeps the Lease in kube-node-lease of every node whose tunnel is
// up and whose heartbeats arrive. The agent sends a few bytes on its
// tunnel's control stream instead of writing its Lease through the API
// every ten seconds, which is most of an idle node's uplink traffic with
// upstream's kubelet; the hub turns them into the same Lease renewals, so
// the node lifecycle controller and kubectl see what they expect.
//
// Renewals are kept in memory and served by the storage that Serve
// returns (see the package documentation, "Node Leases"); the store is
// written only when a Lease must be created or its holder or duration
// set, and once per tunnel session.
type Leases struct {
	cfg Config

	mu    sync.Mutex
	nodes map[string]*leaseState
	kick  chan struct{}

	// What Serve answers with, guarded by mu: the stored Leases of
	// kube-node-lease as the hub's own watch last saw them, the renewals
	// made since in memory, and the watches to tell of new renewals.
	stored   map[string]*coordinationv1.Lease
	synced   bool
	renewals map[string]renewal
	watches  map[*leaseWatch]struct{}
	// writes counts clients' writes under way per node Lease; written
	// holds the resourceVersion of a client's last write until the
	// stored Leases show it.
	writes  map[string]int
	written map[string]writtenMark

	// vouched holds the nodes other hubs hold, each with when their
	// hub's word expires; vouchRenewed when their Lease was last renewed
	// here on that word (see leasevouch.go).
	vouched      map[string]time.Time
	vouchRenewed map[string]time.Time

	memoryRenewals atomic.Int64
	storeRenewals  atomic.Int64
}

type leaseState struct {
	// conns counts the node's open tunnel sessions: a reconnecting agent's
	// new session may open before the old one is closed.
	conns         int
	lastHeartbeat time.Time
	renewed       time.Time // when the hub last renewed the Lease
	// persist asks the next renewal to go to the store: the first one of
	// every tunnel session does.
	persist bool
	writing bool
}

// writtenMark is a client's write of a Lease the stored Leases do not
// show yet.
type writtenMark struct {
	rv int64
	at time.Time
}

// renewal is a renewal of a stored Lease made in memory.
type renewal struct {
	renewTime metav1.MicroTime
	// base is the resourceVersion of the stored Lease it renews: a write
	// to the Lease makes the renewal void.
	base int64
	// at is the store revision when it was made, or later: a watch that
	// resumes from a revision not newer than at may not have seen it.
	at int64
}

// NewLeases returns a Lease keeper; Run does the renewing.
func NewLeases(cfg Config) *Leases {
	cfg.setDefaults()
	return &Leases{cfg: cfg, nodes: map[string]*leaseState{}, kick: make(chan struct{}, 1),
		stored: map[string]*coordinationv1.Lease{}, renewals: map[string]renewal{}, watches: map[*leaseWatch]struct{}{},
		writes: map[string]int{}, written: map[string]writtenMark{}}
}

// Connected records that node's tunnel came up; its Lease is renewed at
// once, in the store.
func (l *Leases) Connected(node string) {
	l.mu.Lock()
	st := l.state(node)
	st.conns++
	st.lastHeartbeat = l.cfg.Now()
	st.renewed = time.Time{}
	st.persist = true
	l.mu.Unlock()
	l.poke()
}

// Heartbeat records a heartbeat from node.
func (l *Leases) Heartbeat(node string) {
	l.mu.Lock()
	st := l.state(node)
	st.lastHeartbeat = l.cfg.Now()
	l.mu.Unlock()
}

// Disconnected records that node's tunnel went down: its Lease is no
// longer renewed and expires as a dead kubelet's would.
func (l *Leases) Disconnected(node string) {
	l.mu.Lock()
	if st := l.nodes[node]; st != nil && st.conns > 0 {
		st.conns--
	}
	l.mu.Unlock()
}

func (l *Leases) state(node string) *leaseState {
	st := l.nodes[node]
	if st == nil {
		st = &leaseState{}
		l.nodes[node] = st
	}
	return st
}

func (l *Leases) poke() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Run renews Leases until ctx ends. Renewals are spread: each node's
// Lease is renewed when it reaches LeaseRenew of age, so nodes that
// connected at different times never renew together.
func (l *Leases) Run(ctx context.Context) {
	go l.watchStored(ctx)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	sem := make(chan struct{}, 16)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-l.kick:
		}
		now := l.cfg.Now()
		var due []string
		l.mu.Lock()
		for name, st := range l.nodes {
			if st.conns == 0 {
				if !st.writing {
					delete(l.nodes, name)
				}
				continue
			}
			if st.writing || now.Sub(st.lastHeartbeat) > l.cfg.HeartbeatTimeout || now.Sub(st.renewed) < l.cfg.LeaseRenew {
				continue
			}
			if l.heldLocked(name) {
				continue // renewed once the client's write is seen
			}
			if !st.persist && l.renewLocked(name, now) {
				st.renewed = now
				continue
			}
			st.writing = true
			due = append(due, name)
		}
		l.renewVouchedLocked(now)
		l.mu.Unlock()
		for _, name := range due {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			go func(name string) {
				defer func() { <-sem }()
				at := l.cfg.Now()
				err := l.renew(ctx, name, at)
				l.mu.Lock()
				if st := l.nodes[name]; st != nil {
					st.writing = false
					if err == nil {
						st.renewed = at
						st.persist = false
					}
				}
				l.mu.Unlock()
				if err == nil {
					l.storeRenewals.Add(1)
				}
				if err != nil && err != errNotRegistered && ctx.Err() == nil {
					l.cfg.Logger.Warn("renew node lease", "node", name, "err", err)
				}
			}(name)
		}
	}
}

// renewLocked renews node's Lease in memory if its stored state allows:
// the Lease exists, names node as its holder and has the configured
// duration. Called with mu held.
func (l *Leases) renewLocked(node string, at time.Time) bool {
	cur := l.stored[node]
	if !l.synced || cur == nil || cur.DeletionTimestamp != nil ||
		cur.Spec.HolderIdentity == nil || *cur.Spec.HolderIdentity != node ||
		cur.Spec.LeaseDurationSeconds == nil || *cur.Spec.LeaseDurationSeconds != int32(l.cfg.LeaseDuration/time.Second) {
		return false
	}
	base, err := parseRV(cur.ResourceVersion)
	if err != nil {
		return false
	}
	for w := range l.watches {
		w.notify(node)
	}
	// at is read after the watches were told: a watch that resumes from
	// a revision above it started after they were.
	// Microseconds, as stored and sent: a client's copy compares equal.
	l.renewals[node] = renewal{renewTime: metav1.NewMicroTime(at.Truncate(time.Microsecond)), base: base, at: l.revision()}
	l.memoryRenewals.Add(1)
	return true
}

var errNotRegistered = errors.New("node not registered")

// renew writes renewTime of node's Lease, creating the Lease (owned by the
// Node, so it goes when the Node goes) when it is missing.
func (l *Leases) renew(ctx context.Context, node string, at time.Time) error {
	now := metav1.NewMicroTime(at)
	opts := storage.Options{FieldManager: "tether-hub"}
	_, err := l.cfg.Storage.GuaranteedUpdate(ctx, leasesKind, corev1.NamespaceNodeLease, node, opts, func(cur runtime.Object) (runtime.Object, error) {
		lease := cur.(*coordinationv1.Lease)
		lease.Spec.HolderIdentity = ptr.To(node)
		lease.Spec.LeaseDurationSeconds = ptr.To(int32(l.cfg.LeaseDuration / time.Second))
		lease.Spec.RenewTime = &now
		return lease, nil
	})
	if !apierrors.IsNotFound(err) {
		return err
	}
	obj, err := l.cfg.Storage.Get(ctx, nodesKind, "", node)
	if err != nil {
		// Not registered yet: the agent creates its Node right after
		// connecting, and a later round creates the Lease.
		return errNotRegistered
	}
	n := obj.(*corev1.Node)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(node),
			LeaseDurationSeconds: ptr.To(int32(l.cfg.LeaseDuration / time.Second)),
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}
	_, err = l.cfg.Storage.Create(ctx, leasesKind, corev1.NamespaceNodeLease, lease, opts)
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// LastHeartbeat returns when the hub last heard node's heartbeat (zero:
// never since it started).
func (l *Leases) LastHeartbeat(node string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st := l.nodes[node]; st != nil {
		return st.lastHeartbeat
	}
	return time.Time{}
}

// Alive reports whether node's tunnel is up and its heartbeats arrive.
func (l *Leases) Alive(node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.nodes[node]
	return st != nil && st.conns > 0 && l.cfg.Now().Sub(st.lastHeartbeat) <= l.cfg.HeartbeatTimeout
}

// LeaseStats counts node Lease renewals since the hub started.
type LeaseStats struct {
	// Memory counts renewals kept in memory only.
	Memory int64
	// Store counts renewals written to the store (creations, the first
	// renewal of a tunnel session, repairs of holder or duration).
	Store int64
}

// Stats returns the renewal counters.
func (l *Leases) Stats() LeaseStats {
	return LeaseStats{Memory: l.memoryRenewals.Load(), Store: l.storeRenewals.Load()}
}

// Collectors returns the renewal counters for the hub's /metrics.
func (l *Leases) Collectors() []prometheus.Collector {
	return countersBy("tether_node_lease_renewals_total", "Node Lease renewals made from edge heartbeats, by where they were kept.",
		"kept", map[string]func() int64{"memory": l.memoryRenewals.Load, "store": l.storeRenewals.Load})
}
