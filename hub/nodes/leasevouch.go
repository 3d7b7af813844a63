package nodes

import (
	"slices"
	"time"
)

// Hubs that share one store each hold the tunnels of some nodes, and only
// the hub that holds a node's tunnel hears its heartbeats. Each hub
// publishes the nodes it holds with its presence in the store, renewed at
// a low rate (see hub/peers); the other hubs take that as the heartbeats
// they do not hear, and renew those nodes' Leases in memory as if they
// had. The node lifecycle controller, on whichever hub it runs, thus sees
// every live node's Lease renewed, and no heartbeat reaches the store.

// Held returns the nodes whose tunnel is up on this hub and whose
// heartbeats arrive, sorted.
func (l *Leases) Held() []string {
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var held []string
	for name, st := range l.nodes {
		if st.conns > 0 && now.Sub(st.lastHeartbeat) <= l.cfg.HeartbeatTimeout {
			held = append(held, name)
		}
	}
	slices.Sort(held)
	return held
}

// Vouch replaces the nodes other hubs vouch for, each with the time its
// hub's word expires. Until then a node's Lease is renewed in memory
// every LeaseRenew, unless its tunnel is on this hub (its own heartbeats
// count then). Vouched renewals never go to the store: the hub holding
// the tunnel wrote the first renewal of its session.
func (l *Leases) Vouch(vouched map[string]time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.vouched = vouched
	for name := range l.vouchRenewed {
		if _, ok := vouched[name]; !ok {
			delete(l.vouchRenewed, name)
		}
	}
}

// Vouched reports whether another hub vouches for node now.
func (l *Leases) Vouched(node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	until, ok := l.vouched[node]
	return ok && l.cfg.Now().Before(until)
}

// renewVouchedLocked renews the Leases of the vouched nodes that are due.
// Called with mu held.
func (l *Leases) renewVouchedLocked(now time.Time) {
	for name, until := range l.vouched {
		if st := l.nodes[name]; st != nil && st.conns > 0 {
			continue
		}
		if !now.Before(until) || now.Sub(l.vouchRenewed[name]) < l.cfg.LeaseRenew || l.heldLocked(name) {
			continue
		}
		if l.renewLocked(name, now) {
			if l.vouchRenewed == nil {
				l.vouchRenewed = map[string]time.Time{}
			}
			l.vouchRenewed[name] = now
		}
	}
}
