package sim

import (
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge/restarts"
)

// Annotations that make a simulated pod misbehave. Each may also be given
// for one container as "<annotation>.<container name>" (for example
// sim.tether.dev/exit-code.migrate), which overrides the pod-wide value for
// that container.
//
// The pod-wide ExitCode, CrashAfter, HangStart and NotReady apply to the
// regular containers only: init containers, unless told otherwise by the
// per-container form, run to completion and exit 0 right after they start,
// and sidecars (init containers with restartPolicy Always) run until they
// are stopped.
// StartDelay, StopDelay and LogInterval apply to every container.
const (
	// StartDelay (a Go duration, e.g. "2s") is how long a container takes
	// from its creation to running; it overrides the runtime's default.
	StartDelay = "sim.tether.dev/start-delay"
	// ExitCode (an integer) makes containers exit with that code: right
	// after they start, or after CrashAfter when it is set. 0 makes a
	// container that completes.
	ExitCode = "sim.tether.dev/exit-code"
	// CrashAfter (a duration) makes containers exit that long after they
	// start, with ExitCode or, when ExitCode is not set, 1.
	CrashAfter = "sim.tether.dev/crash-after"
	// HangStart ("true") makes containers never start: they stay waiting
	// in ContainerCreating.
	HangStart = "sim.tether.dev/hang-start"
	// NotReady ("true") makes running containers never ready.
	NotReady = "sim.tether.dev/not-ready"
	// StopDelay (a duration) is how long containers take to exit after
	// the stop signal (default: at once, exit code 0). When it exceeds
	// the grace period they are killed at its end with exit code 137.
	StopDelay = "sim.tether.dev/stop-delay"
	// LogInterval (a duration) is the time between synthetic log lines;
	// it overrides the runtime's default. "0" means no periodic lines.
	LogInterval = "sim.tether.dev/log-interval"
)

// behaviour is what one container does.
type behaviour struct {
	startDelay  time.Duration
	exits       bool // exits on its own, after exitAfter with exitCode
	exitAfter   time.Duration
	exitCode    int32
	hang        bool
	notReady    bool
	stopDelay   time.Duration
	logInterval time.Duration
}

// behaviourOf reads the annotations for container name of pod.
func (r *Runtime) behaviourOf(pod *corev1.Pod, name string, role restarts.Role) (behaviour, error) {
	b := behaviour{startDelay: r.cfg.StartDelay, logInterval: r.logInterval()}
	if role == restarts.Init {
		b.exits = true
	}
	ann := pod.Annotations
	// lookup returns the per-container value, or the pod-wide one when
	// podWide allows it.
	lookup := func(key string, podWide bool) (string, string, bool) {
		if v, ok := ann[key+"."+name]; ok {
			return key + "." + name, v, true
		}
		if v, ok := ann[key]; ok && podWide {
			return key, v, true
		}
		return "", "", false
	}
	app := role == restarts.Regular
	var err error
	dur := func(key string, podWide bool, dst *time.Duration) {
		if k, v, ok := lookup(key, podWide); ok && err == nil {
			d, perr := time.ParseDuration(v)
			if perr != nil || d < 0 {
				err = fmt.Errorf("annotation %s: %q is not a non-negative duration", k, v)
				return
			}
			*dst = d
		}
	}
	boolean := func(key string, podWide bool, dst *bool) {
		if k, v, ok := lookup(key, podWide); ok && err == nil {
			bv, perr := strconv.ParseBool(v)
			if perr != nil {
				err = fmt.Errorf("annotation %s: %q is not a boolean", k, v)
				return
			}
			*dst = bv
		}
	}
	dur(StartDelay, true, &b.startDelay)
	dur(StopDelay, true, &b.stopDelay)
	dur(LogInterval, true, &b.logInterval)
	boolean(HangStart, app, &b.hang)
	boolean(NotReady, app, &b.notReady)
	var crashAfter time.Duration
	_, _, hasCrash := lookup(CrashAfter, app)
	dur(CrashAfter, app, &crashAfter)
	k, v, hasCode := lookup(ExitCode, app)
	if hasCode && err == nil {
		code, perr := strconv.ParseInt(v, 10, 32)
		if perr != nil || code < 0 || code > 255 {
			return b, fmt.Errorf("annotation %s: %q is not an exit code (0-255)", k, v)
		}
		b.exitCode = int32(code)
	}
	if err != nil {
		return b, err
	}
	switch {
	case hasCrash:
		b.exits, b.exitAfter = true, crashAfter
		if !hasCode {
			b.exitCode = 1
		}
	case hasCode:
		b.exits, b.exitAfter = true, 0
	}
	return b, nil
}
