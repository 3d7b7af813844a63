package autoscaling

import (
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/utils/ptr"
)

func rules(window int32, sel autoscalingv2.ScalingPolicySelect, policies ...autoscalingv2.HPAScalingPolicy) *autoscalingv2.HPAScalingRules {
	return &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(window), SelectPolicy: ptr.To(sel), Policies: policies}
}

func pods(v, period int32) autoscalingv2.HPAScalingPolicy {
	return autoscalingv2.HPAScalingPolicy{Type: autoscalingv2.PodsScalingPolicy, Value: v, PeriodSeconds: period}
}

func percent(v, period int32) autoscalingv2.HPAScalingPolicy {
	return autoscalingv2.HPAScalingPolicy{Type: autoscalingv2.PercentScalingPolicy, Value: v, PeriodSeconds: period}
}

// TestStabilization checks the recommendation windows: without a
// behavior, a scale down takes the largest recommendation of the last
// five minutes; with one, a scale up takes the smallest of its window and
// a scale down the largest of its own.
func TestStabilization(t *testing.T) {
	t.Run("default downscale window", func(t *testing.T) {
		h := newHistory()
		h.initial("k", 10, t0)
		if got := h.stabilize("k", 4, DefaultDownscaleStabilization, t0.Add(time.Minute)); got != 10 {
			t.Errorf("after 1m: %d, want 10 (the initial recommendation is in the window)", got)
		}
		if got := h.stabilize("k", 3, DefaultDownscaleStabilization, t0.Add(5*time.Minute+time.Second)); got != 4 {
			t.Errorf("after 5m1s: %d, want 4 (the 1m recommendation is still in the window)", got)
		}
		if got := h.stabilize("k", 3, DefaultDownscaleStabilization, t0.Add(6*time.Minute+time.Second)); got != 3 {
			t.Errorf("after 6m1s: %d, want 3", got)
		}
		if got := h.stabilize("k", 8, DefaultDownscaleStabilization, t0.Add(7*time.Minute)); got != 8 {
			t.Errorf("a scale up is not held: %d, want 8", got)
		}
	})
	t.Run("behavior windows", func(t *testing.T) {
		h := newHistory()
		up := rules(60, autoscalingv2.MaxChangePolicySelect, pods(4, 15))
		down := rules(300, autoscalingv2.MaxChangePolicySelect, percent(100, 15))
		h.initial("k", 2, t0)
		got, reason, _ := h.stabilizeWithBehavior("k", 2, 8, up, down, t0.Add(10*time.Second))
		if got != 2 || reason != "ScaleUpStabilized" {
			t.Errorf("scale up within 60s window: %d %s, want 2 ScaleUpStabilized", got, reason)
		}
		got, _, _ = h.stabilizeWithBehavior("k", 2, 8, up, down, t0.Add(71*time.Second))
		if got != 8 {
			t.Errorf("scale up after the window: %d, want 8", got)
		}
		got, reason, msg := h.stabilizeWithBehavior("k", 8, 3, up, down, t0.Add(2*time.Minute))
		if got != 8 || reason != "ScaleDownStabilized" || msg != "recent recommendations were higher than current one, applying the highest recent recommendation" {
			t.Errorf("scale down within 300s window: %d %s %q", got, reason, msg)
		}
		got, _, _ = h.stabilizeWithBehavior("k", 8, 3, up, down, t0.Add(8*time.Minute))
		if got != 3 {
			t.Errorf("scale down after the window: %d, want 3", got)
		}
	})
}

// TestRateLimits checks the scaling policies (Pods and Percent per
// period, selectPolicy Max, Min and Disabled, counting rescales within
// the period) and the min/max clamp with their ScalingLimited reasons.
func TestRateLimits(t *testing.T) {
	defUp := rules(0, autoscalingv2.MaxChangePolicySelect, pods(4, 15), percent(100, 15))
	defDown := rules(300, autoscalingv2.MaxChangePolicySelect, percent(100, 15))
	type scaled struct {
		from, to int32
		at       time.Duration
	}
	cases := []struct {
		name             string
		up, down         *autoscalingv2.HPAScalingRules
		history          []scaled
		at               time.Duration
		current, desired int32
		minR, maxR       int32
		want             int32
		wantReason       string
	}{
		{name: "max of pods and percent", up: defUp, down: defDown, current: 2, desired: 20, minR: 1, maxR: 50, want: 6, wantReason: "ScaleUpLimit"},
		{name: "min of pods and percent", up: rules(0, autoscalingv2.MinChangePolicySelect, pods(4, 15), percent(100, 15)), down: defDown, current: 2, desired: 20, minR: 1, maxR: 50, want: 4, wantReason: "ScaleUpLimit"},
		{name: "scale up disabled", up: rules(0, autoscalingv2.DisabledPolicySelect, pods(4, 15)), down: defDown, current: 2, desired: 20, minR: 1, maxR: 50, want: 2, wantReason: "ScaleUpLimit"},
		{name: "rescale within the period counts", up: rules(0, autoscalingv2.MaxChangePolicySelect, pods(4, 15)), down: defDown,
			history: []scaled{{2, 6, 0}}, at: 5 * time.Second, current: 6, desired: 20, minR: 1, maxR: 50, want: 6, wantReason: "ScaleUpLimit"},
		{name: "rescale before the period does not", up: rules(0, autoscalingv2.MaxChangePolicySelect, pods(4, 15)), down: defDown,
			history: []scaled{{2, 6, 0}}, at: 16 * time.Second, current: 6, desired: 20, minR: 1, maxR: 50, want: 10, wantReason: "ScaleUpLimit"},
		{name: "percent down", up: defUp, down: rules(0, autoscalingv2.MaxChangePolicySelect, percent(50, 60)), current: 10, desired: 1, minR: 1, maxR: 50, want: 5, wantReason: "ScaleDownLimit"},
		{name: "min change down", up: defUp, down: rules(0, autoscalingv2.MinChangePolicySelect, pods(1, 60), percent(50, 60)), current: 10, desired: 1, minR: 1, maxR: 50, want: 9, wantReason: "ScaleDownLimit"},
		{name: "scale down disabled", up: defUp, down: rules(0, autoscalingv2.DisabledPolicySelect, percent(100, 15)), current: 10, desired: 1, minR: 1, maxR: 50, want: 10, wantReason: "ScaleDownLimit"},
		{name: "too many", up: rules(0, autoscalingv2.MaxChangePolicySelect, pods(100, 15)), down: defDown, current: 2, desired: 20, minR: 1, maxR: 5, want: 5, wantReason: "TooManyReplicas"},
		{name: "too few", up: defUp, down: defDown, current: 4, desired: 1, minR: 2, maxR: 5, want: 2, wantReason: "TooFewReplicas"},
		{name: "within range", up: defUp, down: defDown, current: 4, desired: 5, minR: 2, maxR: 10, want: 5, wantReason: "DesiredWithinRange"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHistory()
			b := &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleUp: c.up, ScaleDown: c.down}
			for _, s := range c.history {
				h.storeScale("k", b, s.from, s.to, t0.Add(s.at))
			}
			got, reason, _ := h.rateLimited("k", c.current, c.desired, c.minR, c.maxR, c.up, c.down, t0.Add(c.at))
			if got != c.want || reason != c.wantReason {
				t.Errorf("got %d %s, want %d %s", got, reason, c.want, c.wantReason)
			}
		})
	}
}

// TestLimitWithoutBehavior checks the limits of an autoscaler without a
// behavior: at most max(2×current, 4) at once, and min/max.
func TestLimitWithoutBehavior(t *testing.T) {
	for _, c := range []struct {
		current, desired, minR, maxR, want int32
		reason                             string
	}{
		{3, 10, 1, 20, 6, "ScaleUpLimit"},
		{1, 10, 1, 20, 4, "ScaleUpLimit"},
		{3, 10, 1, 5, 5, "TooManyReplicas"},
		{3, 0, 1, 5, 1, "TooFewReplicas"},
		{3, 4, 1, 5, 4, "DesiredWithinRange"},
	} {
		got, reason, _ := limitWithRules(c.current, c.desired, c.minR, c.maxR)
		if got != c.want || reason != c.reason {
			t.Errorf("limit(%d→%d in [%d,%d]) = %d %s, want %d %s", c.current, c.desired, c.minR, c.maxR, got, reason, c.want, c.reason)
		}
	}
}

// TestBehaviorDefaults checks the defaults filled into a partial
// behavior: upstream's policies and the controller's scale-down window.
func TestBehaviorDefaults(t *testing.T) {
	b := withDefaults(&autoscalingv2.HorizontalPodAutoscalerBehavior{}, DefaultDownscaleStabilization)
	if *b.ScaleDown.StabilizationWindowSeconds != 300 || *b.ScaleUp.StabilizationWindowSeconds != 0 {
		t.Errorf("windows: up %d down %d", *b.ScaleUp.StabilizationWindowSeconds, *b.ScaleDown.StabilizationWindowSeconds)
	}
	if len(b.ScaleUp.Policies) != 2 || len(b.ScaleDown.Policies) != 1 || *b.ScaleUp.SelectPolicy != autoscalingv2.MaxChangePolicySelect {
		t.Errorf("policies: %+v %+v", b.ScaleUp, b.ScaleDown)
	}
}
