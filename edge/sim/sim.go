// Package sim is a runtime for tether's edge agent that runs pods without
// containers. Simulated containers start after a delay, get an address from
// the node's pod range, write synthetic log lines, and exit, crash, hang or
// stay unready when the pod's annotations say so (see the constants). The
// runtime restarts them according to the pod's restartPolicy with the
// kubelet's crash-loop back-off. Hollow nodes use it to load a hub with
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
	eph           []*container // ephemeral containers, in the order they were added
	nextInit      int          // index of the init container that must complete next
	initFailed    bool         // an init container failed and will not be restarted
	killing       bool
}

// container is a simulated container.
type container struct {
	name    string
	image   string
	isInit  bool
	b       behaviour
	pending bool // a start is scheduled or hangs
	state   edge.ContainerState
	reason  string
	message string
	ready   bool
	starts  int32 // instances created so far
	cur     *instance
	prev    *instance
	last    *edge.ContainerTermination
	backoff edge.RestartBackoff
	timer   *time.Timer
	usage   usage // from the usage annotations (usage.go)
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
	p := &pod{uid: spec.UID, namespace: spec.Namespace, name: spec.Name, restartPolicy: spec.Spec.RestartPolicy}
	if p.restartPolicy == "" {
		p.restartPolicy = corev1.RestartPolicyAlways
	}
	for _, c := range spec.Spec.InitContainers {
		b, err := r.behaviourOf(spec, c.Name, true)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", spec.Namespace, spec.Name, err)
		}
		p.init = append(p.init, r.newContainer(c, b, true))
	}
	for _, c := range spec.Spec.Containers {
		b, err := r.behaviourOf(spec, c.Name, false)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", spec.Namespace, spec.Name, err)
		}
		p.app = append(p.app, r.newContainer(c, b, false))
	}
	return p, nil
}

func (r *Runtime) newContainer(c corev1.Container, b behaviour, isInit bool) *container {
	return &container{
		name: c.Name, image: c.Image, isInit: isInit, b: b,
		state:   edge.ContainerWaiting,
		backoff: edge.RestartBackoff{Base: r.cfg.BackoffBase, Max: r.cfg.BackoffMax},
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

// advance schedules the starts the pod is ready for. r.mu is held.
func (r *Runtime) advance(p *pod) {
	if p.killing || !p.sandboxReady || p.initFailed {
		return
	}
	for p.nextInit < len(p.init) {
		c := p.init[p.nextInit]
		if c.state == edge.ContainerExited && c.cur.exitCode == 0 {
			p.nextInit++
			continue
		}
		if c.starts == 0 && !c.pending {
			r.scheduleStart(p, c, c.b.startDelay)
		}
		return
	}
	for _, c := range p.app {
		if c.starts == 0 && !c.pending {
			r.scheduleStart(p, c, c.b.startDelay)
		}
	}
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
	c.pending = false
	c.state, c.reason, c.message = edge.ContainerRunning, "", ""
	c.ready = !c.isInit && !c.b.notReady
	c.timer = nil
	if c.b.exits {
		code := c.b.exitCode
		inst := c.cur
		c.timer = time.AfterFunc(c.b.exitAfter, func() { r.exitOnOwn(p, c, inst, code) })
	}
	r.mu.Unlock()
	r.changed(p.uid)
}

func (r *Runtime) exitOnOwn(p *pod, c *container, inst *instance, code int32) {
	r.mu.Lock()
	if c.cur != inst || !inst.end.IsZero() || p.killing {
		r.mu.Unlock()
		return
	}
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	r.exit(c, code, reason)
	r.afterExit(p, c)
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

// afterExit applies the restart policy to c, which just exited. r.mu is
// held.
func (r *Runtime) afterExit(p *pod, c *container) {
	code := c.cur.exitCode
	if c.isInit {
		switch {
		case code == 0:
			p.nextInit++
			r.advance(p)
			return
		case p.restartPolicy == corev1.RestartPolicyNever:
			p.initFailed = true
			return
		}
		r.restart(p, c)
		return
	}
	switch p.restartPolicy {
	case corev1.RestartPolicyAlways:
		r.restart(p, c)
	case corev1.RestartPolicyOnFailure:
		if code != 0 {
			r.restart(p, c)
		}
	}
}

// restart brings c back after its back-off. r.mu is held.
func (r *Runtime) restart(p *pod, c *container) {
	inst := c.cur
	c.last = &edge.ContainerTermination{
		ID: Name + "://" + inst.id, ExitCode: inst.exitCode, Reason: inst.reason,
		StartedAt: inst.start, FinishedAt: inst.end,
	}
	wait := c.backoff.Wait(inst.end)
	if wait <= 0 {
		c.backoff.Restarted(time.Now())
		r.scheduleStart(p, c, c.b.startDelay)
		return
	}
	c.pending = true
	c.state, c.ready = edge.ContainerWaiting, false
	c.reason = "CrashLoopBackOff"
	c.message = fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", wait, c.name, p.name, p.namespace, p.uid)
	c.timer = time.AfterFunc(time.Until(inst.end.Add(wait)), func() {
		r.mu.Lock()
		if p.killing || c.cur != inst {
			r.mu.Unlock()
			return
		}
		c.backoff.Restarted(time.Now())
		r.scheduleStart(p, c, c.b.startDelay)
		r.mu.Unlock()
		r.changed(p.uid)
	})
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
		c.pending = false
		if c.state != edge.ContainerRunning {
			continue
		}
		inst := c.cur
		wait = append(wait, inst.done)
		code, reason, after := int32(0), "Completed", c.b.stopDelay
		if after > grace {
			code, reason, after = 137, "Error", grace
		}
		c.timer = time.AfterFunc(after, func() {
			r.mu.Lock()
			if c.cur == inst && inst.end.IsZero() {
				r.exit(c, code, reason)
			}
			r.mu.Unlock()
			r.changed(uid)
		})
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
	if c.state == edge.ContainerWaiting {
		// A restart is pending: the container has no current instance.
		cs.ID, cs.StartedAt = "", time.Time{}
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
