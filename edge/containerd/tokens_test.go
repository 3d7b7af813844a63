package containerd

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
)

// tokenHub is a hub that issues numbered tokens on a fake clock, or fails
// while down.
type tokenHub struct {
	edge.Sources
	now      func() time.Time
	down     bool
	requests int
	life     time.Duration // when set, the lifetime given instead of the one asked for
}

func (h *tokenHub) ServiceAccountToken(_ context.Context, _ *corev1.Pod, audience string, seconds int64) (string, time.Time, error) {
	if h.down {
		return "", time.Time{}, errors.New("dial tunnel: hub not connected")
	}
	h.requests++
	life := time.Duration(seconds) * time.Second
	if h.life != 0 {
		life = h.life
	}
	return fmt.Sprintf("token-%d-%s", h.requests, audience), h.now().Add(life), nil
}

// TestTokenCache checks the service account token cache: a token is reused
// while valid and refreshed at 80% of its lifetime (24h at most), a failed
// refresh keeps serving the valid token, a restarted agent serves the
// stored one offline, and an expired token is never served.
func TestTokenCache(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	clock := func() time.Time { return now }
	hub := &tokenHub{now: clock}
	cache := func() *tokenCache {
		return &tokenCache{now: clock, sources: func() edge.Sources { return hub }, retry: time.Minute}
	}
	c := cache()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p", UID: "u1"}}
	path := filepath.Join(t.TempDir(), "tokens", "token.vault")
	get := func(c *tokenCache) (string, time.Time, error) {
		return c.token(context.Background(), path, pod, "vault", 3600)
	}
	expect := func(what, wantTok string, wantNext time.Time) {
		t.Helper()
		tok, next, err := get(c)
		if err != nil || tok != wantTok || !next.Equal(wantNext) {
			t.Errorf("%s: %q next %v err %v, want %q next %v", what, tok, next.Sub(start), err, wantTok, wantNext.Sub(start))
		}
	}

	expect("first", "token-1-vault", start.Add(48*time.Minute))
	now = start.Add(47 * time.Minute)
	expect("before 80%", "token-1-vault", start.Add(48*time.Minute))
	if hub.requests != 1 {
		t.Errorf("%d requests while the token was fresh", hub.requests)
	}
	now = start.Add(48 * time.Minute)
	expect("at 80%", "token-2-vault", now.Add(48*time.Minute))

	// The hub goes away: the valid token is served, retried later.
	issued := now
	hub.down = true
	now = issued.Add(50 * time.Minute)
	expect("refresh fails", "token-2-vault", now.Add(time.Minute))
	now = issued.Add(59*time.Minute + 30*time.Second)
	expect("retry capped by expiry", "token-2-vault", issued.Add(time.Hour))

	// The agent restarts, still offline: the stored token is served.
	c = cache()
	expect("after restart offline", "token-2-vault", issued.Add(time.Hour))

	// Expired and offline: an error, never the expired token.
	now = issued.Add(time.Hour)
	if tok, _, err := get(c); err == nil || tok != "" {
		t.Errorf("expired and offline: %q, %v; want an error", tok, err)
	}
	hub.down = false
	expect("back online", "token-3-vault", now.Add(48*time.Minute))

	// Long lifetimes are refreshed after 24h; a hub that gives less than
	// asked is refreshed at 80% of what it gave.
	long := filepath.Join(filepath.Dir(path), "token.long")
	if _, next, err := c.token(context.Background(), long, pod, "", 7*24*3600); err != nil || !next.Equal(now.Add(24*time.Hour)) {
		t.Errorf("week-long token: next %v, %v; want after 24h", next.Sub(now), err)
	}
	hub.life = 10 * time.Minute
	short := filepath.Join(filepath.Dir(path), "token.short")
	if _, next, err := c.token(context.Background(), short, pod, "", 3600); err != nil || !next.Equal(now.Add(8*time.Minute)) {
		t.Errorf("shortened token: next %v, %v; want after 8m", next.Sub(now), err)
	}
	// A token that is already expired is refused.
	hub.life = -time.Second
	if tok, _, err := c.token(context.Background(), filepath.Join(filepath.Dir(path), "token.bad"), pod, "", 3600); err == nil {
		t.Errorf("expired token from the hub served: %q", tok)
	}
}
