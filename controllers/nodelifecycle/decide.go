package nodelifecycle

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Condition reasons and messages the controller writes, as upstream's.
const (
	ReasonStatusUnknown       = "NodeStatusUnknown"
	MessageStatusUnknown      = "Kubelet stopped posting node status."
	ReasonStatusNeverUpdated  = "NodeStatusNeverUpdated"
	MessageStatusNeverUpdated = "Kubelet never posted node status."
	TaintUnreachable          = corev1.TaintNodeUnreachable // node.kubernetes.io/unreachable
	TaintNotReady             = corev1.TaintNodeNotReady    // node.kubernetes.io/not-ready
	// TaintDead is the NoExecute taint of a node its site peers agree is
	// gone: few pods tolerate it, so its pods are replaced at once.
	TaintDead = "node.tether.io/dead"
	// ConditionLost is the pod condition of a pod whose node has been
	// silent for its disconnect policy's lost-after and whose original is
	// kept for reconciliation (keepOriginal, longestRunning).
	ConditionLost = kit.PodConditionLost
	// Ready condition messages of the states tether tells apart.
	MessagePartitioned         = "Node is cut off from the hub; its site peers see it alive."
	MessageDead                = "Site peers agree the node is gone."
	MessageSiteDark            = "No node of the node's site is heard by the hub; the site's link is taken as down."
	reasonDeletionByTaintMgr   = "DeletionByTaintManager"
	messageDeletionByTaintMgr  = "Taint manager: deleting due to NoExecute taint"
	eventReasonTaintEviction   = "TaintManagerEviction"
	eventReasonNodeNotReady    = "NodeNotReady"
	eventReasonRemovingTaints  = "RemovingNodeLifecycleTaints"
	eventReasonNodeUnreachable = "NodeUnreachable"
	eventReasonNodeDead        = "NodeDead"
	eventReasonSiteDark        = "SiteDark"
)

// State is what the controller concludes about a node.
type State int

const (
	// Healthy: heartbeats arrive and the node reports Ready=True.
	Healthy State = iota + 1
	// Pending: heartbeats arrive but the node has never reported its
	// Ready condition; it is left alone.
	Pending
	// NotReady: heartbeats arrive and the node reports Ready=False.
	NotReady
	// Unreachable: no heartbeat within the grace period, and nothing says
	// the node is alive.
	Unreachable
	// Partitioned: no heartbeat within the grace period, but the node's
	// site peers see it alive: its link to the hub is down, not the node.
	Partitioned
	// Recovering: heartbeats arrive again, but the node has not yet
	// reported its status since the controller marked it Unknown.
	Recovering
	// Dead: the node's site peers agree it is gone and the hub has not
	// heard it for DeadGrace: its pods are replaced at once.
	Dead
	// SiteDark: no node of the node's site is heard by the hub and there
	// is no word from its peers: most likely the site's uplink is down.
	// Its pods stay, except those whose tolerations say to replace them.
	SiteDark
)

func (s State) String() string {
	switch s {
	case Healthy:
		return "Healthy"
	case Pending:
		return "Pending"
	case NotReady:
		return "NotReady"
	case Unreachable:
		return "Unreachable"
	case Partitioned:
		return "Partitioned"
	case Recovering:
		return "Recovering"
	case Dead:
		return "Dead"
	case SiteDark:
		return "SiteDark"
	}
	return "Invalid"
}

// Evidence is what the controller knows about a node at one moment.
type Evidence struct {
	// LeaseAge is how long ago the controller last saw a heartbeat: the
	// node's Lease renewed or its Ready condition's heartbeat advance.
	// It is measured on the controller's clock, so clock skew between the
	// hub and the node does not matter.
	LeaseAge time.Duration
	// GracePeriod is how long heartbeats may be missing before the node
	// is taken as unreachable.
	GracePeriod time.Duration
	// Ready is the node's Ready condition as stored; nil when the node
	// never reported it.
	Ready *corev1.NodeCondition
	// Peers is what the node's site peers say of it through site gossip.
	Peers PeerView
	// DeadGrace is how long heartbeats must be missing before the peers'
	// word that the node is gone is believed. It is shorter than
	// GracePeriod: the peers' agreement is the stronger evidence, and the
	// hub's silence only guards against a stale or mistaken digest.
	DeadGrace time.Duration
	// SiteSilent says no node of the node's site (its zone) has sent a
	// heartbeat within the grace period.
	SiteSilent bool
}

// PeerView is what a node's site peers say of it.
type PeerView int

const (
	// PeersUnknown: no word from the node's site (no gossip, or no member
	// of the site is heard by the hub).
	PeersUnknown PeerView = iota
	// PeersSeeAlive: the site's gossip sees the node alive.
	PeersSeeAlive
	// PeersSeeDead: the site's gossip agrees the node is gone.
	PeersSeeDead
)

func (v PeerView) String() string {
	switch v {
	case PeersUnknown:
		return "Unknown"
	case PeersSeeAlive:
		return "Alive"
	case PeersSeeDead:
		return "Dead"
	}
	return "Invalid"
}

// Decision is what the controller should make true of a node.
type Decision struct {
	State State
	// MarkUnknown says the node's conditions must read Unknown: the hub
	// no longer knows them.
	MarkUnknown bool
	// NoSchedule is the lifecycle taint key that keeps new pods off the
	// node ("" for none).
	NoSchedule string
	// NoExecute is the lifecycle taint key whose NoExecute taint evicts
	// the node's pods after their tolerations ("" for none). Adding it is
	// subject to the eviction rate limits.
	NoExecute string
	// MarkPodsNotReady says the node's pods must read Ready=False, so
	// they leave Service endpoints.
	MarkPodsNotReady bool
	// Immediate says the NoExecute taint is added at once: neither the
	// zone's rate limit nor a frozen zone holds it back.
	Immediate bool
	// EvictByPolicy says that, without a NoExecute taint, the pods whose
	// toleration of the unreachable NoExecute taint has tolerationSeconds
	// still leave after it, counted from the unreachable NoSchedule
	// taint: their disconnect policy asks to be replaced.
	EvictByPolicy bool
	// Message is the message of the node's conditions when MarkUnknown
	// is set: which state and why.
	Message string
}

// Decide turns evidence about a node into a decision. It is a pure
// function, so that new sources of evidence (site gossip) change its input
// and not the controller.
func Decide(ev Evidence) Decision {
	stale := ev.LeaseAge > ev.GracePeriod
	switch {
	case ev.Peers == PeersSeeDead && ev.LeaseAge > ev.DeadGrace:
		// The peers saw it go and the hub hears nothing either: replace
		// its pods now, whatever their tolerations of unreachable say.
		return Decision{State: Dead, MarkUnknown: true, NoSchedule: TaintUnreachable, NoExecute: TaintDead,
			MarkPodsNotReady: true, Immediate: true, Message: MessageDead}
	case stale && ev.Peers == PeersSeeAlive:
		// Cut off from the hub but alive: no new pods, but the running
		// ones stay, and stay in their Services, which the site's nodes
		// serve from their local state.
		return Decision{State: Partitioned, MarkUnknown: true, NoSchedule: TaintUnreachable, Message: MessagePartitioned}
	case stale && ev.Peers == PeersUnknown && ev.SiteSilent:
		// The whole site is dark: its uplink, most likely. Its pods stay
		// and stay ready (the site serves itself), except those whose
		// disconnect policy asks for a replacement after lost-after.
		return Decision{State: SiteDark, MarkUnknown: true, NoSchedule: TaintUnreachable, EvictByPolicy: true, Message: MessageSiteDark}
	case stale:
		return Decision{State: Unreachable, MarkUnknown: true, NoSchedule: TaintUnreachable, NoExecute: TaintUnreachable,
			MarkPodsNotReady: true, Message: MessageStatusUnknown}
	case ev.Ready == nil:
		return Decision{State: Pending}
	}
	switch ev.Ready.Status {
	case corev1.ConditionTrue:
		return Decision{State: Healthy}
	case corev1.ConditionFalse:
		return Decision{State: NotReady, NoSchedule: TaintNotReady, NoExecute: TaintNotReady, MarkPodsNotReady: true}
	}
	if ev.Ready.Reason == ReasonStatusUnknown || ev.Ready.Reason == ReasonStatusNeverUpdated {
		// The controller's own Unknown, with heartbeats back: the node
		// is reachable, so nothing is evicted, but no pod is placed until
		// it reports its status.
		return Decision{State: Recovering, NoSchedule: TaintUnreachable}
	}
	// The node itself says Unknown.
	return Decision{State: Unreachable, NoSchedule: TaintUnreachable, NoExecute: TaintUnreachable, MarkPodsNotReady: true}
}

// ZoneHealth is the state of a zone (a site) as a whole.
type ZoneHealth int

const (
	// ZoneNormal: few enough nodes are unhealthy.
	ZoneNormal ZoneHealth = iota + 1
	// ZonePartialDisruption: at least UnhealthyZoneThreshold of the
	// zone's nodes, and more than two, are unhealthy.
	ZonePartialDisruption
	// ZoneFullDisruption: every node of the zone is unhealthy.
	ZoneFullDisruption
)

func (z ZoneHealth) String() string {
	switch z {
	case ZoneNormal:
		return "Normal"
	case ZonePartialDisruption:
		return "PartialDisruption"
	case ZoneFullDisruption:
		return "FullDisruption"
	}
	return "Invalid"
}

// healthyForZone says whether a node counts as healthy in its zone.
func healthyForZone(s State) bool { return s == Healthy || s == Pending || s == Recovering }

// ZoneState computes a zone's health from its nodes' states.
func ZoneState(states []State, unhealthyThreshold float64) ZoneHealth {
	unhealthy := 0
	for _, s := range states {
		if !healthyForZone(s) {
			unhealthy++
		}
	}
	switch {
	case len(states) > 0 && unhealthy == len(states):
		return ZoneFullDisruption
	case unhealthy > 2 && float64(unhealthy)/float64(len(states)) >= unhealthyThreshold:
		return ZonePartialDisruption
	}
	return ZoneNormal
}

// RateLimits are the eviction rate settings.
type RateLimits struct {
	Rate, SecondaryRate   float64 // nodes per second
	LargeClusterThreshold int
	// EvictFullyDisruptedZones evicts from a zone where every node is
	// down, at Rate, as upstream does when other zones are healthy.
	EvictFullyDisruptedZones bool
}

// ZoneRate returns how many nodes per second of a zone may get the
// NoExecute taint. allDown says every zone is fully disrupted, which
// points at the hub's own connectivity: nothing is evicted then.
func ZoneRate(h ZoneHealth, zoneSize int, allDown bool, l RateLimits) float64 {
	if allDown {
		return 0
	}
	switch h {
	case ZonePartialDisruption:
		if zoneSize <= l.LargeClusterThreshold {
			return 0
		}
		return l.SecondaryRate
	case ZoneFullDisruption:
		// A whole site gone dark is most often its uplink: freeze it
		// unless told to behave as upstream.
		if !l.EvictFullyDisruptedZones {
			return 0
		}
	}
	return l.Rate
}
