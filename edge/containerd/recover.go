package containerd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge/restarts"
)

// recover rebuilds the runtime's pods from containerd's containers and the
// pod directories, after an agent restart or a node reboot. Running
// containers are adopted as they are: their output goes on to their logs
// and their exits are watched. Containers that stopped while the agent was
// away are recorded as exited, so that the restart policy applies.
func (r *Runtime) recover(ctx context.Context) error {
	conts, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q", labelPodUID))
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	type found struct {
		cont    containerd.Container
		labels  map[string]string
		attempt int
	}
	byPod := map[types.UID]map[string][]found{}
	for _, c := range conts {
		labels, err := c.Labels(ctx)
		if err != nil {
			continue
		}
		uid := types.UID(labels[labelPodUID])
		if byPod[uid] == nil {
			byPod[uid] = map[string][]found{}
		}
		attempt, _ := strconv.Atoi(labels[labelAttempt])
		name := labels[labelContainer]
		byPod[uid][name] = append(byPod[uid][name], found{c, labels, attempt})
	}
	// Pod directories without containers still hold a sandbox to clean.
	dirs, _ := os.ReadDir(r.podsDir)
	for _, d := range dirs {
		uid := types.UID(d.Name())
		if byPod[uid] == nil {
			byPod[uid] = map[string][]found{}
		}
	}
	for uid, containers := range byPod {
		p := &pod{uid: uid, dir: r.podDir(uid)}
		var sb sandboxState
		if b, err := os.ReadFile(filepath.Join(p.dir, "sandbox.json")); err == nil && json.Unmarshal(b, &sb) == nil {
			p.namespace, p.name, p.netnsPath = sb.Namespace, sb.Name, sb.Netns
			for _, s := range sb.IPs {
				if a, err := netip.ParseAddr(s); err == nil {
					p.ips = append(p.ips, a)
				}
			}
			// After a reboot the namespace is gone: the sandbox must be
			// made again.
			p.sandboxReady = true
			if p.netnsPath != "" {
				if _, err := os.Stat(p.netnsPath); err != nil {
					p.sandboxReady, p.netnsPath, p.ips = false, "", nil
				}
			}
		}
		for name, list := range containers {
			sort.Slice(list, func(i, j int) bool { return list[i].attempt > list[j].attempt })
			if p.namespace == "" && len(list) > 0 {
				p.namespace, p.name = list[0].labels[labelPodNamespace], list[0].labels[labelPodName]
			}
			cs := p.container(name, list[0].labels[labelInit] == "true", r.cfg.BackoffBase, r.cfg.BackoffMax)
			cs.ephemeral = list[0].labels[labelEphemeral] == "true"
			for i, f := range list {
				if i >= 2 {
					r.deleteContainer(ctx, f.cont)
					continue
				}
				inst := r.adopt(ctx, p, cs, f.cont, f.labels, f.attempt, i == 0)
				if i == 0 {
					cs.cur = inst
				} else {
					cs.prev = inst
				}
			}
		}
		r.pods[uid] = p
		r.log.Info("adopted pod", "pod", p.key(), "uid", uid, "sandbox", p.sandboxReady)
	}
	return nil
}

// adopt rebuilds one instance from its containerd container.
func (r *Runtime) adopt(ctx context.Context, p *pod, cs *ctr, cont containerd.Container, labels map[string]string, attempt int, current bool) *instance {
	inst := &instance{
		id: cont.ID(), attempt: int32(attempt), image: labels[labelImage],
		logPath: r.logPath(p, cs.name, int32(attempt)), exited: make(chan struct{}),
	}
	if info, err := cont.Info(ctx); err == nil {
		inst.image = info.Image
		if img, err := r.client.GetImage(ctx, info.Image); err == nil {
			inst.imageID = img.Target().Digest.String()
		}
	}
	inst.started, _ = time.Parse(time.RFC3339Nano, labels[labelStarted])
	exited := func() {
		code, _ := strconv.Atoi(labels[labelExitCode])
		inst.exitCode, inst.reason, inst.message = int32(code), labels[labelExitReason], labels[labelExitMessage]
		inst.finished, _ = time.Parse(time.RFC3339Nano, labels[labelFinished])
		if labels[labelExitReason] == "" {
			// It stopped with the node (a reboot) or its task vanished.
			inst.exitCode, inst.reason = 255, "Unknown"
			inst.message = "the container stopped while the agent was not running"
			inst.finished = time.Now()
			r.recordExit(ctx, cont, inst)
		}
		close(inst.exited)
	}
	if !current {
		exited()
		return inst
	}
	var logs *logWriter
	var stdin *stdinPipe
	attach := func(fs *cio.FIFOSet) (cio.IO, error) {
		var err error
		logs, err = newLogWriter(inst.logPath, r.cfg.LogMaxSize, r.cfg.LogMaxFiles)
		if err != nil {
			return nil, err
		}
		var in io.Reader
		if fs.Stdin != "" {
			stdin = newStdinPipe()
			in = stdin
		}
		return attachTaskIO(in, logs.stream("stdout"), logs.stream("stderr"))(fs)
	}
	task, err := cont.Task(ctx, attach)
	if err != nil {
		if logs != nil {
			logs.Close()
		}
		if !errdefs.IsNotFound(err) {
			r.log.Warn("load task", "id", cont.ID(), "err", err)
		}
		exited()
		return inst
	}
	st, err := task.Status(ctx)
	if err != nil || st.Status == containerd.Stopped || st.Status == containerd.Unknown {
		code := int32(st.ExitStatus)
		reason := restarts.ExitReason(code, r.oomKilled(inst.id))
		_, _ = task.Delete(ctx)
		if logs != nil {
			logs.Close()
		}
		inst.exitCode, inst.reason, inst.finished = code, reason, st.ExitTime
		if inst.finished.IsZero() || inst.finished.Year() < 2000 {
			inst.finished = time.Now()
		}
		r.recordExit(ctx, cont, inst)
		close(inst.exited)
		return inst
	}
	inst.task, inst.logs, inst.stdin, inst.running = task, logs, stdin, true
	inst.startupDone = true
	if inst.started.IsZero() {
		inst.started = time.Now()
	}
	r.watchExit(p, cs, inst, cont)
	return inst
}

// rewatch wakes every pod after containerd came back, so that the agent
// reads their state again.
func (r *Runtime) rewatch() {
	r.mu.Lock()
	uids := make([]types.UID, 0, len(r.pods))
	for uid := range r.pods {
		uids = append(uids, uid)
	}
	r.mu.Unlock()
	for _, uid := range uids {
		r.changed(uid)
	}
}
