package upgrade

import (
	"context"
	"fmt"
	"time"
)

// DefaultSettle is how long a new agent must stay healthy before its
// trial is committed.
const DefaultSettle = 10 * time.Second

// Watch follows a trial from inside the new agent: once healthy has held
// for settle it commits the trial and returns ""; when the deadline
// passes first it rolls the trial back and returns the installed
// executable, which the caller stops and execs. When ctx ends first (the
// agent is being stopped) the trial stays open and the next start
// decides (Resume). healthy is asked every second.
func (r *Records) Watch(ctx context.Context, t *Trial, healthy func() bool, settle time.Duration) (string, error) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var since time.Time // healthy without a break since then
	for {
		now := time.Now()
		if healthy() {
			if since.IsZero() {
				since = now
			}
			if now.Sub(since) >= settle {
				return "", r.Commit(t, now)
			}
		} else {
			since = time.Time{}
		}
		if now.After(t.Deadline) {
			what := "its container runtime answering"
			if t.RequireHub {
				what = "its container runtime answering, its node registered and connected to the hub"
			}
			reason := fmt.Sprintf("the new agent was not healthy (%s for %v) within %v", what, settle, t.Deadline.Sub(t.Started).Round(time.Second))
			if err := r.RollBack(t, reason, now); err != nil {
				return "", err
			}
			return t.Installed, nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-tick.C:
		}
	}
}
