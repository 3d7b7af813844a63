package metrics

import "time"

// Sampler turns successive readings of cumulative CPU counters into
// rates. It keeps the previous reading of every counter it was given;
// Done forgets those not read since the previous Done, so that counters of
// containers that went away do not pile up. It is not safe for concurrent
// use.
type Sampler struct {
	prev, cur map[string]cpuPoint
}

type cpuPoint struct {
	at    time.Time
	cpu   time.Duration
	start time.Time
}

// Rate records that counter key (a container instance, "node") read cpu
// at t, and returns its rate in nanocores (billionths of a core) since its
// previous reading. A counter that went backwards, or whose start time
// changed, was reset (the container restarted, the node rebooted): its
// rate is then the counter's value over the time since start, when start
// is known and falls after the previous reading; otherwise, as for the
// first reading of a counter without a start time, there is no rate and
// ok is false.
func (s *Sampler) Rate(key string, t time.Time, cpu time.Duration, start time.Time) (nanocores uint64, ok bool) {
	if s.cur == nil {
		s.cur = make(map[string]cpuPoint)
	}
	p, seen := s.prev[key]
	if c, again := s.cur[key]; again {
		p, seen = c, true
	}
	s.cur[key] = cpuPoint{at: t, cpu: cpu, start: start}
	if seen && p.start.Equal(start) && cpu >= p.cpu && t.After(p.at) {
		return rate(cpu-p.cpu, t.Sub(p.at)), true
	}
	if !start.IsZero() && t.After(start) && (!seen || !start.Before(p.at)) {
		return rate(cpu, t.Sub(start)), true
	}
	return 0, false
}

// Done ends a round of readings: the counters not read since the previous
// Done are forgotten.
func (s *Sampler) Done() {
	s.prev, s.cur = s.cur, nil
}

func rate(cpu, window time.Duration) uint64 {
	if window <= 0 {
		return 0
	}
	return uint64(float64(cpu) / window.Seconds())
}
