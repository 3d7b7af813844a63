package containerd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/restarts"
)

// Labels on tether's containerd containers: they are how a restarted
// agent finds its pods' containers and what they were.
const (
	labelPodUID       = "io.tether.pod.uid"
	labelPodNamespace = "io.tether.pod.namespace"
	labelPodName      = "io.tether.pod.name"
	labelContainer    = "io.tether.container.name"
	labelInit         = "io.tether.container.init"
	labelAttempt      = "io.tether.container.attempt"
	labelImage        = "io.tether.container.image"
	labelStarted      = "io.tether.started"
	labelFinished     = "io.tether.finished"
	labelExitCode     = "io.tether.exit.code"
	labelExitReason   = "io.tether.exit.reason"
	labelExitMessage  = "io.tether.exit.message"
)

// pod is the runtime's record of a pod.
type pod struct {
	uid       types.UID
	namespace string
	name      string
	dir       string

	mu           sync.Mutex
	spec         *corev1.Pod
	sandboxReady bool
	sandboxErr   string
	netnsPath    string // empty for host-network pods
	ips          []netip.Addr
	init, app    []*ctr
	killing      bool
	timer        *time.Timer // wakes the pod when a back-off ends
	wakeAt       time.Time   // when timer fires
	// claims are the host paths of the pod's claim volumes, by volume
	// name, once set up.
	claims map[string]string
	// runtime is the runtime of the pod's RuntimeClass (nil: the
	// default), once runtimeSet (handlers.go).
	runtime    *RuntimeHandler
	runtimeSet bool
}

// ctr is a container of a pod across its instances.
type ctr struct {
	name   string
	isInit bool
	// sidecar marks an init container with restartPolicy Always, from
	// the spec; sidecarStarted is set once an instance of it started in
	// the pod's current sandbox (edge/restarts).
	sidecar, sidecarStarted bool
	cur                     *instance
	prev                    *instance
	backoff                 restarts.Backoff
	// pullBackoff spaces out pulls of an image that failed to pull, on
	// the kubelet's schedule; pullRetryAt is when the next may start.
	pullBackoff restarts.Backoff
	pullRetryAt time.Time
	// waiting explains why no instance runs (image errors, back-off).
	waitReason, waitMessage string
	// stale is set on an init container whose last run was in a sandbox
	// that is gone (the node rebooted): it runs again before the app
	// containers start in the new sandbox, as the kubelet runs a pod's
	// init containers again whenever it makes the pod's sandbox anew.
	stale bool
	// ephemeral marks an ephemeral container, kept with the app
	// containers but started once and never restarted (ephemeral.go).
	ephemeral bool
}

// instance is one containerd container (one run of a pod's container).
type instance struct {
	id       string
	attempt  int32
	image    string
	imageID  string
	logPath  string
	started  time.Time
	finished time.Time
	running  bool
	exitCode int32
	reason   string
	message  string
	ready    bool
	// startupDone is true once the startup probe succeeded (or when there
	// is none).
	startupDone bool

	task   containerd.Task
	logs   *logWriter
	stdin  *stdinPipe
	exited chan struct{} // closed once the exit is recorded
	stop   context.CancelFunc
	// killReason, when set, is why the agent killed it (a failed
	// liveness probe).
	killReason string
	// hooking is true while its postStart hook runs: it is not reported
	// Running until the hook returned.
	hooking bool
	// killNoted is set when the Killing event was already reported.
	killNoted bool
	// stopping is set once the runtime began stopping it (a sidecar of
	// a pod whose regular containers are done).
	stopping bool
}

func (p *pod) key() string { return p.namespace + "/" + p.name }

func (p *pod) container(name string, isInit bool, base, max time.Duration) *ctr {
	list := &p.app
	if isInit {
		list = &p.init
	}
	for _, c := range *list {
		if c.name == name {
			return c
		}
	}
	c := &ctr{name: name, isInit: isInit, backoff: restarts.Backoff{Base: base, Max: max},
		pullBackoff: restarts.Backoff{Base: base, Max: max}}
	*list = append(*list, c)
	return c
}

// existing returns the record of container name, or nil when it was never
// started. p.mu is held.
func (p *pod) existing(name string, isInit bool) *ctr {
	list := p.app
	if isInit {
		list = p.init
	}
	for _, c := range list {
		if c.name == name {
			return c
		}
	}
	return nil
}

// started tells whether a container of the pod was created: its volumes
// were set up once.
func (p *pod) started() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range append(append([]*ctr{}, p.init...), p.app...) {
		if c.cur != nil {
			return true
		}
	}
	return false
}

func (p *pod) find(name string) *ctr {
	for _, c := range append(append([]*ctr{}, p.init...), p.app...) {
		if c.name == name {
			return c
		}
	}
	return nil
}

// stopWatchers ends the probe loops of the pod's instances.
func (p *pod) stopWatchers() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range append(append([]*ctr{}, p.init...), p.app...) {
		if c.cur != nil && c.cur.stop != nil {
			c.cur.stop()
		}
	}
	if p.timer != nil {
		p.timer.Stop()
	}
}

// containerID names an instance in containerd. It must stay under 76
// characters of [A-Za-z0-9._-].
func containerID(uid types.UID, name string, attempt int32) string {
	h := sha256.Sum256([]byte(uid))
	if len(name) > 48 {
		name = name[:48]
	}
	return fmt.Sprintf("%s-%s-%d", hex.EncodeToString(h[:6]), name, attempt)
}

// sandboxState is what the pod directory records of the sandbox.
type sandboxState struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Netns     string   `json:"netns,omitempty"`
	IPs       []string `json:"ips"`
}

func (r *Runtime) podDir(uid types.UID) string { return filepath.Join(r.podsDir, string(uid)) }

// SyncPod implements edge.Runtime.
func (r *Runtime) SyncPod(ctx context.Context, spec *corev1.Pod, net edge.Network) error {
	r.mu.Lock()
	p := r.pods[spec.UID]
	if p == nil {
		p = &pod{uid: spec.UID, namespace: spec.Namespace, name: spec.Name, dir: r.podDir(spec.UID)}
		r.pods[spec.UID] = p
	}
	r.mu.Unlock()

	p.mu.Lock()
	p.spec = spec
	killing, ready := p.killing, p.sandboxReady
	p.mu.Unlock()
	if killing {
		return nil
	}
	if err := r.resolveRuntime(p, spec); err != nil {
		if !ready {
			p.mu.Lock()
			p.sandboxErr = err.Error()
			p.mu.Unlock()
		}
		return fmt.Errorf("create sandbox of pod %s/%s: %w", spec.Namespace, spec.Name, edge.SandboxFailed(err))
	}
	if !ready {
		if err := r.createSandbox(ctx, p, spec, net); err != nil {
			p.mu.Lock()
			p.sandboxErr = err.Error()
			p.mu.Unlock()
			return fmt.Errorf("create sandbox of pod %s/%s: %w", spec.Namespace, spec.Name, err)
		}
		p.mu.Lock()
		for _, cs := range p.init {
			if cs.cur != nil && !cs.cur.running {
				cs.stale, cs.sidecarStarted = true, false
			}
		}
		p.mu.Unlock()
	}
	if err := r.syncVolumes(ctx, p, spec); err != nil && !p.started() {
		// Not started yet: it waits for its volumes, as the kubelet
		// waits for a pod's mounts. A pod that runs already keeps
		// running on the volumes it has (their events say what failed).
		return fmt.Errorf("set up volumes of pod %s/%s: %w", spec.Namespace, spec.Name, err)
	}
	return errors.Join(r.advance(ctx, p, spec), r.syncEphemeral(ctx, p, spec))
}

func (r *Runtime) createSandbox(ctx context.Context, p *pod, spec *corev1.Pod, net edge.Network) error {
	if err := os.MkdirAll(p.dir, 0o750); err != nil {
		return err
	}
	st := sandboxState{Namespace: spec.Namespace, Name: spec.Name}
	var ips []netip.Addr
	nsPath := ""
	if spec.Spec.HostNetwork {
		if len(net.HostIPs) == 0 {
			return errors.New("host-network pod but the node has no address")
		}
		ips = net.HostIPs
	} else {
		var err error
		nsPath, ips, err = r.net.setUp(ctx, spec, net)
		if err != nil {
			return err
		}
	}
	st.Netns = nsPath
	for _, ip := range ips {
		st.IPs = append(st.IPs, ip.String())
	}
	if err := r.writeEtcFiles(p, spec, ips); err != nil {
		return err
	}
	b, _ := json.Marshal(st)
	if err := writeFileAtomic(filepath.Join(p.dir, "sandbox.json"), b, 0o600); err != nil {
		return err
	}
	p.mu.Lock()
	p.netnsPath, p.ips, p.sandboxReady, p.sandboxErr = nsPath, ips, true, ""
	p.mu.Unlock()
	return nil
}

// start creates and starts instance attempt of container c.
func (r *Runtime) start(ctx context.Context, p *pod, cs *ctr, c *corev1.Container, spec *corev1.Pod, attempt int32) error {
	fail := func(reason string, err error) error {
		p.mu.Lock()
		cs.waitReason, cs.waitMessage = reason, err.Error()
		p.mu.Unlock()
		return fmt.Errorf("start container %s of pod %s: %w", c.Name, p.key(), err)
	}
	p.mu.Lock()
	if now := time.Now(); now.Before(cs.pullRetryAt) {
		// The last pull failed: wait out the back-off, as the kubelet
		// does, instead of asking the registry again at every sync.
		cs.waitReason, cs.waitMessage = "ImagePullBackOff", fmt.Sprintf("Back-off pulling image %q", c.Image)
		r.wakeAt(p, cs.pullRetryAt)
		p.mu.Unlock()
		r.event(p, cs, false, "BackOff", "Back-off pulling image %q", c.Image)
		r.event(p, cs, true, "Failed", "Error: ImagePullBackOff")
		return nil
	}
	p.mu.Unlock()
	img, err := r.ensureImage(ctx, p, cs, spec, c)
	if errors.Is(err, errImagePull) {
		now := time.Now()
		p.mu.Lock()
		cs.pullBackoff.Restarted(now)
		cs.pullRetryAt = now.Add(cs.pullBackoff.Wait(now))
		r.wakeAt(p, cs.pullRetryAt)
		p.mu.Unlock()
	}
	if err != nil {
		reason := imageReason(err)
		if reason == "ErrImageNeverPull" {
			r.event(p, cs, true, reason, "Container image %q is not present with pull policy of Never", c.Image)
		}
		r.event(p, cs, true, "Failed", "Error: %s", reason)
		return fail(reason, err)
	}
	p.mu.Lock()
	cs.pullRetryAt = time.Time{}
	p.mu.Unlock()
	id := containerID(p.uid, c.Name, attempt)
	// A leftover of an interrupted start has the same name.
	if old, err := r.client.LoadContainer(ctx, id); err == nil {
		r.deleteContainer(ctx, old)
	}
	p.mu.Lock()
	ips := p.ips
	nsPath := p.netnsPath
	p.mu.Unlock()
	specOpts, err := r.specOpts(ctx, p, spec, c, img, ips, nsPath, id)
	if err == nil {
		specOpts, err = r.ephemeralOpts(p, cs, spec, specOpts)
	}
	if err != nil {
		r.event(p, cs, true, "Failed", "Error: %v", err)
		return fail("CreateContainerConfigError", err)
	}
	labels := map[string]string{
		labelPodUID: string(p.uid), labelPodNamespace: p.namespace, labelPodName: p.name,
		labelContainer: c.Name, labelAttempt: strconv.Itoa(int(attempt)), labelImage: c.Image,
	}
	if cs.isInit {
		labels[labelInit] = "true"
	}
	if cs.ephemeral {
		labels[labelEphemeral] = "true"
	}
	cont, err := r.client.NewContainer(ctx, id, append([]containerd.NewContainerOpts{
		containerd.WithImage(img),
		containerd.WithSnapshotter(r.cfg.Snapshotter),
		containerd.WithNewSnapshot(id, img),
		containerd.WithContainerLabels(labels),
		containerd.WithNewSpec(specOpts...),
	}, p.runtimeOpts()...)...)
	if err != nil {
		r.event(p, cs, true, "Failed", "Error: %v", err)
		return fail("CreateContainerError", err)
	}
	r.event(p, cs, false, "Created", "Created container: %s", c.Name)
	inst := &instance{
		id: id, attempt: attempt, image: img.Name(), imageID: img.Target().Digest.String(),
		logPath: r.logPath(p, c.Name, attempt), exited: make(chan struct{}),
		startupDone: c.StartupProbe == nil,
	}
	inst.logs, err = newLogWriter(inst.logPath, r.cfg.LogMaxSize, r.cfg.LogMaxFiles)
	if err != nil {
		r.deleteContainer(ctx, cont)
		return fail("CreateContainerError", err)
	}
	task, err := r.newTask(ctx, cont, inst, c.Stdin, c.TTY)
	if err == nil {
		err = task.Start(ctx)
		if err != nil {
			_, _ = task.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
		}
	}
	p.mu.Lock()
	old := cs.prev
	cs.prev, cs.cur = cs.cur, inst
	cs.waitReason, cs.waitMessage = "", ""
	cs.stale = false
	p.mu.Unlock()
	if old != nil {
		r.dropInstance(ctx, old)
	}
	if err != nil {
		// The container could not run (no such executable, bad user):
		// it counts as an exit, so that the back-off applies.
		now := time.Now()
		inst.logs.Close()
		p.mu.Lock()
		inst.started, inst.finished, inst.exitCode = now, now, 128
		inst.reason, inst.message = "StartError", err.Error()
		p.mu.Unlock()
		close(inst.exited)
		r.recordExit(ctx, cont, inst)
		r.event(p, cs, true, "Failed", "Error: %v", err)
		go r.changed(p.uid)
		return fmt.Errorf("start container %s of pod %s: %w", c.Name, p.key(), err)
	}
	r.event(p, cs, false, "Started", "Started container %s", c.Name)
	r.mu.Lock()
	r.imageUsed[img.Name()] = time.Now()
	r.mu.Unlock()
	p.mu.Lock()
	inst.task, inst.running, inst.started = task, true, time.Now()
	// Not reported Running before its postStart hook returned.
	inst.hooking = c.Lifecycle != nil && c.Lifecycle.PostStart != nil
	p.mu.Unlock()
	_, _ = cont.SetLabels(context.WithoutCancel(ctx), map[string]string{labelStarted: inst.started.Format(time.RFC3339Nano)})
	r.watchExit(p, cs, inst, cont)
	if err := r.postStart(ctx, p, cs, inst, c, spec); err != nil {
		// Killed: its exit wakes the pod, and the restart policy and
		// back-off decide what comes next.
		r.log.Debug("container killed after its postStart hook failed", "pod", p.key(), "err", err)
		return nil
	}
	r.ensureProbes(p, cs, c)
	go r.changed(p.uid)
	return nil
}

// newTask creates the container's task with its output going to the log
// (and to attached clients).
func (r *Runtime) newTask(ctx context.Context, cont containerd.Container, inst *instance, stdin, tty bool) (containerd.Task, error) {
	var in io.Reader
	if stdin {
		inst.stdin = newStdinPipe()
		in = inst.stdin
	}
	task, err := cont.NewTask(ctx, taskIO(r.fifoDir, in, inst.logs.stream("stdout"), inst.logs.stream("stderr"), tty))
	if err != nil {
		return nil, fmt.Errorf("create task: %w", err)
	}
	return task, nil
}

// watchExit records the instance's exit when its task ends.
func (r *Runtime) watchExit(p *pod, cs *ctr, inst *instance, cont containerd.Container) {
	ctx := context.Background()
	go func() {
		for {
			ch, err := inst.task.Wait(ctx)
			if err != nil {
				if errdefs.IsNotFound(err) {
					r.finishInstance(p, inst, cont, 255, time.Now(), "Unknown", "the container's task disappeared")
					return
				}
				// containerd is away (restarting); the shim keeps the
				// container. Wait and ask again.
				time.Sleep(time.Second)
				if r.isClosing() {
					return
				}
				continue
			}
			st := <-ch
			if st.Error() != nil {
				time.Sleep(time.Second)
				if r.isClosing() {
					return
				}
				// The wait broke with the connection: reload the task.
				if t, err := cont.Task(ctx, nil); err == nil {
					inst.task = t
				}
				continue
			}
			code := int32(st.ExitCode())
			reason, msg := restarts.ExitReason(code, r.oomKilled(inst.id)), ""
			p.mu.Lock()
			if inst.killReason != "" && reason == restarts.ReasonError {
				msg = inst.killReason
			}
			p.mu.Unlock()
			r.finishInstance(p, inst, cont, code, st.ExitTime(), reason, msg)
			return
		}
	}()
}

func (r *Runtime) isClosing() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closing
}

// finishInstance records an exit: deletes the task (its IO is flushed
// first), stores the exit in the container's labels and tells the agent.
func (r *Runtime) finishInstance(p *pod, inst *instance, cont containerd.Container, code int32, at time.Time, reason, msg string) {
	ctx := context.Background()
	if inst.task != nil {
		if tio := inst.task.IO(); tio != nil {
			drainOutput(tio, outputDrain)
		}
		// Delete waits for the task's IO copies to end; never let a reader
		// stuck elsewhere hold the exit back.
		deleted := make(chan struct{})
		go func() {
			defer close(deleted)
			_, _ = inst.task.Delete(ctx)
		}()
		select {
		case <-deleted:
		case <-time.After(10 * time.Second):
			r.log.Warn("task delete still waiting on its output after 10s; recording the exit anyway", "id", inst.id)
		}
	}
	if inst.logs != nil {
		inst.logs.Close()
	}
	if inst.stdin != nil {
		inst.stdin.Close()
	}
	if m := r.terminationMessage(p, inst); m != "" {
		msg = m
	}
	if at.IsZero() || at.Year() < 2000 {
		at = time.Now()
	}
	p.mu.Lock()
	inst.running, inst.ready = false, false
	inst.exitCode, inst.finished, inst.reason, inst.message = code, at, reason, msg
	if inst.stop != nil {
		inst.stop()
	}
	p.mu.Unlock()
	r.recordExit(ctx, cont, inst)
	close(inst.exited)
	r.changed(p.uid)
}

func (r *Runtime) recordExit(ctx context.Context, cont containerd.Container, inst *instance) {
	_, err := cont.SetLabels(context.WithoutCancel(ctx), map[string]string{
		labelExitCode:    strconv.Itoa(int(inst.exitCode)),
		labelExitReason:  inst.reason,
		labelExitMessage: truncate(inst.message, 1024),
		labelStarted:     inst.started.Format(time.RFC3339Nano),
		labelFinished:    inst.finished.Format(time.RFC3339Nano),
	})
	if err != nil {
		r.log.Debug("record container exit", "id", inst.id, "err", err)
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// oomKilled tells whether the kernel's OOM killer killed a process of the
// container; read before the task is deleted, while its cgroup exists.
func (r *Runtime) oomKilled(id string) bool {
	for _, path := range []string{
		filepath.Join("/sys/fs/cgroup/memory", Namespace, id, "memory.oom_control"),
		filepath.Join("/sys/fs/cgroup", Namespace, id, "memory.events"),
	} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] == "oom_kill" && f[1] != "0" {
				return true
			}
		}
	}
	return false
}

// dropInstance deletes an instance older than the previous one.
func (r *Runtime) dropInstance(ctx context.Context, inst *instance) {
	if cont, err := r.client.LoadContainer(ctx, inst.id); err == nil {
		r.deleteContainer(ctx, cont)
	}
	removeLogs(inst.logPath)
}

func (r *Runtime) deleteContainer(ctx context.Context, cont containerd.Container) {
	ctx = context.WithoutCancel(ctx)
	if t, err := cont.Task(ctx, nil); err == nil {
		_, _ = t.Delete(ctx, containerd.WithProcessKill)
	}
	if err := cont.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		r.log.Warn("delete container", "id", cont.ID(), "err", err)
	}
}
