package restarts

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Containers of the scenarios, by state.
func fresh(name string, role Role) Container { return Container{Name: name, Role: role} }

func running(name string, role Role) Container {
	return Container{Name: name, Role: role, Created: true, Running: true, Started: true}
}

func starting(name string, role Role) Container {
	return Container{Name: name, Role: role, Created: true, Running: true}
}

func exited(name string, role Role, code int32) Container {
	return Container{Name: name, Role: role, Created: true, Started: true, ExitCode: code, FinishedAt: t0}
}

func rerun(c Container) Container { c.Rerun = true; return c }

func neverStarted(c Container) Container { c.Started = false; return c }

const (
	always    = corev1.RestartPolicyAlways
	onFailure = corev1.RestartPolicyOnFailure
	never     = corev1.RestartPolicyNever
)

func TestDecide(t *testing.T) {
	for _, tt := range []struct {
		name   string
		policy corev1.RestartPolicy
		cs     []Container
		// want lists the action of each container, in order.
		want       []Action
		initFailed bool
		done       bool
	}{
		// Init containers run one at a time, in order.
		{"first init container", always,
			[]Container{fresh("i1", Init), fresh("i2", Init), fresh("a", Regular)},
			[]Action{Start, Keep, Keep}, false, false},
		{"init container runs", always,
			[]Container{running("i1", Init), fresh("i2", Init), fresh("a", Regular)},
			[]Action{Keep, Keep, Keep}, false, false},
		{"next init container", always,
			[]Container{exited("i1", Init, 0), fresh("i2", Init), fresh("a", Regular)},
			[]Action{Keep, Start, Keep}, false, false},
		{"regular containers after init", always,
			[]Container{exited("i1", Init, 0), exited("i2", Init, 0), fresh("a", Regular), fresh("b", Regular)},
			[]Action{Keep, Keep, Start, Start}, false, false},
		{"no init containers", never,
			[]Container{fresh("a", Regular), fresh("b", Regular)},
			[]Action{Start, Start}, false, false},

		// A failed init container: Always counts as OnFailure; Never
		// fails the pod.
		{"failed init, Always", always,
			[]Container{exited("i1", Init, 1), fresh("a", Regular)},
			[]Action{Restart, Keep}, false, false},
		{"failed init, OnFailure", onFailure,
			[]Container{exited("i1", Init, 1), fresh("a", Regular)},
			[]Action{Restart, Keep}, false, false},
		{"failed init, Never", never,
			[]Container{exited("i1", Init, 1), fresh("i2", Init), fresh("a", Regular)},
			[]Action{Keep, Keep, Keep}, true, false},
		{"completed init is not restarted, Always", always,
			[]Container{exited("i1", Init, 0), running("a", Regular)},
			[]Action{Keep, Keep}, false, false},

		// Regular containers and the restart policy (the outcome table
		// of the pod lifecycle).
		{"exit 0, Always", always,
			[]Container{exited("a", Regular, 0)}, []Action{Restart}, false, false},
		{"exit 0, OnFailure", onFailure,
			[]Container{exited("a", Regular, 0)}, []Action{Keep}, false, true},
		{"exit 0, Never", never,
			[]Container{exited("a", Regular, 0)}, []Action{Keep}, false, true},
		{"exit 1, Always", always,
			[]Container{exited("a", Regular, 1)}, []Action{Restart}, false, false},
		{"exit 1, OnFailure", onFailure,
			[]Container{exited("a", Regular, 1)}, []Action{Restart}, false, false},
		{"exit 1, Never", never,
			[]Container{exited("a", Regular, 1)}, []Action{Keep}, false, true},
		{"one of two fails, Never", never,
			[]Container{exited("a", Regular, 1), running("b", Regular)}, []Action{Keep, Keep}, false, false},
		{"one of two fails, OnFailure", onFailure,
			[]Container{exited("a", Regular, 1), exited("b", Regular, 0)}, []Action{Restart, Keep}, false, false},
		{"empty policy is Always", "",
			[]Container{exited("a", Regular, 0)}, []Action{Restart}, false, false},

		// Sidecars: the next init container waits until the sidecar
		// started, then both run beside the regular containers.
		{"sidecar first", never,
			[]Container{fresh("s", Sidecar), fresh("i1", Init), fresh("a", Regular)},
			[]Action{Start, Keep, Keep}, false, false},
		{"sidecar starting", never,
			[]Container{starting("s", Sidecar), fresh("i1", Init), fresh("a", Regular)},
			[]Action{Keep, Keep, Keep}, false, false},
		{"sidecar started", never,
			[]Container{running("s", Sidecar), fresh("i1", Init), fresh("a", Regular)},
			[]Action{Keep, Start, Keep}, false, false},
		{"sidecar last before regular", never,
			[]Container{exited("i1", Init, 0), running("s", Sidecar), fresh("a", Regular)},
			[]Action{Keep, Keep, Start}, false, false},
		{"sidecar restarts whatever the policy", never,
			[]Container{exited("s", Sidecar, 0), running("a", Regular)},
			[]Action{Restart, Keep}, false, false},
		{"sidecar that never started holds the next init container", always,
			[]Container{neverStarted(exited("s", Sidecar, 1)), fresh("i1", Init), fresh("a", Regular)},
			[]Action{Restart, Keep, Keep}, false, false},
		{"sidecar with a later container created counts as started", always,
			[]Container{neverStarted(exited("s", Sidecar, 1)), exited("a", Regular, 1)},
			[]Action{Restart, Restart}, false, false},
		{"sidecar restarts while a later init container runs", onFailure,
			[]Container{exited("s", Sidecar, 2), running("i1", Init), fresh("a", Regular)},
			[]Action{Restart, Keep, Keep}, false, false},
		{"sidecars stop once the regular containers are done", never,
			[]Container{running("s1", Sidecar), exited("s2", Sidecar, 1), exited("a", Regular, 0)},
			[]Action{Stop, Keep, Keep}, false, true},
		{"sidecars keep running while Always restarts", always,
			[]Container{running("s", Sidecar), exited("a", Regular, 0)},
			[]Action{Keep, Restart}, false, false},
		{"sidecar stops when initialization failed", never,
			[]Container{running("s", Sidecar), exited("i1", Init, 1), fresh("a", Regular)},
			[]Action{Stop, Keep, Keep}, true, false},

		// A new sandbox runs the init containers again, in order.
		{"init containers again in a new sandbox", always,
			[]Container{rerun(exited("i1", Init, 0)), rerun(exited("i2", Init, 0)), exited("a", Regular, 255)},
			[]Action{Start, Keep, Keep}, false, false},
		{"second init container again", always,
			[]Container{exited("i1", Init, 0), rerun(exited("i2", Init, 0)), exited("a", Regular, 255)},
			[]Action{Keep, Start, Keep}, false, false},
		{"sidecar again in a new sandbox", always,
			[]Container{rerun(exited("s", Sidecar, 0)), rerun(exited("i1", Init, 0)), exited("a", Regular, 255)},
			[]Action{Start, Keep, Keep}, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			plan := Decide(tt.policy, tt.cs, t0)
			var got []Action
			for _, s := range plan.Steps {
				got = append(got, s.Action)
			}
			if !slices.Equal(got, tt.want) || plan.InitFailed != tt.initFailed || plan.Done != tt.done {
				t.Fatalf("got %v initFailed=%v done=%v, want %v initFailed=%v done=%v",
					got, plan.InitFailed, plan.Done, tt.want, tt.initFailed, tt.done)
			}
		})
	}
}

// TestDecideBackOff follows one crash-looping container through Decide:
// the first restart comes at once, the next ones after 10s, 20s, 40s ...
// up to 5 minutes, each counted from the exit.
func TestDecideBackOff(t *testing.T) {
	b := &Backoff{}
	c := Container{Name: "a", Role: Regular, Created: true, ExitCode: 1, Backoff: b}
	now := t0
	var waits []time.Duration
	for range 8 {
		c.FinishedAt = now
		plan := Decide(always, []Container{c}, now)
		wait := time.Duration(0)
		if s := plan.Steps[0]; s.Action == BackOff {
			if !s.Until.Equal(now.Add(s.Wait)) {
				t.Fatalf("back-off until %v, want exit + %v", s.Until, s.Wait)
			}
			wait = s.Wait
			// Asked again before the end: still waiting, same end.
			if again := Decide(always, []Container{c}, s.Until.Add(-time.Millisecond)).Steps[0]; again.Action != BackOff || !again.Until.Equal(s.Until) {
				t.Fatalf("asked again before the end: %+v", again)
			}
			now = s.Until
			if got := Decide(always, []Container{c}, now).Steps[0].Action; got != Restart {
				t.Fatalf("at the end of the back-off: %v", got)
			}
		} else if s.Action != Restart {
			t.Fatalf("step %+v", s)
		}
		waits = append(waits, wait)
		now = now.Add(time.Second) // runs 1s, then fails again
	}
	want := []time.Duration{0, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 300 * time.Second, 300 * time.Second}
	if !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}

	// Ten minutes of good running: the next exit restarts at once and
	// the back-off starts over.
	now = now.Add(10*time.Minute + time.Second)
	c.FinishedAt = now
	if s := Decide(always, []Container{c}, now).Steps[0]; s.Action != Restart {
		t.Fatalf("after 10 minutes running: %+v", s)
	}
	now = now.Add(time.Second)
	c.FinishedAt = now
	if s := Decide(always, []Container{c}, now).Steps[0]; s.Action != BackOff || s.Wait != 10*time.Second {
		t.Fatalf("after the reset: %+v", s)
	}
}

// TestDecideBackOffNotRecordedWhenStopped checks that a sidecar's exit in a
// pod that is done is not counted as a restart.
func TestDecideBackOffNotRecordedWhenStopped(t *testing.T) {
	b := &Backoff{}
	s := exited("s", Sidecar, 1)
	s.Backoff = b
	plan := Decide(never, []Container{s, exited("a", Regular, 0)}, t0)
	if plan.Steps[0].Action != Keep || !plan.Done {
		t.Fatalf("plan %+v", plan)
	}
	if b.Wait(t0.Add(time.Second)) != 0 {
		t.Fatal("a restart that did not happen lengthened the back-off")
	}
}

func TestInitRole(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	spec := &corev1.PodSpec{InitContainers: []corev1.Container{{Name: "i"}, {Name: "s", RestartPolicy: &always}}}
	if InitRole(&spec.InitContainers[0]) != Init || InitRole(&spec.InitContainers[1]) != Sidecar {
		t.Fatal("roles")
	}
	if IsSidecar(spec, "i") || !IsSidecar(spec, "s") || IsSidecar(spec, "x") {
		t.Fatal("IsSidecar")
	}
	if Policy(&corev1.PodSpec{}) != corev1.RestartPolicyAlways {
		t.Fatal("default policy")
	}
}

func TestReasons(t *testing.T) {
	for _, tt := range []struct {
		code int32
		oom  bool
		want string
	}{{0, false, "Completed"}, {1, false, "Error"}, {137, true, "OOMKilled"}, {0, true, "OOMKilled"}} {
		if got := ExitReason(tt.code, tt.oom); got != tt.want {
			t.Errorf("ExitReason(%d, %v) = %s, want %s", tt.code, tt.oom, got, tt.want)
		}
	}
	msg := BackOffMessage(20*time.Second, "app", "web", "default", "u1")
	if msg != "back-off 20s restarting failed container=app pod=web_default(u1)" || !strings.HasPrefix(msg, "back-off") {
		t.Fatalf("message %q", msg)
	}
}
