package autoscaling

import (
	"math"
	"sync"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/utils/ptr"
)

// Without a behavior, a scale up goes at most to max(2×current, 4).
const (
	scaleUpLimitFactor  = 2.0
	scaleUpLimitMinimum = 4.0
)

// recommendation is one unstabilized replica count proposed at a time.
type recommendation struct {
	replicas int32
	at       time.Time
}

// scaleEvent is one rescale: how many replicas it added or removed.
type scaleEvent struct {
	change   int32
	at       time.Time
	outdated bool
}

// history is what the controller remembers of each autoscaler between
// syncs: its recent recommendations and rescales, by namespace/name key.
// It lives in memory only, as upstream's does: a restarted controller
// starts each autoscaler's windows afresh.
type history struct {
	mu              sync.Mutex
	recommendations map[string][]recommendation
	scaleUps        map[string][]scaleEvent
	scaleDowns      map[string][]scaleEvent
}

func newHistory() *history {
	return &history{
		recommendations: map[string][]recommendation{},
		scaleUps:        map[string][]scaleEvent{},
		scaleDowns:      map[string][]scaleEvent{},
	}
}

// forget drops an autoscaler's history.
func (h *history) forget(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.recommendations, key)
	delete(h.scaleUps, key)
	delete(h.scaleDowns, key)
}

// initial records current as the first recommendation of a new
// autoscaler, so that its first scale down waits out the window.
func (h *history) initial(key string, current int32, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.recommendations[key] == nil {
		h.recommendations[key] = []recommendation{{current, now}}
	}
}

// record stores rec, reusing the slot of one that fell out of every
// window.
func (h *history) record(key string, rec recommendation, old int, found bool) {
	if found {
		h.recommendations[key][old] = rec
		return
	}
	h.recommendations[key] = append(h.recommendations[key], rec)
}

// stabilize (no behavior) returns the largest recommendation of the
// downscale window, desired included, and records desired.
func (h *history) stabilize(key string, desired int32, window time.Duration, now time.Time) int32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	best, old, found := desired, 0, false
	cutoff := now.Add(-window)
	for i, r := range h.recommendations[key] {
		if r.at.Before(cutoff) {
			old, found = i, true
		} else if r.replicas > best {
			best = r.replicas
		}
	}
	h.record(key, recommendation{desired, now}, old, found)
	return best
}

// stabilizeWithBehavior returns current brought within the smallest
// recommendation of the scale-up window and the largest of the scale-down
// window (desired included), records desired, and says which window held
// it back.
func (h *history) stabilizeWithBehavior(key string, current, desired int32, up, down *autoscalingv2.HPAScalingRules, now time.Time) (int32, string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	upCutoff := now.Add(-time.Duration(ptr.Deref(up.StabilizationWindowSeconds, 0)) * time.Second)
	downCutoff := now.Add(-time.Duration(ptr.Deref(down.StabilizationWindowSeconds, 0)) * time.Second)
	upRec, downRec := desired, desired
	old, found := 0, false
	for i, r := range h.recommendations[key] {
		if r.at.After(upCutoff) {
			upRec = min(upRec, r.replicas)
		}
		if r.at.After(downCutoff) {
			downRec = max(downRec, r.replicas)
		}
		if r.at.Before(upCutoff) && r.at.Before(downCutoff) {
			old, found = i, true
		}
	}
	rec := current
	if rec < upRec {
		rec = upRec
	}
	if rec > downRec {
		rec = downRec
	}
	h.record(key, recommendation{desired, now}, old, found)
	if desired >= current {
		return rec, "ScaleUpStabilized", "recent recommendations were lower than current one, applying the lowest recent recommendation"
	}
	return rec, "ScaleDownStabilized", "recent recommendations were higher than current one, applying the highest recent recommendation"
}

// storeScale remembers a rescale for the policies' periods.
func (h *history) storeScale(key string, b *autoscalingv2.HorizontalPodAutoscalerBehavior, from, to int32, now time.Time) {
	if b == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	events, rules, change := h.scaleUps, b.ScaleUp, to-from
	if to < from {
		events, rules, change = h.scaleDowns, b.ScaleDown, from-to
	}
	list := events[key]
	cutoff := now.Add(-time.Duration(longestPeriod(rules)) * time.Second)
	slot := -1
	for i := range list {
		if list[i].at.Before(cutoff) {
			list[i].outdated = true
		}
		if list[i].outdated {
			slot = i
		}
	}
	ev := scaleEvent{change: change, at: now}
	if slot >= 0 {
		list[slot] = ev
	} else {
		list = append(list, ev)
	}
	events[key] = list
}

// rateLimited applies the behavior's policies and min/max to a stabilized
// recommendation, and says what limited it.
func (h *history) rateLimited(key string, current, desired, minReplicas, maxReplicas int32, up, down *autoscalingv2.HPAScalingRules, now time.Time) (int32, string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case desired > current:
		limit := max(scaleUpLimit(current, h.scaleUps[key], h.scaleDowns[key], up, now), current)
		allowed, reason, message := maxReplicas, "TooManyReplicas", "the desired replica count is more than the maximum replica count"
		if allowed > limit {
			allowed, reason, message = limit, "ScaleUpLimit", "the desired replica count is increasing faster than the maximum scale rate"
		}
		if desired > allowed {
			return allowed, reason, message
		}
	case desired < current:
		limit := min(scaleDownLimit(current, h.scaleUps[key], h.scaleDowns[key], down, now), current)
		allowed, reason, message := minReplicas, "TooFewReplicas", "the desired replica count is less than the minimum replica count"
		if allowed < limit {
			allowed, reason, message = limit, "ScaleDownLimit", "the desired replica count is decreasing faster than the maximum scale rate"
		}
		if desired < allowed {
			return allowed, reason, message
		}
	}
	return desired, "DesiredWithinRange", "the desired count is within the acceptable range"
}

// limitWithRules applies min/max and, without a behavior, the default
// scale-up limit.
func limitWithRules(current, desired, minReplicas, maxReplicas int32) (int32, string, string) {
	upLimit := int32(math.Max(scaleUpLimitFactor*float64(current), scaleUpLimitMinimum))
	allowed, reason, message := maxReplicas, "TooManyReplicas", "the desired replica count is more than the maximum replica count"
	if maxReplicas > upLimit {
		allowed, reason, message = upLimit, "ScaleUpLimit", "the desired replica count is increasing faster than the maximum scale rate"
	}
	if desired < minReplicas {
		return minReplicas, "TooFewReplicas", "the desired replica count is less than the minimum replica count"
	}
	if desired > allowed {
		return allowed, reason, message
	}
	return desired, "DesiredWithinRange", "the desired count is within the acceptable range"
}

// changeInPeriod sums the changes of events within the last period
// seconds.
func changeInPeriod(period int32, events []scaleEvent, now time.Time) int32 {
	cutoff := now.Add(-time.Duration(period) * time.Second)
	var sum int32
	for _, e := range events {
		if e.at.After(cutoff) {
			sum += e.change
		}
	}
	return sum
}

// scaleUpLimit is the most replicas the scale-up policies allow now.
func scaleUpLimit(current int32, ups, downs []scaleEvent, rules *autoscalingv2.HPAScalingRules, now time.Time) int32 {
	sel := ptr.Deref(rules.SelectPolicy, autoscalingv2.MaxChangePolicySelect)
	if sel == autoscalingv2.DisabledPolicySelect {
		return current
	}
	result, pick := int32(math.MinInt32), func(a, b int32) int32 { return max(a, b) }
	if sel == autoscalingv2.MinChangePolicySelect {
		result, pick = math.MaxInt32, func(a, b int32) int32 { return min(a, b) }
	}
	for _, p := range rules.Policies {
		start := current - changeInPeriod(p.PeriodSeconds, ups, now) + changeInPeriod(p.PeriodSeconds, downs, now)
		var proposed int32
		switch p.Type {
		case autoscalingv2.PodsScalingPolicy:
			proposed = start + p.Value
		case autoscalingv2.PercentScalingPolicy:
			proposed = int32(math.Ceil(float64(start) * (1 + float64(p.Value)/100)))
		}
		result = pick(result, proposed)
	}
	return result
}

// scaleDownLimit is the fewest replicas the scale-down policies allow now.
func scaleDownLimit(current int32, ups, downs []scaleEvent, rules *autoscalingv2.HPAScalingRules, now time.Time) int32 {
	sel := ptr.Deref(rules.SelectPolicy, autoscalingv2.MaxChangePolicySelect)
	if sel == autoscalingv2.DisabledPolicySelect {
		return current
	}
	result, pick := int32(math.MaxInt32), func(a, b int32) int32 { return min(a, b) }
	if sel == autoscalingv2.MinChangePolicySelect {
		result, pick = math.MinInt32, func(a, b int32) int32 { return max(a, b) }
	}
	for _, p := range rules.Policies {
		start := current - changeInPeriod(p.PeriodSeconds, ups, now) + changeInPeriod(p.PeriodSeconds, downs, now)
		var proposed int32
		switch p.Type {
		case autoscalingv2.PodsScalingPolicy:
			proposed = start - p.Value
		case autoscalingv2.PercentScalingPolicy:
			proposed = int32(float64(start) * (1 - float64(p.Value)/100))
		}
		result = pick(result, proposed)
	}
	return result
}

func longestPeriod(rules *autoscalingv2.HPAScalingRules) int32 {
	var longest int32
	if rules == nil {
		return 0
	}
	for _, p := range rules.Policies {
		longest = max(longest, p.PeriodSeconds)
	}
	return longest
}

// withDefaults returns behavior with upstream's defaults filled in where
// unset, as the API server defaults it, so that an autoscaler stored by
// any means behaves the same: scale up by the larger of 4 pods or 100%
// per 15 s with no stabilization; scale down by up to 100% per 15 s after
// downWindow of stabilization.
func withDefaults(b *autoscalingv2.HorizontalPodAutoscalerBehavior, downWindow time.Duration) *autoscalingv2.HorizontalPodAutoscalerBehavior {
	out := b.DeepCopy()
	if out.ScaleUp == nil {
		out.ScaleUp = &autoscalingv2.HPAScalingRules{}
	}
	if out.ScaleUp.StabilizationWindowSeconds == nil {
		out.ScaleUp.StabilizationWindowSeconds = ptr.To[int32](0)
	}
	if out.ScaleUp.SelectPolicy == nil {
		out.ScaleUp.SelectPolicy = ptr.To(autoscalingv2.MaxChangePolicySelect)
	}
	if len(out.ScaleUp.Policies) == 0 {
		out.ScaleUp.Policies = []autoscalingv2.HPAScalingPolicy{
			{Type: autoscalingv2.PodsScalingPolicy, Value: 4, PeriodSeconds: 15},
			{Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 15},
		}
	}
	if out.ScaleDown == nil {
		out.ScaleDown = &autoscalingv2.HPAScalingRules{}
	}
	if out.ScaleDown.StabilizationWindowSeconds == nil {
		out.ScaleDown.StabilizationWindowSeconds = ptr.To(int32(downWindow / time.Second))
	}
	if out.ScaleDown.SelectPolicy == nil {
		out.ScaleDown.SelectPolicy = ptr.To(autoscalingv2.MaxChangePolicySelect)
	}
	if len(out.ScaleDown.Policies) == 0 {
		out.ScaleDown.Policies = []autoscalingv2.HPAScalingPolicy{
			{Type: autoscalingv2.PercentScalingPolicy, Value: 100, PeriodSeconds: 15},
		}
	}
	return out
}
