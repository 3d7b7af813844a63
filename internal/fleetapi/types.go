package fleetapi

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The API group and version of the kinds.
const (
	Group   = "fleet.tether.io"
	Version = "v1alpha1"
)

// Resources and kinds.
var (
	ReleasesResource     = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "releases"}
	EdgeUpgradesResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "edgeupgrades"}
	ReleaseKind          = schema.GroupVersionKind{Group: Group, Version: Version, Kind: "Release"}
	EdgeUpgradeKind      = schema.GroupVersionKind{Group: Group, Version: Version, Kind: "EdgeUpgrade"}
)

// Labels of a Release, set by the hub when it imports one, so that the
// releases of a version are found by a label selector. An agent labels
// its Node with LabelBuild too, with the build it runs, so that the
// rollout controller asks it for a release of the same build.
const (
	LabelVersion = Group + "/version"
	LabelArch    = Group + "/arch"
	LabelBuild   = Group + "/build"
)

// The builds of tether an agent can run.
const (
	// BuildEdge is the edge agent alone (built with -tags edge,
	// installed as tether-edge).
	BuildEdge = "edge"
	// BuildFull is the hub and the agent in one executable.
	BuildFull = "full"
)

// Release is one executable of tether held by the hub. Only the hub
// writes Releases (`tether release import`); users read them.
type Release struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ReleaseSpec `json:"spec"`
}

// ReleaseSpec describes a release's executable and carries the hub's
// signature over it.
type ReleaseSpec struct {
	// Version is what the executable's `tether version` prints.
	Version string `json:"version"`
	// Arch is the executable's GOARCH.
	Arch string `json:"arch"`
	// Build is BuildEdge or BuildFull.
	Build string `json:"build"`
	// Digest is "sha256:" and the executable's SHA-256 in hex.
	Digest string `json:"digest"`
	// Size is the executable's size in bytes.
	Size int64 `json:"size"`
	// Signature is the signer's ECDSA signature (ASN.1, base64) over
	// Statement(spec).
	Signature string `json:"signature"`
	// Signer is the PEM of the certificate of the key that signed.
	Signer string `json:"signer"`
}

// ReleaseList is a list of Releases.
type ReleaseList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Release `json:"items"`
}

// ReleaseName is the name the hub gives the Release of version, build and
// arch: the version lower-cased with every character a name may not hold
// turned into '-', then build and arch ("v1.4.0-edge-arm64").
func ReleaseName(version, build, arch string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(version) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	return strings.Trim(b.String(), "-.") + "-" + build + "-" + arch
}

// EdgeUpgrade is a rollout of a version to the agents of the nodes it
// selects, in batches.
type EdgeUpgrade struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              EdgeUpgradeSpec   `json:"spec"`
	Status            EdgeUpgradeStatus `json:"status,omitempty"`
}

// EdgeUpgradeSpec is what a rollout should do.
type EdgeUpgradeSpec struct {
	// Version is the version the agents are to run; the hub must hold a
	// Release of it for each node's architecture.
	Version string `json:"version"`
	// NodeSelector picks the nodes; empty or absent selects every node.
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// BatchSize is how many nodes upgrade at once: a number or a
	// percentage of the selected nodes (rounded up); default 1.
	BatchSize *intstr.IntOrString `json:"batchSize,omitempty"`
	// MaxUnavailable bounds the selected nodes not Ready, those upgrading
	// included, before another node starts: a number or a percentage
	// (rounded down, at least 1); default: the batch size.
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	// FailureThreshold is how many nodes may fail before the rollout
	// pauses itself; default 0: the first failure pauses it.
	FailureThreshold int32 `json:"failureThreshold,omitempty"`
	// NodeTimeout is how long one node has, from being asked to running
	// the new version healthily, before it counts as failed; default 15m.
	NodeTimeout *metav1.Duration `json:"nodeTimeout,omitempty"`
	// Window restricts when nodes start upgrading; absent: at any time.
	Window *MaintenanceWindow `json:"window,omitempty"`
	// Paused stops nodes from starting; those already upgrading finish.
	Paused bool `json:"paused,omitempty"`
	// BandwidthLimit caps each agent's download, in bytes per second;
	// absent: no cap.
	BandwidthLimit *resource.Quantity `json:"bandwidthLimit,omitempty"`
}

// MaintenanceWindow is a daily span of time in which nodes may start
// upgrading.
type MaintenanceWindow struct {
	// Start is the time of day it opens, "HH:MM".
	Start string `json:"start"`
	// Duration is how long it stays open.
	Duration metav1.Duration `json:"duration"`
	// TimeZone is an IANA zone name; default UTC.
	TimeZone string `json:"timeZone,omitempty"`
	// Days are the days it opens on ("Mon" ... "Sun"); empty: every day.
	Days []string `json:"days,omitempty"`
}

// EdgeUpgradeStatus is what a rollout did so far.
type EdgeUpgradeStatus struct {
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase is one of the Phase constants.
	Phase string `json:"phase,omitempty"`
	// Nodes counts the selected nodes; Upgraded those running the
	// version; Upgrading those asked and not done; Failed those that
	// failed.
	Nodes     int32 `json:"nodes"`
	Upgraded  int32 `json:"upgraded"`
	Upgrading int32 `json:"upgrading"`
	Failed    int32 `json:"failed"`
	// Failures say which nodes failed and why, the latest last.
	Failures []NodeFailure `json:"failures,omitempty"`
	// Conditions are Progressing, Paused and Complete.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeFailure is one node's failed upgrade.
type NodeFailure struct {
	Node    string      `json:"node"`
	Release string      `json:"release,omitempty"`
	Reason  string      `json:"reason"`
	Message string      `json:"message,omitempty"`
	Time    metav1.Time `json:"time"`
}

// Phases of an EdgeUpgrade.
const (
	PhaseProgressing = "Progressing"
	// PhaseWaiting: nodes are left, but the window is closed.
	PhaseWaiting = "Waiting"
	// PhasePaused: by spec.paused or because failures passed the
	// threshold.
	PhasePaused   = "Paused"
	PhaseComplete = "Complete"
)

// EdgeUpgradeList is a list of EdgeUpgrades.
type EdgeUpgradeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EdgeUpgrade `json:"items"`
}

// AnnotationRelease on a Node names the Release its agent is to run. The
// rollout controller sets it; an agent reads it from the Node the hub
// returns to its status writes, and when it differs from what it runs,
// upgrades to it. A user may set it by hand too.
const AnnotationRelease = Group + "/release"

// AnnotationEdgeUpgrade on a Node names the EdgeUpgrade that set
// AnnotationRelease.
const AnnotationEdgeUpgrade = Group + "/edge-upgrade"

// AnnotationAskedAt on a Node is when (RFC 3339) AnnotationRelease was
// last set. An agent whose attempt at a release failed tries it again
// only when asked again after that attempt.
const AnnotationAskedAt = Group + "/asked-at"

// AnnotationBandwidthLimit on a Node caps its agent's download of the
// release of AnnotationRelease, in bytes per second (a decimal integer);
// the rollout controller copies it from spec.bandwidthLimit.
const AnnotationBandwidthLimit = Group + "/bandwidth-limit"

// ConditionAgentUpgrade is the Node condition in which an agent reports
// its upgrade to the Release of AnnotationRelease. Its message starts
// with the Release's name and a colon (see UpgradeMessage).
const ConditionAgentUpgrade corev1.NodeConditionType = "AgentUpgrade"

// Reasons of ConditionAgentUpgrade. Upgraded comes with status True,
// the others with False.
const (
	ReasonDownloading = "Downloading"
	ReasonTrying      = "Trying"
	ReasonUpgraded    = "Upgraded"
	ReasonRolledBack  = "RolledBack"
	// ReasonRefused: the agent did not try the release (its signature or
	// digest did not check, it does not run here, ...).
	ReasonRefused = "Refused"
)

// Reasons of a NodeFailure the rollout controller finds itself, besides
// ReasonRolledBack and ReasonRefused reported by agents.
const (
	// ReasonTimedOut: the node did not run the release within the
	// rollout's nodeTimeout.
	ReasonTimedOut = "TimedOut"
	// ReasonNoRelease: the hub holds no release of the version for the
	// node's architecture and build.
	ReasonNoRelease = "NoRelease"
)

// Failed reports whether reason ends an attempt without the release.
func Failed(reason string) bool { return reason == ReasonRolledBack || reason == ReasonRefused }

// UpgradeMessage is the message of ConditionAgentUpgrade about release.
func UpgradeMessage(release, detail string) string {
	if detail == "" {
		return release
	}
	return release + ": " + detail
}

// UpgradeRelease returns the Release a ConditionAgentUpgrade message is
// about.
func UpgradeRelease(message string) string {
	name, _, _ := strings.Cut(message, ":")
	return strings.TrimSpace(name)
}

// DownloadPath is where the hub serves the executable of digest
// ("sha256:HEX"); with the query from=DIGEST2 it serves the delta from
// the executable of DIGEST2 instead, or 404 when it has no such delta to
// give. Both answer Range requests, with an ETag, so a cut download
// resumes.
func DownloadPath(digest string) string {
	return "/fleet/releases/" + digest
}

// ImportPath is where `tether release import` posts an executable.
const ImportPath = "/fleet/releases"

// DeltaHeader names, on a delta answer, the digest of the delta's own
// bytes.
const DeltaHeader = "X-Tether-Delta-Digest"

// ParseDigest checks a "sha256:HEX" digest and returns the hex.
func ParseDigest(d string) (string, error) {
	hex, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return "", fmt.Errorf("digest %q: want sha256: and 64 lower-case hex digits", d)
	}
	return hex, nil
}
