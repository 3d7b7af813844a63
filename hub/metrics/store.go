package metrics

import (
	"cmp"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unique"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/usage"
	"github.com/tether-edge/tether/tunnel"
)

// Config configures a Store.
type Config struct {
	// Now is the clock samples age by; nil means time.Now.
	Now func() time.Time
	// Logger receives logs; nil means slog.Default().
	Logger *slog.Logger
}

// minMaxAge is the least age at which a sample stops being served; a
// sample is served for three of its windows, and at least this long.
const minMaxAge = time.Minute

// Store keeps the latest usage sample of each node whose tunnel is up. It
// is safe for concurrent use.
type Store struct {
	now func() time.Time
	log *slog.Logger

	mu      sync.RWMutex
	streams map[any]*stream   // by tunnel session
	nodes   map[string]*entry // by node name

	decoded, refused, bytes atomic.Uint64
}

// stream is the decoding state of one tunnel session.
type stream struct {
	node string
	dec  usage.Decoder
}

// entry is a node's latest sample and the stream it came from.
type entry struct {
	from     *stream
	received time.Time
	sample   usage.Sample // pods sorted by namespace and name
}

// NewStore returns an empty store.
func NewStore(cfg Config) *Store {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Store{now: cfg.Now, log: cfg.Logger, streams: map[any]*stream{}, nodes: map[string]*entry{}}
}

// Push takes a payload s's edge pushed (tunnel.ServerConfig.OnPush): it
// is decoded with s's decoder and its sample replaces the node's. A
// payload that does not decode is dropped and counted. When s ends, its
// node's sample is forgotten. Push does not block.
func (st *Store) Push(s *tunnel.Session, payload []byte) {
	st.push(s, s.Node(), s.Done(), payload)
}

// push is Push for a session known by key, of node, that ends when done
// closes.
func (st *Store) push(key any, node string, done <-chan struct{}, payload []byte) {
	st.bytes.Add(uint64(len(payload)))
	st.mu.Lock()
	defer st.mu.Unlock()
	sm := st.streams[key]
	if sm == nil {
		select {
		case <-done:
			return // ended already; nothing would forget it
		default:
		}
		sm = &stream{node: node}
		st.streams[key] = sm
		go func() {
			<-done
			st.forget(key)
		}()
	}
	s, err := sm.dec.Decode(payload)
	if err != nil {
		st.refused.Add(1)
		if errors.Is(err, usage.ErrNoBase) {
			st.log.Debug("usage changes without a full sample", "node", node)
		} else {
			st.log.Debug("usage payload refused", "node", node, "err", err)
		}
		return
	}
	st.decoded.Add(1)
	compact(&s)
	st.nodes[node] = &entry{from: sm, received: st.now(), sample: s}
}

// forget drops the stream of a session that ended, and its node's
// sample unless a newer session of the node replaced it.
func (st *Store) forget(key any) {
	st.mu.Lock()
	defer st.mu.Unlock()
	sm := st.streams[key]
	if sm == nil {
		return
	}
	delete(st.streams, key)
	if e := st.nodes[sm.node]; e != nil && e.from == sm {
		delete(st.nodes, sm.node)
	}
}

// compact shares the strings many pods repeat (namespaces, container
// names) process-wide and sorts the pods for lookups by name.
func compact(s *usage.Sample) {
	for i := range s.Pods {
		p := &s.Pods[i]
		p.Namespace = unique.Make(p.Namespace).Value()
		for j := range p.Containers {
			p.Containers[j].Name = unique.Make(p.Containers[j].Name).Value()
		}
	}
	slices.SortFunc(s.Pods, comparePods)
}

func comparePods(a, b usage.Pod) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// fresh reports whether e may still be served at now.
func (e *entry) fresh(now time.Time) bool {
	return now.Sub(e.received) <= max(3*e.sample.Window, minMaxAge)
}

// NodeUsage is what a node's latest sample says of the node.
type NodeUsage struct {
	Time   time.Time
	Window time.Duration
	Usage  usage.Resources
}

// Node returns the usage of node from its latest sample, if it has a
// fresh one.
func (st *Store) Node(node string) (NodeUsage, bool) {
	st.mu.RLock()
	defer st.mu.RUnlock()
	e := st.nodes[node]
	if e == nil || !e.fresh(st.now()) {
		return NodeUsage{}, false
	}
	return NodeUsage{Time: e.sample.Time, Window: e.sample.Window, Usage: e.sample.Node}, true
}

// PodUsage is what a node's latest sample says of one of its pods.
type PodUsage struct {
	Time       time.Time
	Window     time.Duration
	Containers []usage.Container // shared: do not change
}

// Pod returns the usage of pod namespace/name from the latest sample of
// node, the node it is bound to, if the node has a fresh sample that
// holds the pod.
func (st *Store) Pod(node, namespace, name string) (PodUsage, bool) {
	st.mu.RLock()
	defer st.mu.RUnlock()
	e := st.nodes[node]
	if e == nil || !e.fresh(st.now()) {
		return PodUsage{}, false
	}
	i, ok := slices.BinarySearchFunc(e.sample.Pods, usage.Pod{Namespace: namespace, Name: name}, comparePods)
	if !ok {
		return PodUsage{}, false
	}
	return PodUsage{Time: e.sample.Time, Window: e.sample.Window, Containers: e.sample.Pods[i].Containers}, true
}

// Stats are the store's counters.
type Stats struct {
	// Nodes is how many nodes have a fresh sample.
	Nodes int
	// Decoded and Refused count the payloads pushed; Bytes their bytes.
	Decoded, Refused, Bytes uint64
}

// Stats returns the store's counters.
func (st *Store) Stats() Stats {
	st.mu.RLock()
	now, n := st.now(), 0
	for _, e := range st.nodes {
		if e.fresh(now) {
			n++
		}
	}
	st.mu.RUnlock()
	return Stats{Nodes: n, Decoded: st.decoded.Load(), Refused: st.refused.Load(), Bytes: st.bytes.Load()}
}

// Collectors returns the store's gauge and counters for the hub's
// /metrics.
func (st *Store) Collectors() []prometheus.Collector {
	payloads := func(result string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "tether_metrics_payloads_total",
			Help:        "Resource usage payloads edges pushed, by result: decoded, or refused (undecodable, or changes without a full sample).",
			ConstLabels: prometheus.Labels{"result": result},
		}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_metrics_nodes",
			Help: "Nodes whose resource usage the metrics API serves now.",
		}, func() float64 { return float64(st.Stats().Nodes) }),
		payloads("decoded", &st.decoded), payloads("refused", &st.refused),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tether_metrics_received_bytes_total",
			Help: "Bytes of resource usage payloads edges pushed.",
		}, func() float64 { return float64(st.bytes.Load()) }),
	}
}
