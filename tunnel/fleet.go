package tunnel

import (
	"crypto/tls"
	"math/rand/v2"
	"net"
	"slices"
)

// A fleet of hubs shares one store: an edge may hold its tunnel to any of
// them. The client dials one address at a time (target) and moves to the
// next of a shuffled order when a connect fails, its connection is lost or
// its hub drains. Each edge draws its own order, so the edges of a lost hub
// spread over the others instead of landing together on one.

// Addr returns the hub address the client connects to now.
func (c *Client) Addr() string { return *c.target.Load() }

// fleet returns Addr and the addresses Addrs gives, without duplicates.
func (c *Client) fleet() []string {
	all := []string{c.cfg.Addr}
	if c.cfg.Addrs != nil {
		for _, a := range c.cfg.Addrs() {
			if _, _, err := net.SplitHostPort(a); err == nil && !slices.Contains(all, a) {
				all = append(all, a)
			}
		}
	}
	return all
}

// moveOn makes the next hub of the fleet the target. The order is drawn
// again whenever the fleet changed. Called from Run's goroutine only.
func (c *Client) moveOn() {
	all := c.fleet()
	if len(all) < 2 {
		c.target.Store(&c.cfg.Addr)
		return
	}
	if !sameSet(all, c.order) {
		c.order = slices.Clone(all)
		rand.Shuffle(len(c.order), func(i, j int) { c.order[i], c.order[j] = c.order[j], c.order[i] })
	}
	next := c.order[(slices.Index(c.order, c.Addr())+1)%len(c.order)]
	if next != c.Addr() {
		c.log.Info("moving to another hub", "from", c.Addr(), "to", next)
	}
	c.target.Store(&next)
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// tlsFor returns the TLS configuration for a connection to addr: Addr's
// as configured, another hub's with that hub's host as the server name.
func (c *Client) tlsFor(addr string) *tls.Config {
	if addr == c.cfg.Addr {
		return c.tlsConf
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return c.tlsConf
	}
	t := c.tlsConf.Clone()
	t.ServerName = host
	return t
}
