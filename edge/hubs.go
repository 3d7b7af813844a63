package edge

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Hubs that share one store form a fleet, and the agent may keep its
// tunnel to any of them. It learns their tunnel addresses from the hub it
// is connected to (GET /tether/hubs over the tunnel) at every connect and
// every hubsRefresh, and keeps them in hubs.json in its data directory, so
// that an agent restarted while its first hub is down still finds the
// others. The tunnel client moves between them (tunnel.ClientConfig.Addrs).
//
// A hub answers with the hubs alive at that moment. An agent that
// connected while others were down (killed, restarting) would learn only
// the survivors and, were it to keep just that answer, have nowhere to go
// when the survivor died in turn, though the others were back. So the
// agent keeps every hub it was told of, and forgets one only after
// hubsForget without it in any answer: a hub taken out of the fleet for
// good drops out within a day.

// hubsPath is the hub's endpoint of the fleet's addresses (hub/peers).
const hubsPath = "/tether/hubs"

// hubsFile holds the fleet's addresses in the data directory.
const hubsFile = "hubs.json"

// hubsRefresh is how often a connected agent asks again.
const hubsRefresh = 10 * time.Minute

// hubsForget is how long a hub absent from every answer stays known.
const hubsForget = 24 * time.Hour

// hubsRewrite is how stale the kept last-seen times may grow before
// hubs.json is written again with the set unchanged.
const hubsRewrite = time.Hour

// hubFleet is the tunnel addresses of the hubs the agent knows.
type hubFleet struct {
	path string
	now  func() time.Time

	mu      sync.Mutex
	seen    map[string]time.Time // address → last answer that named it
	written time.Time            // when hubs.json was last written
}

// hubList is the hub's answer and, with LastSeen, hubs.json.
type hubList struct {
	Hubs []hubEntry `json:"hubs"`
}

type hubEntry struct {
	ID       string    `json:"id,omitempty"`
	Tunnel   string    `json:"tunnel"`
	LastSeen time.Time `json:"lastSeen,omitzero"`
}

// loadHubFleet reads the addresses kept in dir; none when there is no
// file yet or it cannot be read.
func loadHubFleet(dir string) *hubFleet {
	f := &hubFleet{path: filepath.Join(dir, hubsFile), now: time.Now, seen: map[string]time.Time{}}
	if b, err := os.ReadFile(f.path); err == nil {
		if l, err := parseHubList(b); err == nil {
			// A file of an older agent has no times: its hubs count as
			// seen now, and the file is written again at the next answer
			// (written stays zero).
			for i, h := range l {
				f.seen[h.Tunnel] = cmp.Or(h.LastSeen, f.now())
				if i == 0 || h.LastSeen.Before(f.written) {
					f.written = h.LastSeen
				}
			}
		}
	}
	return f
}

// parseHubList returns the entries of b with a valid address, once each.
func parseHubList(b []byte) ([]hubEntry, error) {
	var l hubList
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("decode hub list: %w", err)
	}
	var out []hubEntry
	for _, h := range l.Hubs {
		if _, _, err := net.SplitHostPort(h.Tunnel); err == nil && !slices.ContainsFunc(out, func(o hubEntry) bool { return o.Tunnel == h.Tunnel }) {
			out = append(out, h)
		}
	}
	return out, nil
}

// Addrs returns the known hubs' tunnel addresses.
func (f *hubFleet) Addrs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.seen))
}

// refresh asks the hub for the fleet and keeps the answer. A hub that
// serves no fleet (SQLite, alone) does not know the path: it authorizes a
// path it does not serve as any other, as upstream's API server does, and
// answers 403 (404 to a user allowed every path). Nothing changes then,
// and there is nothing to report.
func (f *hubFleet) refresh(ctx context.Context, c *http.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://hub"+hubsPath, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("ask the hub for the fleet: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusForbidden {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("ask the hub for the fleet: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ask the hub for the fleet: %s", resp.Status)
	}
	answer, err := parseHubList(b)
	if err != nil || len(answer) == 0 {
		return err
	}
	return f.merge(answer)
}

// merge adds the hubs of an answer, forgets those absent for hubsForget,
// and writes hubs.json when the set changed or its times grew stale.
func (f *hubFleet) merge(answer []hubEntry) error {
	now := f.now()
	f.mu.Lock()
	before := slices.Sorted(maps.Keys(f.seen))
	for _, h := range answer {
		f.seen[h.Tunnel] = now
	}
	maps.DeleteFunc(f.seen, func(_ string, at time.Time) bool { return now.Sub(at) > hubsForget })
	after := slices.Sorted(maps.Keys(f.seen))
	if slices.Equal(before, after) && now.Sub(f.written) < hubsRewrite {
		f.mu.Unlock()
		return nil
	}
	var l hubList
	for _, a := range after {
		l.Hubs = append(l.Hubs, hubEntry{Tunnel: a, LastSeen: f.seen[a]})
	}
	f.written = now
	f.mu.Unlock()
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	tmp := f.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("keep the hub list: %w", err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return fmt.Errorf("keep the hub list: %w", err)
	}
	return nil
}

// hubsLoop refreshes the fleet after every connect (connected receives
// one value each) and every hubsRefresh while connected.
func (a *Agent) hubsLoop(ctx context.Context, connected <-chan struct{}) {
	t := time.NewTicker(hubsRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-connected:
		case <-t.C:
			if !a.tunnel.Connected() {
				continue
			}
		}
		if err := a.hubs.refresh(ctx, a.httpc); err != nil && ctx.Err() == nil {
			a.log.Info("refresh the hub fleet", "err", err)
		}
	}
}
