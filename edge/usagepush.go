package edge

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	nodemetrics "github.com/tether-edge/tether/edge/metrics"
	"github.com/tether-edge/tether/internal/usage"
	"github.com/tether-edge/tether/tunnel"
)

// scrapeTimeout bounds one reading of the runtime's stats for the node
// server's Prometheus endpoints.
const scrapeTimeout = 10 * time.Second

// usageHandlers returns the node server's /metrics/resource and
// /metrics/cadvisor, or nils when the runtime measures nothing.
func (a *Agent) usageHandlers() (resource, cadvisor http.Handler) {
	sp, ok := a.cfg.Runtime.(StatsProvider)
	if !ok {
		return nil, nil
	}
	regs := nodemetrics.NewRegistries(sp.Stats, scrapeTimeout)
	return nodemetrics.Handler(regs.Resource, a.log), nodemetrics.Handler(regs.Cadvisor, a.log)
}

// usagePusher reports the node's usage to the hub every period: it reads
// the runtime's counters, turns them into rates over the time since the
// previous reading, and pushes the sample on the tunnel with an encoder
// that starts over with every connection. Nothing is pushed while the
// tunnel is down: an offline node reports no usage, and the readings go on
// so that the first sample after a reconnection covers one period.
type usagePusher struct {
	a       *Agent
	stats   StatsProvider
	tunnel  pushConn
	sampler nodemetrics.Sampler
	enc     usage.Encoder
	conn    uint64    // connection enc writes for; 0: none yet
	last    time.Time // time of the previous reading
}

// pushConn is what the pusher needs of the tunnel's client.
type pushConn interface {
	Conn() uint64
	Push(conn uint64, payload []byte) error
}

// usageLoop pushes usage every Config.MetricsPeriod until ctx ends.
func (a *Agent) usageLoop(ctx context.Context, sp StatsProvider) {
	p := &usagePusher{a: a, stats: sp, tunnel: a.tunnel}
	p.read(ctx) // the first window starts here
	t := time.NewTicker(a.cfg.MetricsPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.tick(ctx)
	}
}

// tick reads the usage and pushes it.
func (p *usagePusher) tick(ctx context.Context) {
	if s, ok := p.read(ctx); ok {
		p.push(s)
	}
}

// read takes a reading and returns the sample of the rates since the
// previous one; false when there is no previous one or the read failed.
func (p *usagePusher) read(ctx context.Context) (usage.Sample, bool) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	snap, err := p.stats.Stats(ctx)
	if err != nil {
		p.a.metrics.usageReadFailures.Add(1)
		p.a.log.Debug("read usage", "err", err)
		return usage.Sample{}, false
	}
	s, ok := p.sample(snap)
	return s, ok
}

// sample turns a reading into rates since the previous reading.
func (p *usagePusher) sample(snap nodemetrics.Snapshot) (usage.Sample, bool) {
	prev := p.last
	p.last = snap.Time
	defer p.sampler.Done()
	s := usage.Sample{Time: snap.Time, Window: snap.Time.Sub(prev)}
	cpu, ok := p.sampler.Rate("node", snap.Time, snap.Node.CPU, time.Time{})
	s.Node = usage.Resources{CPUNanoCores: cpu, MemoryWorkingSetBytes: snap.Node.WorkingSet}
	for _, sp := range snap.Pods {
		up := usage.Pod{Namespace: sp.Namespace, Name: sp.Name}
		for _, c := range sp.Containers {
			rate, ok := p.sampler.Rate(c.ID, snap.Time, c.Stats.CPU, c.StartTime)
			if !ok || slices.ContainsFunc(up.Containers, func(u usage.Container) bool { return u.Name == c.Name }) {
				continue
			}
			up.Containers = append(up.Containers, usage.Container{Name: c.Name,
				Usage: usage.Resources{CPUNanoCores: rate, MemoryWorkingSetBytes: c.Stats.WorkingSet}})
		}
		if len(up.Containers) == 0 || slices.ContainsFunc(s.Pods, func(o usage.Pod) bool {
			return o.Namespace == up.Namespace && o.Name == up.Name
		}) {
			continue
		}
		slices.SortFunc(up.Containers, func(a, b usage.Container) int { return cmp.Compare(a.Name, b.Name) })
		s.Pods = append(s.Pods, up)
	}
	// A stable order keeps the encoder's table, and so the payloads, small.
	slices.SortFunc(s.Pods, func(a, b usage.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	if !ok || prev.IsZero() || s.Window <= 0 || s.Window > time.Hour {
		return s, false
	}
	return s, true
}

// push sends s on the current connection, if any.
func (p *usagePusher) push(s usage.Sample) {
	conn := p.tunnel.Conn()
	if conn == 0 {
		return
	}
	if conn != p.conn {
		p.enc.Reset()
		p.conn = conn
	}
	payload, err := p.enc.Encode(s)
	if err != nil {
		p.a.metrics.usagePushFailures.Add(1)
		p.a.log.Warn("encode usage", "err", err)
		p.conn = 0 // start over with a full sample
		return
	}
	if err := p.tunnel.Push(conn, payload); err != nil {
		p.a.metrics.usagePushFailures.Add(1)
		// The hub's decoder may not have seen the payload the encoder
		// counts on: the next one is full.
		p.conn = 0
		if !errors.Is(err, tunnel.ErrConnChanged) {
			p.a.log.Debug("push usage", "err", err)
		}
		return
	}
	p.a.metrics.usagePushes.Add(1)
	p.a.metrics.usagePushedBytes.Add(int64(len(payload)))
}
