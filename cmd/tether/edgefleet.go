package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/upgrade"
	"github.com/tether-edge/tether/internal/fleetapi"
)

// fleetTrialTimeout is how long an agent a rollout asked for has to
// become healthy, as `tether edge upgrade --timeout` defaults to.
const fleetTrialTimeout = 5 * time.Minute

// fleetTarget is what the hub last set on the node about the release its
// agent is to run.
type fleetTarget struct {
	release string
	asked   time.Time
	limit   int64 // bytes per second; 0: none
}

func targetOf(n *corev1.Node) fleetTarget {
	t := fleetTarget{release: n.Annotations[fleetapi.AnnotationRelease]}
	t.asked, _ = time.Parse(time.RFC3339, n.Annotations[fleetapi.AnnotationAskedAt])
	t.limit, _ = strconv.ParseInt(n.Annotations[fleetapi.AnnotationBandwidthLimit], 10, 64)
	return t
}

// fleetFollower upgrades the agent to the release the hub names in the
// node's annotations (a rollout's doing, see controllers/edgeupgrade):
// it checks the release's signature against the CA the node pinned at
// join, downloads it through the tunnel (a delta from the running
// executable when the hub has one; resumed after a cut; within the
// bandwidth cap), stages it and takes it up as a `tether edge upgrade`
// request. It learns the annotations from the Node the hub returns to
// the agent's status writes, and reports in the node's AgentUpgrade
// condition.
type fleetFollower struct {
	u    *agentUpgrades
	a    *edge.Agent
	dir  string // partial and finished downloads
	stop func()

	seen chan fleetTarget // the latest target (1 slot)

	mu      sync.Mutex
	working fleetTarget // the target being worked on; zero: none
	cancel  context.CancelFunc
}

func newFleetFollower(u *agentUpgrades, dataDir string) *fleetFollower {
	return &fleetFollower{u: u, dir: filepath.Join(dataDir, "upgrade", "download"), seen: make(chan fleetTarget, 1)}
}

// observe is the agent's NodeObserver: it keeps the latest target and
// never blocks.
func (f *fleetFollower) observe(n *corev1.Node) {
	t := targetOf(n)
	for {
		select {
		case f.seen <- t:
			return
		default:
		}
		select {
		case <-f.seen:
		default:
		}
	}
}

// run follows targets until ctx ends.
func (f *fleetFollower) run(ctx context.Context, a *edge.Agent, stop func()) {
	f.a, f.stop = a, stop
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-f.seen:
			f.follow(ctx, t)
		}
	}
}

// follow starts, keeps or stops the work towards t.
func (f *fleetFollower) follow(ctx context.Context, t fleetTarget) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t == f.working && f.cancel != nil {
		return
	}
	if f.cancel != nil {
		f.cancel()
		f.cancel = nil
	}
	f.working = t
	if t.release == "" || f.u.self == "" {
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	go f.work(wctx, t)
}

// work brings the agent to t's release, unless it runs it, tried it since
// t was asked, or is trying an executable.
func (f *fleetFollower) work(ctx context.Context, t fleetTarget) {
	log := f.u.log.With("release", t.release)
	rel, err := f.release(ctx, t.release)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("upgrade: read the release", "err", err)
			f.refuse(t.release, fleetapi.ReleaseSpec{}, fmt.Sprintf("read the release: %v", err))
		}
		return
	}
	if rel.Version == f.u.version {
		f.u.publish(f.a)
		return
	}
	if tr, err := f.u.recs.Trial(); err != nil || tr != nil {
		return // the trial's end reports
	}
	if o, err := f.u.recs.Outcome(); err == nil && o != nil && o.Release == t.release && o.Result != upgrade.Installed && !o.At.Before(t.asked) {
		return // tried since asked: the condition says how it ended
	}
	if err := fleetapi.Verify(rel, f.a.ClusterRoots(), time.Now()); err != nil {
		f.refuse(t.release, rel, err.Error())
		return
	}
	if rel.Arch != goruntime.GOARCH {
		f.refuse(t.release, rel, fmt.Sprintf("the release is for %s, this node is %s", rel.Arch, goruntime.GOARCH))
		return
	}
	self := currentExecutable(f.u.self)
	selfDigest, err := upgrade.FileDigest(self)
	if err != nil {
		log.Warn("upgrade: digest of this executable (no delta)", "err", err)
		selfDigest = ""
	}
	p := &progress{f: f, release: t.release, every: 15 * time.Second}
	d := &upgrade.Download{Client: f.a.HubClient(), Base: "http://hub", Release: rel, Dir: f.dir,
		From: self, FromDigest: selfDigest, Limit: t.limit, Progress: p.report, Log: log}
	p.set(0, rel.Size, false)
	start := time.Now()
	got, err := d.Run(ctx)
	if err != nil {
		if ctx.Err() == nil {
			f.refuse(t.release, rel, fmt.Sprintf("download: %v", err))
		}
		return
	}
	log.Info("upgrade downloaded", "delta", got.Delta, "size", got.Size, "transferred", got.Transferred,
		"resumedAt", got.ResumedAt, "took", time.Since(start).Round(time.Millisecond))
	st, err := upgrade.Stage(ctx, got.Path, self, rel.Digest)
	if err != nil {
		if ctx.Err() == nil {
			f.refuse(t.release, rel, err.Error())
		}
		return
	}
	upgrade.Clean(f.dir, "")
	st.Release = t.release
	if st.Version != rel.Version {
		f.refuse(t.release, rel, fmt.Sprintf("the executable says it is %s, the release %s", st.Version, rel.Version))
		return
	}
	if ctx.Err() != nil {
		return
	}
	if err := f.u.recs.Ask(upgrade.Request{Staged: st, Timeout: fleetTrialTimeout, At: time.Now()}); err != nil {
		f.refuse(t.release, rel, err.Error())
		return
	}
	f.u.take(f.a, f.stop)
}

// release reads the Release named name from the hub.
func (f *fleetFollower) release(ctx context.Context, name string) (fleetapi.ReleaseSpec, error) {
	url := fmt.Sprintf("http://hub/apis/%s/%s/releases/%s", fleetapi.Group, fleetapi.Version, name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fleetapi.ReleaseSpec{}, err
	}
	req.Header.Set("Accept", "application/json")
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		resp, err := f.a.HubClient().Do(req)
		if err == nil {
			body, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			switch {
			case rerr != nil:
				err = rerr
			case resp.StatusCode == http.StatusOK:
				var r fleetapi.Release
				if err := json.Unmarshal(body, &r); err != nil {
					return fleetapi.ReleaseSpec{}, err
				}
				return r.Spec, nil
			case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
				err = fmt.Errorf("the hub answered %s", resp.Status)
			default:
				return fleetapi.ReleaseSpec{}, fmt.Errorf("the hub answered %s: %s", resp.Status, body)
			}
		}
		f.u.log.Info("upgrade: read the release again later", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return fleetapi.ReleaseSpec{}, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// refuse records and reports a release the agent will not try.
func (f *fleetFollower) refuse(release string, rel fleetapi.ReleaseSpec, reason string) {
	if err := f.u.recs.Refuse(release, rel.Version, rel.Digest, f.u.version, reason, time.Now()); err != nil {
		f.u.log.Warn("upgrades: record a refusal", "err", err)
	}
	f.u.report(f.a)
}

// progress reports a download in the node's condition at each tenth of
// it, and at least every so often: a few status writes per download.
type progress struct {
	f        *fleetFollower
	release  string
	every    time.Duration
	last     time.Time
	lastDone int64
}

func (p *progress) report(done, size int64, delta bool) {
	if time.Since(p.last) < p.every && done != size && (size <= 0 || done-p.lastDone < size/10) {
		return
	}
	p.set(done, size, delta)
}

func (p *progress) set(done, size int64, delta bool) {
	p.last, p.lastDone = time.Now(), done
	what := "executable"
	if delta {
		what = "delta"
	}
	msg := fmt.Sprintf("downloading the %s: %.1f of %.1f MB", what, float64(done)/1e6, float64(size)/1e6)
	if size <= 0 {
		msg = fmt.Sprintf("downloading the %s: %.1f MB", what, float64(done)/1e6)
	}
	p.f.a.SetNodeCondition(corev1.NodeCondition{Type: fleetapi.ConditionAgentUpgrade, Status: corev1.ConditionFalse,
		Reason: fleetapi.ReasonDownloading, Message: fleetapi.UpgradeMessage(p.release, msg)})
}

// publish sets the node's AgentUpgrade condition from the records: the
// trial this agent is, or the last outcome of a rollout's release.
func (u *agentUpgrades) publish(a *edge.Agent) {
	if t := u.trial; t != nil && t.Release != "" {
		if o, err := u.recs.Outcome(); err == nil && o != nil && o.Digest == t.Digest && !o.At.Before(t.Started) {
			// The trial ended: fall through to its outcome.
		} else {
			a.SetNodeCondition(corev1.NodeCondition{Type: fleetapi.ConditionAgentUpgrade, Status: corev1.ConditionFalse,
				Reason: fleetapi.ReasonTrying, Message: fleetapi.UpgradeMessage(t.Release, "trying "+t.Version+" (was "+t.Previous+")")})
			return
		}
	}
	o, err := u.recs.Outcome()
	if err != nil || o == nil || o.Release == "" {
		return
	}
	c := corev1.NodeCondition{Type: fleetapi.ConditionAgentUpgrade, Status: corev1.ConditionFalse}
	switch o.Result {
	case upgrade.Installed:
		c.Status, c.Reason = corev1.ConditionTrue, fleetapi.ReasonUpgraded
		c.Message = fleetapi.UpgradeMessage(o.Release, "installed "+o.Version)
	case upgrade.RolledBack:
		c.Reason, c.Message = fleetapi.ReasonRolledBack, fleetapi.UpgradeMessage(o.Release, o.Reason)
	default:
		c.Reason, c.Message = fleetapi.ReasonRefused, fleetapi.UpgradeMessage(o.Release, o.Reason)
	}
	a.SetNodeCondition(c)
}
