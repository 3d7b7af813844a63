package restarts

import "time"

// Default crash-loop back-off of the kubelet.
const (
	DefaultBackoffBase = 10 * time.Second
	DefaultBackoffMax  = 5 * time.Minute
)

// Backoff is the crash-loop back-off of one container: the first restart
// after an exit happens at once, each later one waits Base, then twice as
// long as the previous wait, up to Max. A container that ran for more than
// twice Max since its last restart starts over at once. Runtimes also use
// it to space out the pulls of an image that failed to pull, as the kubelet
// does.
type Backoff struct {
	// Base is the first non-zero wait; zero means 10s.
	Base time.Duration
	// Max caps the wait; zero means 5m.
	Max time.Duration

	current     time.Duration
	lastRestart time.Time
}

func (b *Backoff) base() time.Duration {
	if b.Base <= 0 {
		return DefaultBackoffBase
	}
	return b.Base
}

func (b *Backoff) max() time.Duration {
	if b.Max <= 0 {
		return DefaultBackoffMax
	}
	return b.Max
}

func (b *Backoff) expired(t time.Time) bool {
	return b.current == 0 || t.Sub(b.lastRestart) > 2*b.max()
}

// Wait returns how long a container that exited at finished must wait,
// counted from finished, before it is restarted.
func (b *Backoff) Wait(finished time.Time) time.Duration {
	if b.expired(finished) {
		return 0
	}
	return b.current
}

// Restarted records a restart at now and lengthens the next wait.
func (b *Backoff) Restarted(now time.Time) {
	if b.expired(now) {
		b.current = b.base()
	} else {
		b.current = min(2*b.current, b.max())
	}
	b.lastRestart = now
}
