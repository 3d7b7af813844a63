package tunnel

import (
	"sync"
	"time"
)

// peakMeter remembers the largest count of events in one calendar second.
type peakMeter struct {
	mu     sync.Mutex
	second int64
	count  uint64
	peak   uint64
}

func (m *peakMeter) add(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if sec := now.Unix(); sec != m.second {
		m.second, m.count = sec, 0
	}
	m.count++
	m.peak = max(m.peak, m.count)
}

func (m *peakMeter) max() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peak
}

// refusedSet remembers the source addresses of recently refused QUIC
// attempts. Entries live for refusedMemory, longer than a client keeps
// retransmitting an Initial that got no answer; the set is pruned as it is
// used, and bounded, so a flood of spoofed addresses cannot grow it.
type refusedSet struct {
	mu    sync.Mutex
	addrs map[string]time.Time
}

const (
	refusedMemory  = 5 * time.Second
	refusedSetSize = 4096
)

func (r *refusedSet) add(addr string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.addrs == nil {
		r.addrs = make(map[string]time.Time)
	}
	if len(r.addrs) >= refusedSetSize {
		for a, t := range r.addrs {
			if now.Sub(t) >= refusedMemory {
				delete(r.addrs, a)
			}
		}
		if len(r.addrs) >= refusedSetSize {
			return // full of fresh entries: forget this one
		}
	}
	r.addrs[addr] = now
}

func (r *refusedSet) recent(addr string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.addrs[addr]
	if !ok {
		return false
	}
	if now.Sub(t) >= refusedMemory {
		delete(r.addrs, addr)
		return false
	}
	return true
}
