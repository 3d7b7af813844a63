package edge

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/edge/staticpods"
)

// SetAfterPersist makes the agents built from cfg call f after each event
// is written to the local state and before they act on it; nil removes it.
func SetAfterPersist(cfg *Config, f func(kind string, ev watch.EventType, obj metav1.Object)) {
	cfg.afterPersist = f
}

// StateFile is the local state's file name in the data directory.
const StateFile = stateFile

// StaticPod makes a manifest a static pod of node, as the agent does with
// the file.
func StaticPod(manifest []byte, file, node string) (*corev1.Pod, error) {
	return staticpods.Decode(manifest, file, node, time.Now(), staticRefs)
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
func WriteMetrics(a *Agent, w io.Writer) {
	rec := httptest.NewRecorder()
	a.metricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	w.Write(rec.Body.Bytes())
}

// FollowedSiteView returns the view the agent's Service filter follows.
func FollowedSiteView(a *Agent) SiteView { return a.siteView() }

// UsagePusher is the agent's usage pusher over a fake tunnel, for tests.
type UsagePusher struct{ p *usagePusher }

// NewUsagePusher returns a pusher reading sp and pushing on conn.
func NewUsagePusher(sp StatsProvider, conn interface {
	Conn() uint64
	Push(conn uint64, payload []byte) error
}) *UsagePusher {
	a := &Agent{log: slog.New(slog.DiscardHandler)}
	return &UsagePusher{p: &usagePusher{a: a, stats: sp, tunnel: conn}}
}

// Tick takes one reading and pushes its sample when there is one.
func (u *UsagePusher) Tick() { u.p.tick(context.Background()) }

// Pushes is how many samples were pushed.
func (u *UsagePusher) Pushes() int64 { return u.p.a.metrics.usagePushes.Load() }
