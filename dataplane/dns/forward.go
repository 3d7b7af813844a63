package dns

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// forwarder sends names outside the cluster to the node's resolvers and
// caches what they say.
type forwarder struct {
	upstreams []string
	udp, tcp  *dns.Client
	cache     *cache

	mu       sync.Mutex
	inflight map[string]*call // identical questions share one upstream query
}

type call struct {
	done chan struct{}
	msg  *dns.Msg
	err  error
}

func newForwarder(upstreams []string, timeout time.Duration, c *cache) *forwarder {
	return &forwarder{
		upstreams: upstreams,
		udp:       &dns.Client{Net: "udp", Timeout: timeout, UDPSize: 4096},
		tcp:       &dns.Client{Net: "tcp", Timeout: timeout},
		cache:     c,
		inflight:  map[string]*call{},
	}
}

func cacheKey(q dns.Question, do bool) string {
	return fmt.Sprintf("%s/%d/%d/%t", strings.ToLower(q.Name), q.Qtype, q.Qclass, do)
}

// resolve answers req from the cache or the upstreams. The returned message
// is the caller's to modify.
func (f *forwarder) resolve(req *dns.Msg) (*dns.Msg, error) {
	q := req.Question[0]
	do := false
	if o := req.IsEdns0(); o != nil {
		do = o.Do()
	}
	key := cacheKey(q, do)
	if m := f.cache.get(key); m != nil {
		m.Id = req.Id
		m.Question = req.Question
		return m, nil
	}

	f.mu.Lock()
	if c, ok := f.inflight[key]; ok {
		f.mu.Unlock()
		<-c.done
		if c.err != nil {
			return nil, c.err
		}
		m := c.msg.Copy()
		m.Id = req.Id
		return m, nil
	}
	c := &call{done: make(chan struct{})}
	f.inflight[key] = c
	f.mu.Unlock()

	c.msg, c.err = f.exchange(req)
	if c.err == nil {
		f.cache.put(key, c.msg)
	}
	f.mu.Lock()
	delete(f.inflight, key)
	f.mu.Unlock()
	close(c.done)
	if c.err != nil {
		return nil, c.err
	}
	m := c.msg.Copy()
	m.Id = req.Id
	return m, nil
}

// exchange asks the upstreams in order until one answers; a truncated UDP
// answer is retried over TCP.
func (f *forwarder) exchange(req *dns.Msg) (*dns.Msg, error) {
	if len(f.upstreams) == 0 {
		return nil, errors.New("forward query: no upstream resolvers")
	}
	out := req.Copy()
	out.Id = dns.Id()
	out.RecursionDesired = true
	if out.IsEdns0() == nil {
		out.SetEdns0(4096, false)
	}
	var errs []error
	for _, up := range f.upstreams {
		m, _, err := f.udp.Exchange(out, up)
		if err == nil && m.Truncated {
			m, _, err = f.tcp.Exchange(out, up)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", up, err))
			continue
		}
		if m.Rcode == dns.RcodeServerFailure || m.Rcode == dns.RcodeRefused {
			errs = append(errs, fmt.Errorf("%s: %s", up, dns.RcodeToString[m.Rcode]))
			continue
		}
		return m, nil
	}
	return nil, fmt.Errorf("forward query: %w", errors.Join(errs...))
}

// cache holds upstream answers until their TTL runs out. Negative answers
// (NXDOMAIN, NODATA) are kept for the SOA's negative TTL (RFC 2308).
type cache struct {
	max            int
	maxTTL, maxNeg time.Duration
	now            func() time.Time

	mu      sync.Mutex
	entries map[string]*entry
}

type entry struct {
	msg    *dns.Msg
	stored time.Time
	expiry time.Time
}

func newCache(max int, maxTTL, maxNeg time.Duration) *cache {
	return &cache{max: max, maxTTL: maxTTL, maxNeg: maxNeg, now: time.Now, entries: map[string]*entry{}}
}

// ttlOf decides how long m may be cached; 0 means not at all.
func (c *cache) ttlOf(m *dns.Msg) time.Duration {
	negative := m.Rcode == dns.RcodeNameError || (m.Rcode == dns.RcodeSuccess && len(m.Answer) == 0)
	if negative {
		for _, rr := range m.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				ttl := min(soa.Hdr.Ttl, soa.Minttl)
				return min(time.Duration(ttl)*time.Second, c.maxNeg)
			}
		}
		return 0 // no SOA: the answer says nothing about how long it holds
	}
	if m.Rcode != dns.RcodeSuccess {
		return 0
	}
	ttl := ^uint32(0)
	for _, sec := range [][]dns.RR{m.Answer, m.Ns} {
		for _, rr := range sec {
			ttl = min(ttl, rr.Header().Ttl)
		}
	}
	for _, rr := range m.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			ttl = min(ttl, rr.Header().Ttl)
		}
	}
	return min(time.Duration(ttl)*time.Second, c.maxTTL)
}

func (c *cache) put(key string, m *dns.Msg) {
	ttl := c.ttlOf(m)
	if ttl <= 0 {
		return
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		// Evict expired entries first, then arbitrary ones (map order).
		for k, e := range c.entries {
			if now.After(e.expiry) || len(c.entries) >= c.max {
				delete(c.entries, k)
			}
			if len(c.entries) < c.max*9/10 {
				break
			}
		}
	}
	c.entries[key] = &entry{msg: m.Copy(), stored: now, expiry: now.Add(ttl)}
}

// get returns a copy of a live entry with its TTLs counted down by the time
// it spent in the cache.
func (c *cache) get(key string) *dns.Msg {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && !now.Before(e.expiry) {
		delete(c.entries, key)
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return nil
	}
	m := e.msg.Copy()
	age := uint32(now.Sub(e.stored) / time.Second)
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			h := rr.Header()
			if h.Rrtype == dns.TypeOPT {
				continue
			}
			if h.Ttl > age {
				h.Ttl -= age
			} else {
				h.Ttl = 0
			}
		}
	}
	return m
}
