package edge

import (
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// SetAfterPersist installs f, called after each event is written to the
// local state and before the agent acts on it; nil removes it. It must be
// set while no agent runs.
func SetAfterPersist(f func(kind string, ev watch.EventType, obj metav1.Object)) { afterPersist = f }

// StateFile is the local state's file name in the data directory.
const StateFile = stateFile

// StaticPod makes a manifest a static pod of node, as the agent does with
// the file.
func StaticPod(manifest []byte, file, node string) (*corev1.Pod, error) {
	return staticPod(manifest, file, node, time.Now())
}

// SiteReports returns how many views the agent's site gossip reported to
// the hub and the latest one.
func SiteReports(a *Agent) (int64, []byte) {
	if a.gossip == nil {
		return 0, nil
	}
	var last []byte
	if p := a.gossip.lastReport.Load(); p != nil {
		last = *p
	}
	return a.gossip.reports.Load(), last
}

// WriteMetrics writes the agent's metrics.
func WriteMetrics(a *Agent, w io.Writer) { a.writeMetrics(w) }

// FollowedSiteView returns the view the agent's Service filter follows.
func FollowedSiteView(a *Agent) SiteView { return a.siteView() }
