package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"math/rand/v2"
	"net"
	"slices"
	"time"
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
	if c.fleetOrder() == nil {
		c.target.Store(&c.cfg.Addr)
		return
	}
	next := c.order[(slices.Index(c.order, c.Addr())+1)%len(c.order)]
	if next != c.Addr() {
		c.log.Info("moving to another hub", "from", c.Addr(), "to", next)
	}
	c.target.Store(&next)
}

// fleetOrder returns the order moves follow, drawn again whenever the
// fleet changed; nil while the fleet is a single hub. Called from Run's
// goroutine only.
func (c *Client) fleetOrder() []string {
	all := c.fleet()
	if len(all) < 2 {
		return nil
	}
	if !sameSet(all, c.order) {
		c.order = slices.Clone(all)
		rand.Shuffle(len(c.order), func(i, j int) { c.order[i], c.order[j] = c.order[j], c.order[i] })
	}
	return c.order
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

// dialOrder returns the hubs a connect tries, in order: the target first,
// then the others in the order moves follow.
func (c *Client) dialOrder() []string {
	order, target := c.fleetOrder(), c.Addr()
	i := slices.Index(order, target)
	if i < 0 {
		return []string{target}
	}
	return append(slices.Clone(order[i:]), order[:i]...)
}

// dialed is the outcome of one hub's connect.
type dialed struct {
	addr string
	cs   *clientSession
	err  error
}

// connectFleet connects to the target hub. While the fleet knows other
// hubs and the target has neither welcomed the edge nor failed within
// DialStagger, it dials the next one as well, and so on down the order;
// a failed dial starts the next at once. The first session to complete
// its hello wins and becomes the target; any other is closed. An edge
// whose hub died together with the next one in its order thus waits
// DialStagger for it, not HandshakeTimeout. When every dial failed, the
// error is one that proves the hub answered, if any did (a refusal shows
// that UDP gets through, so it must not count towards the TCP fallback),
// else the target's. Called from Run's goroutine only.
func (c *Client) connectFleet(ctx context.Context, transport string) (*clientSession, error) {
	order := c.dialOrder()
	if len(order) == 1 {
		return c.connect(ctx, transport, order[0])
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan dialed, len(order))
	started, pending := 0, 0
	errs := make(map[string]error, len(order))
	stagger := time.NewTimer(0)
	defer stagger.Stop()
	for {
		select {
		case <-stagger.C:
			if started == len(order) || ctx.Err() != nil {
				continue
			}
			addr := order[started]
			if started > 0 {
				c.log.Info("dialing another hub of the fleet as well", "first", order[0], "dialing", addr)
			}
			started++
			pending++
			go func() {
				cs, err := c.connect(ctx, transport, addr)
				results <- dialed{addr, cs, err}
			}()
			stagger.Reset(c.cfg.DialStagger)
		case r := <-results:
			pending--
			if r.err == nil {
				cancel()
				// The others' sessions, should they complete, are closed.
				go func(n int) {
					for range n {
						if l := <-results; l.cs != nil {
							l.cs.close(codeConnClosed, errors.New("tunnel: another hub answered first"))
						}
					}
				}(pending)
				if r.addr != c.Addr() {
					c.log.Info("moving to another hub", "from", c.Addr(), "to", r.addr)
					addr := r.addr
					c.target.Store(&addr)
				}
				return r.cs, nil
			}
			errs[r.addr] = r.err
			if started < len(order) && ctx.Err() == nil {
				stagger.Reset(0)
				continue
			}
			if pending > 0 {
				continue
			}
			for _, a := range order {
				if err := errs[a]; err != nil && !unanswered(err) {
					return nil, err
				}
			}
			return nil, errs[order[0]]
		}
	}
}
