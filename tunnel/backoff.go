package tunnel

import (
	"math/rand/v2"
	"time"
)

// backoff is full-jitter exponential backoff: the n-th wait is drawn
// uniformly from [0, min(cap, base·2^n)). Full jitter, not ±10–20 %, so that
// a fleet that lost the hub at the same instant spreads its reconnects over
// the whole window instead of arriving in bunches.
type backoff struct {
	base, cap time.Duration
	n         int
}

// next returns the next wait and advances the exponent.
func (b *backoff) next() time.Duration {
	ceil := b.ceiling()
	if b.n < 62 {
		b.n++
	}
	if ceil <= 0 {
		return 0
	}
	return rand.N(ceil)
}

// ceiling is the current upper bound of the wait.
func (b *backoff) ceiling() time.Duration {
	d := b.base
	for i := 0; i < b.n && d < b.cap; i++ {
		d *= 2
	}
	return min(d, b.cap)
}

func (b *backoff) reset() { b.n = 0 }
