package hollow_test

import (
	"math"
	"runtime/metrics"
	"time"
)

// schedLatency follows the Go scheduler's latency histogram of this
// process (how long goroutines that could run waited for a thread): with
// a whole fleet in one process it says whether the machine kept up. A
// member that waits longer than its gossip probe timeout (500ms) is taken
// for unreachable by its peers, whatever the product does.
type schedLatency struct {
	last *metrics.Float64Histogram
}

const schedLatencyMetric = "/sched/latencies:seconds"

func newSchedLatency() *schedLatency {
	s := &schedLatency{}
	s.last = s.read()
	return s
}

func (s *schedLatency) read() *metrics.Float64Histogram {
	sample := []metrics.Sample{{Name: schedLatencyMetric}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return sample[0].Value.Float64Histogram()
}

// since returns the waits since the previous call (or since s was made).
func (s *schedLatency) since() schedWaits {
	cur := s.read()
	prev := s.last
	s.last = cur
	if cur == nil || prev == nil {
		return schedWaits{}
	}
	w := schedWaits{buckets: cur.Buckets, counts: make([]uint64, len(cur.Counts))}
	for i := range cur.Counts {
		w.counts[i] = cur.Counts[i] - prev.Counts[i]
		w.total += w.counts[i]
	}
	return w
}

// schedWaits is a histogram of scheduling waits over some interval.
type schedWaits struct {
	buckets []float64 // bucket i holds [buckets[i], buckets[i+1])
	counts  []uint64
	total   uint64
}

// quantile returns the q-quantile of the waits as the upper bound of its
// bucket; 0 when no goroutine was scheduled or the runtime has no such
// metric.
func (w schedWaits) quantile(q float64) time.Duration {
	if w.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(w.total)))
	var seen uint64
	for i, c := range w.counts {
		seen += c
		if seen >= rank {
			upper := w.buckets[i+1]
			if math.IsInf(upper, 1) {
				upper = w.buckets[i]
			}
			return time.Duration(upper * float64(time.Second))
		}
	}
	return 0
}
