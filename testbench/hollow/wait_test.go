package hollow_test

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/testbench/hollow"
)

// waiter runs the fleet test's waits. Every wait has a name, says what it
// waits for and what its deadline is; when one fails it says how far it
// got and how loaded the machine was, so that a failure on a busy machine
// tells which deadline the load broke. Two kinds of wait:
//
//   - deadline: the time is what the test asserts (nodes see a hub
//     restart within so long); it holds however loaded the machine is;
//   - progress: the time is only measured; the wait fails when nothing
//     moved for its stall allowance, or at ten times its nominal deadline.
type waiter struct {
	t     *testing.T
	start time.Time // of the test
}

// loadAverage returns the machine's 1, 5 and 15 minute load averages and
// its CPU count, as "1.20 0.80 0.50 on 2 CPUs".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return fmt.Sprintf("unknown (%v)", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return fmt.Sprintf("%s %s %s on %d CPUs", f[0], f[1], f[2], runtime.NumCPU())
}

// firstServe returns when the hub at addr first completes a TLS handshake
// on its port, polling every 20ms, or the zero time after limit. The hub
// opens its port early in its start but serves TLS on it from the moment
// it serves the tunnel. The handshake only tells that it serves: the
// hub's certificate is not checked.
func firstServe(addr string, limit time.Duration) time.Time {
	end := time.Now().Add(limit)
	for time.Now().Before(end) {
		d := &net.Dialer{Timeout: time.Second}
		c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err == nil {
			c.Close()
			return time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Time{}
}

// deadline waits until check reports all done, for at most d from now.
// check returns how many are done, how many should be, and a description
// of the state.
func (w *waiter) deadline(name, what string, d time.Duration, check func() (done, want int, state string)) time.Duration {
	w.t.Helper()
	return w.deadlineFrom(time.Now(), name, what, d, check)
}

// deadlineFrom is deadline with the clock started at from.
func (w *waiter) deadlineFrom(from time.Time, name, what string, d time.Duration, check func() (done, want int, state string)) time.Duration {
	w.t.Helper()
	return w.wait(from, name, what, d, 0, d, check, nil)
}

// progress waits until check reports all done; it fails when the count
// did not move for stall, or after ten times the nominal deadline d. An
// explain function, when given, adds to the failure what it returns.
func (w *waiter) progress(name, what string, d, stall time.Duration, check func() (done, want int, state string), explain ...func() string) time.Duration {
	w.t.Helper()
	var why func() string
	if len(explain) > 0 {
		why = explain[0]
	}
	return w.wait(time.Now(), name, what, d, stall, 10*d, check, why)
}

func (w *waiter) wait(from time.Time, name, what string, nominal, stall, limit time.Duration, check func() (done, want int, state string), explain func() string) time.Duration {
	w.t.Helper()
	loadAtStart := loadAverage()
	last, lastMoved := -1, time.Now()
	for {
		done, want, state := check()
		now := time.Now()
		took := now.Sub(from)
		if done >= want {
			kind := fmt.Sprintf("deadline %v", nominal)
			if stall > 0 {
				kind = fmt.Sprintf("nominal %v, measured only", nominal)
			}
			w.t.Logf("wait %q: %s after %v (%s); load average %s", name, what, took.Round(time.Millisecond), kind, loadAverage())
			return took
		}
		if done != last {
			last, lastMoved = done, now
		}
		var broke string
		switch {
		case stall == 0 && took > limit:
			broke = fmt.Sprintf("deadline %v broken", limit)
		case stall > 0 && now.Sub(lastMoved) > stall:
			broke = fmt.Sprintf("no progress for %v (nominal deadline %v)", stall, nominal)
		case stall > 0 && took > limit:
			broke = fmt.Sprintf("still moving but past %v, ten times the nominal deadline %v", limit, nominal)
		}
		if broke != "" {
			// Where the agents still waiting are stuck: the fleet's
			// goroutines grouped by stack, largest groups first.
			var b strings.Builder
			pprof.Lookup("goroutine").WriteTo(&b, 1)
			dump := b.String()
			if len(dump) > 200_000 {
				dump = dump[:200_000] + "\n[truncated]"
			}
			if explain != nil {
				state += "\n" + explain()
			}
			w.t.Fatalf("wait %q: %s: waited %v for %s and got %d of %d (%s), %v into the test; "+
				"load average %s now, %s when the wait began\ngoroutines:\n%s",
				name, broke, took.Round(time.Millisecond), what, done, want, state,
				now.Sub(w.start).Round(time.Second), loadAverage(), loadAtStart, dump)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// fleetCount is a check for the waiter on f's counters: count says how
// far the fleet got, out of its agents; an agent that failed fails the
// test at once.
func fleetCount(t *testing.T, f *hollow.Fleet, what string, count func(hollow.Stats) int) func() (int, int, string) {
	return func() (int, int, string) {
		s := f.Stats()
		if s.Failed > 0 {
			t.Fatalf("%s: %d agents failed: %s", what, s.Failed, s)
		}
		return count(s), s.Agents, s.String()
	}
}
