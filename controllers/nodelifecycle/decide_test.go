package nodelifecycle

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func cond(status corev1.ConditionStatus, reason string) *corev1.NodeCondition {
	return &corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason}
}

func TestDecide(t *testing.T) {
	const grace, deadGrace = 40 * time.Second, 10 * time.Second
	unreachable := Decision{State: Unreachable, MarkUnknown: true, NoSchedule: TaintUnreachable, NoExecute: TaintUnreachable, MarkPodsNotReady: true, Message: MessageStatusUnknown}
	partitioned := Decision{State: Partitioned, MarkUnknown: true, NoSchedule: TaintUnreachable, Message: MessagePartitioned}
	dead := Decision{State: Dead, MarkUnknown: true, NoSchedule: TaintUnreachable, NoExecute: TaintDead, MarkPodsNotReady: true, Immediate: true, Message: MessageDead}
	siteDark := Decision{State: SiteDark, MarkUnknown: true, NoSchedule: TaintUnreachable, EvictByPolicy: true, Message: MessageSiteDark}
	ready := cond(corev1.ConditionTrue, "")
	tests := []struct {
		name string
		ev   Evidence
		want Decision
	}{
		{"healthy", Evidence{LeaseAge: 5 * time.Second, Ready: cond(corev1.ConditionTrue, "KubeletReady")},
			Decision{State: Healthy}},
		{"at the grace period still healthy", Evidence{LeaseAge: grace, Ready: cond(corev1.ConditionTrue, "")},
			Decision{State: Healthy}},
		{"silent past the grace period", Evidence{LeaseAge: grace + time.Millisecond, Ready: cond(corev1.ConditionTrue, "")},
			unreachable},
		{"silent and never reported", Evidence{LeaseAge: time.Hour},
			unreachable},
		{"silent but peers see it alive", Evidence{LeaseAge: time.Hour, Ready: cond(corev1.ConditionTrue, ""), Peers: PeersSeeAlive},
			partitioned},
		{"peers' word does not matter while heartbeats arrive", Evidence{LeaseAge: time.Second, Ready: cond(corev1.ConditionFalse, ""), Peers: PeersSeeAlive},
			Decision{State: NotReady, NoSchedule: TaintNotReady, NoExecute: TaintNotReady, MarkPodsNotReady: true}},
		{"reports not ready", Evidence{LeaseAge: time.Second, Ready: cond(corev1.ConditionFalse, "KubeletNotReady")},
			Decision{State: NotReady, NoSchedule: TaintNotReady, NoExecute: TaintNotReady, MarkPodsNotReady: true}},
		{"heartbeats back, status not yet reposted", Evidence{LeaseAge: time.Second, Ready: cond(corev1.ConditionUnknown, ReasonStatusUnknown)},
			Decision{State: Recovering, NoSchedule: TaintUnreachable}},
		{"node itself reports unknown", Evidence{LeaseAge: time.Second, Ready: cond(corev1.ConditionUnknown, "Whatever")},
			Decision{State: Unreachable, NoSchedule: TaintUnreachable, NoExecute: TaintUnreachable, MarkPodsNotReady: true}},
		{"new node, nothing reported yet", Evidence{LeaseAge: time.Second},
			Decision{State: Pending}},
		{"peers see it dead and the hub has not heard it for the dead grace", Evidence{LeaseAge: deadGrace + time.Millisecond, Ready: ready, Peers: PeersSeeDead},
			dead},
		{"dead does not wait for the grace period", Evidence{LeaseAge: 15 * time.Second, Ready: ready, Peers: PeersSeeDead, SiteSilent: true},
			dead},
		{"peers see it dead but the hub heard it lately", Evidence{LeaseAge: deadGrace, Ready: ready, Peers: PeersSeeDead},
			Decision{State: Healthy}},
		{"peers see it dead, long silent", Evidence{LeaseAge: time.Hour, Ready: ready, Peers: PeersSeeDead},
			dead},
		{"whole site silent, no word from peers", Evidence{LeaseAge: time.Hour, Ready: ready, SiteSilent: true},
			siteDark},
		{"whole site silent, within the grace period", Evidence{LeaseAge: grace, Ready: ready, SiteSilent: true},
			Decision{State: Healthy}},
		{"whole site silent but peers see it alive", Evidence{LeaseAge: time.Hour, Ready: ready, Peers: PeersSeeAlive, SiteSilent: true},
			partitioned},
		{"silent, site connected, no word on this node", Evidence{LeaseAge: time.Hour, Ready: ready, SiteSilent: false},
			unreachable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.ev.GracePeriod = grace
			if tt.ev.DeadGrace == 0 {
				tt.ev.DeadGrace = deadGrace
			}
			if got := Decide(tt.ev); got != tt.want {
				t.Errorf("Decide = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestZoneState(t *testing.T) {
	H, U, P, D, S := Healthy, Unreachable, Partitioned, Dead, SiteDark
	tests := []struct {
		name   string
		states []State
		want   ZoneHealth
	}{
		{"empty", nil, ZoneNormal},
		{"all healthy", []State{H, H, H}, ZoneNormal},
		{"all down", []State{U, U}, ZoneFullDisruption},
		{"all partitioned", []State{P, P, P}, ZoneFullDisruption},
		{"two of three down is not more than two", []State{U, U, H}, ZoneNormal},
		{"three of five down", []State{U, U, U, H, H}, ZonePartialDisruption},
		{"three of six is under 0.55", []State{U, U, U, H, H, H}, ZoneNormal},
		{"single node down", []State{U}, ZoneFullDisruption},
		{"dark site", []State{S, S, S}, ZoneFullDisruption},
		{"dead nodes count as down", []State{D, D, D, H, H}, ZonePartialDisruption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ZoneState(tt.states, 0.55); got != tt.want {
				t.Errorf("ZoneState = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestZoneRate(t *testing.T) {
	l := RateLimits{Rate: 0.1, SecondaryRate: 0.01, LargeClusterThreshold: 50}
	up := l
	up.EvictFullyDisruptedZones = true
	tests := []struct {
		name    string
		h       ZoneHealth
		size    int
		allDown bool
		l       RateLimits
		want    float64
	}{
		{"normal", ZoneNormal, 10, false, l, 0.1},
		{"partial, small zone stops", ZonePartialDisruption, 50, false, l, 0},
		{"partial, large zone slows", ZonePartialDisruption, 51, false, l, 0.01},
		{"full, frozen by default", ZoneFullDisruption, 5, false, l, 0},
		{"full, upstream behaviour evicts", ZoneFullDisruption, 5, false, up, 0.1},
		{"every zone down", ZoneNormal, 5, true, up, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ZoneRate(tt.h, tt.size, tt.allDown, tt.l); got != tt.want {
				t.Errorf("ZoneRate = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestEvictionFor(t *testing.T) {
	added := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	since := func(corev1.Taint) time.Time { return added }
	secs := func(s int64) *int64 { return &s }
	unreach := corev1.Taint{Key: TaintUnreachable, Effect: corev1.TaintEffectNoExecute}
	noSched := corev1.Taint{Key: TaintUnreachable, Effect: corev1.TaintEffectNoSchedule}
	custom := corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoExecute}
	def := corev1.Toleration{Key: TaintUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: secs(300)}
	tests := []struct {
		name   string
		taints []corev1.Taint
		tols   []corev1.Toleration
		want   Eviction
	}{
		{"no taints", nil, nil, Eviction{}},
		{"NoSchedule only", []corev1.Taint{noSched}, nil, Eviction{}},
		{"untolerated", []corev1.Taint{unreach}, nil, Eviction{Now: true}},
		{"default 300s toleration", []corev1.Taint{unreach}, []corev1.Toleration{def}, Eviction{At: added.Add(300 * time.Second)}},
		{"forever", []corev1.Taint{unreach}, []corev1.Toleration{{Key: TaintUnreachable, Operator: corev1.TolerationOpExists}}, Eviction{}},
		{"match-all toleration", []corev1.Taint{unreach, custom}, []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, Eviction{}},
		{"shortest of two", []corev1.Taint{unreach}, []corev1.Toleration{def, {Key: TaintUnreachable, Operator: corev1.TolerationOpExists, TolerationSeconds: secs(30)}}, Eviction{At: added.Add(30 * time.Second)}},
		{"negative counts as zero", []corev1.Taint{unreach}, []corev1.Toleration{{Key: TaintUnreachable, Operator: corev1.TolerationOpExists, TolerationSeconds: secs(-5)}}, Eviction{At: added}},
		{"one taint untolerated", []corev1.Taint{unreach, custom}, []corev1.Toleration{def}, Eviction{Now: true}},
		{"equal value must match", []corev1.Taint{custom}, []corev1.Toleration{{Key: "dedicated", Value: "cpu", Effect: corev1.TaintEffectNoExecute}}, Eviction{Now: true}},
		{"equal value matches", []corev1.Taint{custom}, []corev1.Toleration{{Key: "dedicated", Value: "gpu"}}, Eviction{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := EvictionFor(tt.taints, tt.tols, since); got != tt.want {
				t.Errorf("EvictionFor = %+v, want %+v", got, tt.want)
			}
		})
	}
}
