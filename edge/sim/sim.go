// Package sim is a runtime for tether's edge agent that runs pods without
// containers. Simulated containers start after a delay, get an address from
// the node's pod range, write synthetic log lines, and exit, crash, hang or
// stay unready when the pod's annotations say so (see the constants). The
// runtime restarts them according to the pod's restartPolicy with the
// kubelet's crash-loop back-off, as edge/restarts decides: init
// containers in order, sidecars beside the regular containers. Hollow nodes use it to load a hub with
// thousands of nodes from one process; tests use it to drive every pod
// state the status logic must handle. Ephemeral containers added to a pod
// start once, run until the pod is killed and are never restarted.
//
// It keeps everything in memory: a restarted agent starts its pods again.
package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/restarts"
)

// Name is the runtime's name in the node's containerRuntimeVersion.
const Name = "sim"

// Config configures a Runtime. The zero value is usable.
type Config struct {
	// StartDelay is how long a container takes from its creation to
	// running, unless its pod's StartDelay annotation says otherwise.
	// Zero means at once.
	StartDelay time.Duration
	// BackoffBase is the crash-loop back-off's first wait; zero means
	// 10s, as the kubelet.
	BackoffBase time.Duration
	// BackoffMax caps the crash-loop back-off; zero means 5m.
	BackoffMax time.Duration
	// LogInterval is the time between synthetic log lines of a running
	// container; zero means 10s, negative means no periodic lines.
	LogInterval time.Duration
	// Capacity is what the node reports; missing entries default to cpu
	// 4, memory 8Gi, ephemeral-storage 64Gi and pods 110.
	Capacity corev1.ResourceList
	// Version is reported as sim://<Version>; empty means "0.1.0".
	Version string
	// UsageJitter makes the annotated usage move as a real container's
	// does: between two readings of Stats each running container's CPU
	// rate is its annotated rate times a random factor within
	// 1±UsageJitter, and its working set within 1±UsageJitter/15. Zero
	// keeps the usage steady. The random sequence is the same for every
	// runtime.
	UsageJitter float64
}

// Runtime is the simulated runtime. It implements edge.Runtime.
type Runtime struct {
	cfg Config

	mu     sync.Mutex
	pods   map[types.UID]*pod
	ips    ipam
	notify func(types.UID)
	// nodeCPU is the node's synthetic CPU counter at nodeCPUAt (usage.go).
	nodeCPU   time.Duration
	nodeCPUAt time.Time
	// jitter draws the usage's random factors (Config.UsageJitter).
	jitter *mrand.Rand
}

var _ edge.Runtime = (*Runtime)(nil)

// New returns a runtime with no pods.
func New(cfg Config) *Runtime {
	if cfg.Version == "" {
		cfg.Version = "0.1.0"
	}
	return &Runtime{cfg: cfg, pods: map[types.UID]*pod{}, ips: ipam{used: map[string]types.UID{}}, jitter: mrand.New(mrand.NewPCG(1, 2))}
}

func (r *Runtime) logInterval() time.Duration {
	switch {
	case r.cfg.LogInterval < 0:
		return 0
	case r.cfg.LogInterval == 0:
		return 10 * time.Second
	}
	return r.cfg.LogInterval
}

// Info implements edge.Runtime.
func (r *Runtime) Info(context.Context) (edge.RuntimeInfo, error) {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("4"),
		corev1.ResourceMemory:           resource.MustParse("8Gi"),
		corev1.ResourceEphemeralStorage: resource.MustParse("64Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
	}
	for k, v := range r.cfg.Capacity {
		capacity[k] = v.DeepCopy()
	}
	return edge.RuntimeInfo{Name: Name, Version: r.cfg.Version, Capacity: capacity}, nil
}

// Notify implements edge.Runtime.
func (r *Runtime) Notify(fn func(uid types.UID)) {
	r.mu.Lock()
	r.notify = fn
	r.mu.Unlock()
}

// changed tells the agent about uid; called without r.mu held.
func (r *Runtime) changed(uid types.UID) {
	r.mu.Lock()
	fn := r.notify
	r.mu.Unlock()
	if fn != nil {
		fn(uid)
	}
}

// pod is a simulated pod.
type pod struct {
	uid           types.UID
	namespace     string
	name          string
	restartPolicy corev1.RestartPolicy
	sandboxReady  bool
	sandboxErr    string
	ips           []string
	init          []*container
	app           []*container
	eph           []*container  // ephemeral containers, in the order they were added
	grace         time.Duration // the pod's termination grace period
	killing       bool
}

// container is a simulated container.
type container struct {
	name    string
	image   string
	role    restarts.Role
	b       behaviour
	pending bool // a start is scheduled or hangs
	// backingOff is set while it waits out its crash-loop back-off
	// (pending, with timer running).
	backingOff bool
	// stopping is set once the stop signal was sent to the current
	// instance.
	stopping bool
	state    edge.ContainerState
	reason   string
	message  string
	ready    bool
	starts   int32 // instances created so far
	cur      *instance
	prev     *instance
	last     *edge.ContainerTermination
	backoff  restarts.Backoff
	timer    *time.Timer
	usage    usage // from the usage annotations (usage.go)
}

// instance is one run of a container; logs are computed from it.
type instance struct {
	id       string
	restart  int32
	start    time.Time
	end      time.Time // zero while running
	exitCode int32
	reason   string
	done     chan struct{} // closed when it exits
	interval time.Duration
	name     string
	image    string
	// cpu is the instance's CPU counter at cpuSince (usage.go).
	cpu      time.Duration
	cpuSince time.Time
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// SyncPod implements edge.Runtime.
func (r *Runtime) SyncPod(_ context.Context, spec *corev1.Pod, net edge.Network) error {
	r.mu.Lock()
	p, ok := r.pods[spec.UID]
	if !ok {
		var err error
		p, err = r.newPod(spec)
		if err != nil {
			r.mu.Unlock()
			return err
		}
		r.pods[spec.UID] = p
	}
	if p.killing {
		r.mu.Unlock()
		return nil
	}
	if !p.sandboxReady {
		if err := r.createSandbox(p, spec, net); err != nil {
			p.sandboxErr = err.Error()
			r.mu.Unlock()
			return fmt.Errorf("create sandbox of pod %s/%s: %w", spec.Namespace, spec.Name, err)
		}
	}
	r.advance(p)
	r.syncEphemeral(p, spec)
	r.setUsage(p, spec)
	r.mu.Unlock()
	return nil
}

func (r *Runtime) newPod(spec *corev1.Pod) (*pod, error) {
	p := &pod{uid: spec.UID, namespace: spec.Namespace, name: spec.Name, restartPolicy: restarts.Policy(&spec.Spec),
		grace: corev1.DefaultTerminationGracePeriodSeconds * time.Second}
	if g := spec.Spec.TerminationGracePeriodSeconds; g != nil {
		p.grace = time.Duration(*g) * time.Second
	}
	for _, c := range spec.Spec.InitContainers {
		role := restarts.InitRole(&c)
		b, err := r.behaviourOf(spec, c.Name, role)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", spec.Namespace, spec.Name, err)
		}
		p.init = append(p.init, r.newContainer(c, b, role))
	}
	for _, c := range spec.Spec.Containers {
		b, err := r.behaviourOf(spec, c.Name, restarts.Regular)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", spec.Namespace, spec.Name, err)
		}
		p.app = append(p.app, r.newContainer(c, b, restarts.Regular))
	}
	return p, nil
}

func (r *Runtime) newContainer(c corev1.Container, b behaviour, role restarts.Role) *container {
	return &container{
		name: c.Name, image: c.Image, role: role, b: b,
		state:   edge.ContainerWaiting,
		backoff: restarts.Backoff{Base: r.cfg.BackoffBase, Max: r.cfg.BackoffMax},
	}
}

func (r *Runtime) createSandbox(p *pod, spec *corev1.Pod, net edge.Network) error {
	if spec.Spec.HostNetwork {
		if len(net.HostIPs) == 0 {
			return fmt.Errorf("host-network pod but the node has no address")
		}
		for _, ip := range net.HostIPs {
			p.ips = append(p.ips, ip.String())
		}
	} else {
		ips, err := r.ips.allocate(net.PodCIDRs, p.uid)
		if err != nil {
			return err
		}
		p.ips = ips
	}
	p.sandboxReady, p.sandboxErr = true, ""
	return nil
}

// advance carries out what edge/restarts decides for the pod's init and
// regular containers: first starts, restarts, back-offs and sidecar
// stops. A container whose start is already scheduled, or whose back-off
// timer runs, is left to it. r.mu is held.
func (r *Runtime) advance(p *pod) {
	if p.killing || !p.sandboxReady {
		return
	}
	cs := append(append([]*container{}, p.init...), p.app...)
	in := make([]restarts.Container, len(cs))
	for i, c := range cs {
		in[i] = restarts.Container{
			Name: c.name, Role: c.role, Backoff: &c.backoff,
			Created: c.starts > 0, Running: c.state == edge.ContainerRunning,
			// No startup probes here: a sidecar started once it ran.
			Started: c.starts > 0,
		}
		if c.cur != nil && c.state != edge.ContainerRunning {
			in[i].ExitCode, in[i].FinishedAt = c.cur.exitCode, c.cur.end
		}
		if c.pending && !c.backingOff {
			// Its start is under way.
			in[i].Created, in[i].Running, in[i].Backoff = true, true, nil
		}
	}
	plan := restarts.Decide(p.restartPolicy, in, time.Now())
	for i, step := range plan.Steps {
		c := cs[i]
		if c.backingOff {
			if step.Action == restarts.BackOff {
				continue // its timer runs
			}
			// Due now, or not to be restarted any more (a sidecar
			// of a pod that is done): the back-off ends here.
			c.timer.Stop()
			c.pending, c.backingOff, c.timer = false, false, nil
			c.state, c.reason, c.message = edge.ContainerExited, c.cur.reason, ""
		}
		if c.pending {
			continue
		}
		switch step.Action {
		case restarts.Start:
			r.scheduleStart(p, c, c.b.startDelay)
		case restarts.Restart:
			c.last = c.termination()
			r.scheduleStart(p, c, c.b.startDelay)
		case restarts.BackOff:
			r.backOff(p, c, step)
		case restarts.Stop:
			if !c.stopping {
				r.stop(p, c, p.grace)
			}
		}
	}
}

// termination describes the current instance of c, which exited.
func (c *container) termination() *edge.ContainerTermination {
	inst := c.cur
	return &edge.ContainerTermination{
		ID: Name + "://" + inst.id, ExitCode: inst.exitCode, Reason: inst.reason,
		StartedAt: inst.start, FinishedAt: inst.end,
	}
}

// backOff leaves c waiting in CrashLoopBackOff until step.Until, then looks
// at the pod again. r.mu is held.
func (r *Runtime) backOff(p *pod, c *container, step restarts.Step) {
	inst := c.cur
	c.last = c.termination()
	c.pending, c.backingOff = true, true
	c.state, c.ready = edge.ContainerWaiting, false
	c.reason = restarts.ReasonCrashLoopBackOff
	c.message = restarts.BackOffMessage(step.Wait, c.name, p.name, p.namespace, string(p.uid))
	c.timer = time.AfterFunc(time.Until(step.Until), func() {
		r.mu.Lock()
		if p.killing || c.cur != inst {
			r.mu.Unlock()
			return
		}
		c.pending, c.backingOff, c.timer = false, false, nil
		c.state, c.reason, c.message = edge.ContainerExited, inst.reason, ""
		r.advance(p)
		r.mu.Unlock()
		r.changed(p.uid)
	})
}

// scheduleStart creates the next instance of c after delay. r.mu is held.
func (r *Runtime) scheduleStart(p *pod, c *container, delay time.Duration) {
	c.pending = true
	c.state, c.reason, c.message, c.ready = edge.ContainerWaiting, "ContainerCreating", "", false
	if c.b.hang {
		return
	}
	c.timer = time.AfterFunc(delay, func() { r.start(p, c) })
}

func (r *Runtime) start(p *pod, c *container) {
	r.mu.Lock()
	if p.killing || r.pods[p.uid] != p {
		r.mu.Unlock()
		return
	}
	now := time.Now()
	if c.cur != nil {
		c.prev = c.cur
	}
	c.cur = &instance{
		id: newID(), restart: c.starts, start: now, done: make(chan struct{}),
		interval: c.b.logInterval, name: c.name, image: c.image, cpuSince: now,
	}
	c.starts++
	c.pending, c.stopping = false, false
	c.state, c.reason, c.message = edge.ContainerRunning, "", ""
	c.ready = c.role != restarts.Init && !c.b.notReady
	c.timer = nil
	if c.b.exits {
		code := c.b.exitCode
		inst := c.cur
		c.timer = time.AfterFunc(c.b.exitAfter, func() { r.exitOnOwn(p, c, inst, code) })
	}
	// A sidecar that started lets the next init container start.
	r.advance(p)
	r.mu.Unlock()
	r.changed(p.uid)
}

func (r *Runtime) exitOnOwn(p *pod, c *container, inst *instance, code int32) {
	r.mu.Lock()
	if c.cur != inst || !inst.end.IsZero() || p.killing {
		r.mu.Unlock()
		return
	}
	r.exit(c, code, restarts.ExitReason(code, false))
	r.advance(p)
	r.mu.Unlock()
	r.changed(p.uid)
}

// exit ends the current instance of c. r.mu is held.
func (r *Runtime) exit(c *container, code int32, reason string) {
	inst := c.cur
	inst.end, inst.exitCode, inst.reason = time.Now(), code, reason
	close(inst.done)
	c.state, c.reason, c.message, c.ready = edge.ContainerExited, reason, "", false
	c.timer = nil
}

// KillPod implements edge.Runtime.
func (r *Runtime) KillPod(ctx context.Context, uid types.UID, grace time.Duration) error {
	r.mu.Lock()
	p, ok := r.pods[uid]
	if !ok {
		r.mu.Unlock()
		return nil
	}
	p.killing = true
	var wait []chan struct{}
	for _, c := range p.all() {
		if c.timer != nil {
			c.timer.Stop()
			c.timer = nil
		}
		c.pending, c.backingOff = false, false
		if c.state != edge.ContainerRunning {
			continue
		}
		wait = append(wait, c.cur.done)
		r.stop(p, c, grace)
	}
	r.mu.Unlock()
	for _, done := range wait {
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("kill pod %s: %w", uid, ctx.Err())
		}
	}
	return nil
}

// stop sends c the stop signal: it exits with 0 after its stop delay, or is
// killed with 137 at the end of grace. r.mu is held.
func (r *Runtime) stop(p *pod, c *container, grace time.Duration) {
	inst := c.cur
	c.stopping = true
	code, reason, after := int32(0), restarts.ReasonCompleted, c.b.stopDelay
	if after > grace {
		code, reason, after = 137, restarts.ReasonError, grace
	}
	c.timer = time.AfterFunc(after, func() {
		r.mu.Lock()
		if c.cur != inst || !inst.end.IsZero() {
			r.mu.Unlock()
			return
		}
		r.exit(c, code, reason)
		r.advance(p)
		r.mu.Unlock()
		r.changed(p.uid)
	})
}

// RemovePod implements edge.Runtime.
func (r *Runtime) RemovePod(_ context.Context, uid types.UID) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.pods[uid]
	if !ok {
		return nil
	}
	p.killing = true
	for _, c := range p.all() {
		if c.timer != nil {
			c.timer.Stop()
		}
		if c.cur != nil && c.cur.end.IsZero() {
			r.exit(c, 137, "Error")
		}
	}
	r.ips.release(uid)
	delete(r.pods, uid)
	return nil
}

// PodStatus implements edge.Runtime.
func (r *Runtime) PodStatus(_ context.Context, uid types.UID) (*edge.PodStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.pods[uid]
	if !ok {
		return nil, fmt.Errorf("pod %s: %w", uid, edge.ErrPodNotFound)
	}
	st := &edge.PodStatus{UID: uid, SandboxReady: p.sandboxReady, SandboxError: p.sandboxErr}
	for _, ip := range p.ips {
		st.IPs = append(st.IPs, mustAddr(ip))
	}
	for _, c := range p.init {
		if cs, ok := c.status(); ok {
			st.InitContainers = append(st.InitContainers, cs)
		}
	}
	for _, c := range p.app {
		if cs, ok := c.status(); ok {
			st.Containers = append(st.Containers, cs)
		}
	}
	for _, c := range p.eph {
		if cs, ok := c.status(); ok {
			cs.Ready = false
			st.EphemeralContainers = append(st.EphemeralContainers, cs)
		}
	}
	return st, nil
}

// status reports c, or false when it was never scheduled.
func (c *container) status() (edge.ContainerStatus, bool) {
	if c.starts == 0 && !c.pending {
		return edge.ContainerStatus{}, false
	}
	cs := edge.ContainerStatus{
		Name: c.name, Image: c.image, ImageID: imageID(c.image),
		State: c.state, Reason: c.reason, Message: c.message, Ready: c.ready,
	}
	if c.starts > 0 {
		cs.RestartCount = c.starts - 1
	}
	if c.cur != nil {
		cs.ID = Name + "://" + c.cur.id
		cs.StartedAt = c.cur.start
		if c.state == edge.ContainerExited {
			cs.ExitCode, cs.FinishedAt = c.cur.exitCode, c.cur.end
		}
	}
	if c.last != nil {
		l := *c.last
		cs.Last = &l
	}
	return cs, true
}

// imageID makes a stable digest-like id for an image reference.
func imageID(image string) string {
	return "sim-image://" + image
}
