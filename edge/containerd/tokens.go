package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
)

// Service account tokens of projected volumes are requested from the hub
// and kept in the pod's directory (readable by root only) with their
// expiry and the time to refresh them, so that a pod keeps its token
// across agent restarts and starts with it while the hub is out of reach.
// As the kubelet does, a token is refreshed once 80% of its lifetime
// passed, or 24 hours after it was issued, whichever comes first; the pod
// is woken then, so the volume's file is replaced while the pod runs.

const (
	// tokenRefreshWait bounds a refresh while the held token is still
	// valid: offline, the pod goes on with it rather than waiting for the
	// tunnel.
	tokenRefreshWait = 5 * time.Second
	// tokenRetry is when a failed refresh is tried again.
	tokenRetry = 30 * time.Second
	// tokenMaxAge is the longest a token is kept before it is refreshed.
	tokenMaxAge = 24 * time.Hour
	// defaultTokenSeconds is the lifetime asked for when the projection
	// gives none (the API's default).
	defaultTokenSeconds = 3600
)

// tokenCache hands out the service account tokens of projections, each
// stored in its own file.
type tokenCache struct {
	now     func() time.Time
	sources func() edge.Sources
	// refreshWait and retry default to tokenRefreshWait and tokenRetry.
	refreshWait, retry time.Duration
}

// storedToken is the file of one projection's token.
type storedToken struct {
	Token     string    `json:"token"`
	Expires   time.Time `json:"expires"`
	RefreshAt time.Time `json:"refreshAt"`
}

// token returns the token of a projection stored at path and when to call
// again: the stored one while it is valid and not due for a refresh, else a
// new one from the hub. When the hub does not answer, a still valid stored
// token is returned, to be refreshed after retry; an expired one never is:
// then the error says the pod must wait.
func (c *tokenCache) token(ctx context.Context, path string, pod *corev1.Pod, audience string, expirationSeconds int64) (string, time.Time, error) {
	now := c.now()
	old, err := readStoredToken(path)
	valid := err == nil && now.Before(old.Expires)
	if valid && now.Before(old.RefreshAt) {
		return old.Token, old.RefreshAt, nil
	}
	if expirationSeconds <= 0 {
		expirationSeconds = defaultTokenSeconds
	}
	tok, expires, err := c.request(ctx, pod, audience, expirationSeconds, valid)
	if err == nil && !expires.After(c.now()) {
		err = fmt.Errorf("the hub gave a token that expired at %s", expires.Format(time.RFC3339))
	}
	if err != nil {
		if valid {
			retry := c.retry
			if retry <= 0 {
				retry = tokenRetry
			}
			return old.Token, earliest(now.Add(retry), old.Expires), nil
		}
		return "", time.Time{}, fmt.Errorf("get service account token: %w", err)
	}
	now = c.now()
	st := storedToken{Token: tok, Expires: expires, RefreshAt: refreshTime(now, expires, expirationSeconds)}
	if err := writeStoredToken(path, st); err != nil {
		return "", time.Time{}, err
	}
	return st.Token, st.RefreshAt, nil
}

// request asks the hub for a token, for at most refreshWait when a valid
// one is held.
func (c *tokenCache) request(ctx context.Context, pod *corev1.Pod, audience string, seconds int64, holding bool) (string, time.Time, error) {
	src := c.sources()
	if src == nil {
		return "", time.Time{}, errors.New("no source of tokens")
	}
	if holding {
		wait := c.refreshWait
		if wait <= 0 {
			wait = tokenRefreshWait
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	return src.ServiceAccountToken(ctx, pod, audience, seconds)
}

// refreshTime is when a token issued now and expiring at expires, asked
// for seconds, is refreshed: at 80% of its lifetime, or tokenMaxAge after
// it was issued.
func refreshTime(now, expires time.Time, seconds int64) time.Time {
	ttl := time.Duration(seconds) * time.Second
	if left := expires.Sub(now); left < ttl {
		ttl = left
	}
	issued := expires.Add(-ttl)
	return earliest(expires.Add(-ttl/5), issued.Add(tokenMaxAge))
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func readStoredToken(path string) (storedToken, error) {
	var st storedToken
	b, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Token == "" {
		return st, fmt.Errorf("read stored token %s: not a stored token", path)
	}
	return st, nil
}

func writeStoredToken(path string, st storedToken) error {
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("store service account token: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("store service account token: %w", err)
	}
	if err := writeFileAtomic(path, b, 0o600); err != nil {
		return fmt.Errorf("store service account token: %w", err)
	}
	return nil
}

// tokenFile is where the token of projection t of the pod in dir is kept.
func tokenFile(dir string, t *corev1.ServiceAccountTokenProjection) string {
	return filepath.Join(dir, "tokens", strings.ReplaceAll(t.Path, "/", "_")+"."+t.Audience)
}

// projectToken puts the pod's token of projection t in files and wakes the
// pod when it is due for a refresh.
func (r *Runtime) projectToken(ctx context.Context, p *pod, pod *corev1.Pod, t *corev1.ServiceAccountTokenProjection, def os.FileMode, files map[string]projFile) error {
	c := tokenCache{now: time.Now, sources: r.sources}
	var seconds int64
	if t.ExpirationSeconds != nil {
		seconds = *t.ExpirationSeconds
	}
	tok, next, err := c.token(ctx, tokenFile(p.dir, t), pod, t.Audience, seconds)
	if err != nil {
		return err
	}
	files[t.Path] = projFile{data: []byte(tok), mode: def}
	p.mu.Lock()
	r.wakeAt(p, next)
	p.mu.Unlock()
	return nil
}
