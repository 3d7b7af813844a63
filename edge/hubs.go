package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
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

// hubsPath is the hub's endpoint of the fleet's addresses (hub/peers).
const hubsPath = "/tether/hubs"

// hubsFile holds the fleet's addresses in the data directory.
const hubsFile = "hubs.json"

// hubsRefresh is how often a connected agent asks again.
const hubsRefresh = 10 * time.Minute

// hubFleet is the tunnel addresses of the hubs the agent knows.
type hubFleet struct {
	path string

	mu    sync.Mutex
	addrs []string
}

// hubList is hubs.json and the hub's answer.
type hubList struct {
	Hubs []struct {
		ID     string `json:"id,omitempty"`
		Tunnel string `json:"tunnel"`
	} `json:"hubs"`
}

// loadHubFleet reads the addresses kept in dir; none when there is no
// file yet or it cannot be read.
func loadHubFleet(dir string) *hubFleet {
	f := &hubFleet{path: filepath.Join(dir, hubsFile)}
	if b, err := os.ReadFile(f.path); err == nil {
		f.addrs, _ = parseHubList(b)
	}
	return f
}

func parseHubList(b []byte) ([]string, error) {
	var l hubList
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("decode hub list: %w", err)
	}
	var addrs []string
	for _, h := range l.Hubs {
		if _, _, err := net.SplitHostPort(h.Tunnel); err == nil && !slices.Contains(addrs, h.Tunnel) {
			addrs = append(addrs, h.Tunnel)
		}
	}
	slices.Sort(addrs)
	return addrs, nil
}

// Addrs returns the known hubs' tunnel addresses.
func (f *hubFleet) Addrs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.addrs)
}

// refresh asks the hub for the fleet and keeps the answer. A hub that
// serves no fleet (SQLite, alone) answers 404: nothing changes.
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
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("ask the hub for the fleet: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ask the hub for the fleet: %s", resp.Status)
	}
	addrs, err := parseHubList(b)
	if err != nil || len(addrs) == 0 {
		return err
	}
	f.mu.Lock()
	same := slices.Equal(addrs, f.addrs)
	f.addrs = addrs
	f.mu.Unlock()
	if same {
		return nil
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
