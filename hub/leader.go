package hub

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/tether-edge/tether/hub/rbac/bootstrap"
)

// The Leases in kube-system the hub's scheduler and controllers are elected
// by, named as upstream's, so tools that look for them find them.
const (
	SchedulerLease         = "kube-scheduler"
	ControllerManagerLease = "kube-controller-manager"
)

// electionTiming is how an election runs. A leader renews every retry
// period and gives up when it could not renew for the renew deadline; a
// standby takes over a lease it has not seen renewed for the lease
// duration. client-go waits between two attempts the retry period plus up
// to 1.2 times it (jitter), so after a leader died without releasing its
// lease a standby sees the last renewal up to 2.2 retry periods late and
// takes over at most 2.2 retry periods after the lease expired: within
// lease duration plus 4.4 retry periods of the death. A leader cut off
// from the API stops its components after the renew deadline, before
// anyone else may start them.
type electionTiming struct {
	lease, renew, retry time.Duration
	// alone is true where no other hub can share the store: a Lease held
	// by another identity there is a past run's, taken over at once.
	alone bool
}

// timingFor returns the election timing for a store.
//
// On PostgreSQL (datastore set) other hubs stand by: another hub leads
// within 8 + 4.4 × 1 = 12.4 s, inside the 15 s a hub's loss may cost, for
// two Lease writes a second by the leader and reads by the standbys.
// Upstream's defaults (15 s, 10 s, 2 s) would take up to 23.8 s.
//
// On SQLite no other hub can share the store: nobody waits for a
// takeover, a hub restarted after a crash holds its own Leases again at
// once (its identity is kept, see hubIdentity), and one stopped cleanly
// gives them up; a hub whose identity changed (its data directory
// restored on another host) takes over the past run's Leases at once
// (takeStale). Renewals there only keep the Leases current for the tools
// that read them, so they come every 30 s: four store writes a minute for
// both Leases, where a 2 s retry period would make sixty, each an fsync
// on the hub's disk.
func timingFor(datastore string) electionTiming {
	if datastore != "" {
		return electionTiming{lease: 8 * time.Second, renew: 6 * time.Second, retry: time.Second}
	}
	return electionTiming{lease: 90 * time.Second, renew: 60 * time.Second, retry: 30 * time.Second, alone: true}
}

// takeStale clears the holder of lease when another identity holds it,
// so that the election takes it at once instead of waiting it out. Only
// for a store no other hub can share, where any other holder is a past
// run of this one. A failure is logged; the election then waits.
func (e *election) takeStale(ctx context.Context) {
	leases := e.client.CoordinationV1().Leases(metav1.NamespaceSystem)
	l, err := leases.Get(ctx, e.lease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || *l.Spec.HolderIdentity == e.id {
		return
	}
	past := *l.Spec.HolderIdentity
	l.Spec.HolderIdentity = nil
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		e.log.Error("take over a past run's lease", "lease", e.lease, "holder", past, "err", err)
		return
	}
	e.log.Info("took over a past run's lease", "lease", e.lease, "holder", past, "identity", e.id)
}

// leaderStatus is whether this hub leads each elected component, for the
// leader_election_master_status gauge upstream's components export.
type leaderStatus struct {
	scheduler, controllers atomic.Bool
}

// hubIdentity is the holder identity this hub campaigns under:
// hostname_id. On SQLite, which no other hub can share, the id is kept in
// the data directory, so that a hub restarted after a crash holds its own
// unexpired Leases again at once instead of waiting them out. On
// PostgreSQL every start draws a new id, as upstream's components do, so
// that two hubs never share one even when a data directory was copied.
func hubIdentity(cfg Config) (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("hub identity: %w", err)
	}
	if cfg.Datastore != "" {
		return host + "_" + string(uuid.NewUUID()), nil
	}
	id, err := loadOrCreateHubID(filepath.Join(cfg.DataDir, "hub-id"))
	if err != nil {
		return "", fmt.Errorf("hub identity: %w", err)
	}
	return host + "_" + id, nil
}

// election runs one component while this hub holds its Lease: it
// campaigns, starts the component when elected, stops it fully when the
// Lease is lost and campaigns again. Upstream's components exit instead;
// the hub serves the API and the edges as well, so it stops just the
// component and waits until it has stopped before campaigning again.
type election struct {
	lease   string
	timing  electionTiming
	client  kubernetes.Interface
	id      string
	leading *atomic.Bool
	// start starts the component; the returned function stops it and
	// waits until it has stopped.
	start func(ctx context.Context) (func(), error)
	log   interface {
		Info(string, ...any)
		Error(string, ...any)
	}

	mu      sync.Mutex
	closing bool
	stopRun func() // the running component's stop, nil when none runs
}

// stopComponent stops the component if it runs.
func (e *election) stopComponent() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopRun != nil {
		e.stopRun()
		e.stopRun = nil
		e.leading.Store(false)
		e.log.Info("stopped leading", "lease", e.lease)
	}
}

// lead is OnStartedLeading: it starts the component unless the term or
// the hub already ended.
func (e *election) lead(ctx context.Context) {
	e.mu.Lock()
	if e.closing || ctx.Err() != nil {
		e.mu.Unlock()
		return
	}
	stop, err := e.start(ctx)
	if err != nil {
		e.mu.Unlock()
		e.log.Error("start elected component", "lease", e.lease, "err", err)
		return
	}
	e.stopRun = stop
	e.leading.Store(true)
	e.mu.Unlock()
	e.log.Info("leading", "lease", e.lease, "identity", e.id)
	<-ctx.Done()
	e.stopComponent()
}

// run campaigns until ctx ends. The returned function stops the component
// first, then gives the Lease up so that another hub leads at once, and
// waits.
func (e *election) run(ctx context.Context) (func(), error) {
	if e.timing.alone {
		e.takeStale(ctx)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: e.lease},
		Client:     e.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.id},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            e.lease,
		LeaseDuration:   e.timing.lease,
		RenewDeadline:   e.timing.renew,
		RetryPeriod:     e.timing.retry,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: e.lead,
			OnStoppedLeading: e.stopComponent,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("leader election %s: %w", e.lease, err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for runCtx.Err() == nil {
			le.Run(runCtx)
			// The term's context is done once Run returns, so lead
			// starts nothing after this stop.
			e.stopComponent()
			if runCtx.Err() == nil {
				e.log.Info("lost the lease; campaigning again", "lease", e.lease)
			}
		}
	}()
	return sync.OnceFunc(func() {
		e.mu.Lock()
		e.closing = true
		e.mu.Unlock()
		e.stopComponent()
		cancel()
		<-done
	}), nil
}

// startElected campaigns for the controller manager's Lease and, unless
// the hub's scheduler is off, the scheduler's, each under the component's
// own identity as upstream's components do, over the hub's own API.
// With one hub it leads at once: the first attempt to take a Lease is
// immediate, and a Lease is given up when its hub stops cleanly.
func (r *run) startElected(ctx context.Context) error {
	id, err := hubIdentity(r.cfg)
	if err != nil {
		return err
	}
	elect := func(lease, user string, leading *atomic.Bool, start func(context.Context) (func(), error)) (func(), error) {
		timing := timingFor(r.cfg.Datastore)
		rc := localConfig(r.api, r.url, user, "system:authenticated")
		rc.Timeout = timing.renew / 2
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("leader election %s: %w", lease, err)
		}
		e := &election{lease: lease, timing: timing, client: client, id: id, leading: leading, start: start,
			log: r.cfg.Logger.With("component", "leaderelection")}
		return e.run(ctx)
	}
	stop, err := elect(ControllerManagerLease, bootstrap.ControllerManagerUser, &r.leaders.controllers, r.startControllerManager)
	if err != nil {
		return err
	}
	r.stopCtrl = stop
	r.onClose(func() error { r.stopCtrl(); return nil })
	r.stopSched = func() {}
	if !r.cfg.DisableScheduler {
		stop, err := elect(SchedulerLease, bootstrap.SchedulerUser, &r.leaders.scheduler, func(ctx context.Context) (func(), error) {
			return r.h.startScheduler(ctx, r.api, r.url)
		})
		if err != nil {
			return err
		}
		r.stopSched = stop
	}
	r.onClose(func() error { r.stopSched(); return nil })
	return nil
}
