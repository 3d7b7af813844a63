// Package autoscaling runs HorizontalPodAutoscalers: every sync period it
// reads an autoscaler's target through the target's /scale subresource,
// measures the target's pods through a [MetricsSource] (in the hub, the
// metrics.k8s.io API), works out the replica count the metrics ask for and
// writes it back to /scale, then records what it saw and did in the
// autoscaler's autoscaling/v2 status.
//
// The algorithm is kube-controller-manager's: a metric proposes
// ceil(currentReplicas × current/target) unless the ratio is within the
// tolerance (0.1) of 1; pods that are not yet ready, or whose CPU sample
// may still include start-up, are left out, and pods without a sample
// count as using nothing on a scale up and their full request on a scale
// down; several metrics take the largest proposal. The proposal is then
// stabilized against the recommendations of the last window (five minutes
// for scaling down by default), limited by the autoscaler's scaling
// policies and clamped to minReplicas and maxReplicas, and the conditions
// AbleToScale, ScalingActive and ScalingLimited and the events
// (SuccessfulRescale, FailedGetResourceMetric, ...) say why, in upstream's
// words.
//
// One rule is tether's own: while any of the target's pods runs on a node
// the hub cannot reach (Ready not True, or tainted
// node.kubernetes.io/unreachable), the metrics of those pods are missing
// for a reason that says nothing about load, so the controller holds the
// current scale and sets ScalingActive=False with reason NodesUnreachable
// until the nodes are back.
package autoscaling
