package containerd

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
)

// specOpts builds the OCI spec of one container instance.
func (r *Runtime) specOpts(ctx context.Context, p *pod, pod *corev1.Pod, c *corev1.Container, img containerd.Image, ips []netip.Addr, nsPath, id string) ([]oci.SpecOpts, error) {
	var ipStrs []string
	for _, ip := range ips {
		ipStrs = append(ipStrs, ip.String())
	}
	info, _ := r.Info(ctx)
	env, err := r.containerEnv(pod, c, ipStrs, info.Capacity)
	if err != nil {
		return nil, err
	}
	imgSpec, err := img.Spec(ctx)
	if err != nil {
		return nil, fmt.Errorf("read image config: %w", err)
	}
	vars := map[string]string{}
	for _, kv := range append(append([]string{}, imgSpec.Config.Env...), env...) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	args := containerArgs(c, imgSpec.Config.Entrypoint, imgSpec.Config.Cmd, vars)
	if len(args) == 0 {
		return nil, fmt.Errorf("no command specified")
	}
	opts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithProcessArgs(args...),
		oci.WithEnv(env),
		oci.WithHostname(podHostname(pod)),
		oci.WithAnnotations(map[string]string{"io.kubernetes.pod.namespace": pod.Namespace, "io.kubernetes.pod.name": pod.Name, "io.kubernetes.pod.uid": string(pod.UID)}),
	}
	if c.WorkingDir != "" {
		opts = append(opts, oci.WithProcessCwd(c.WorkingDir))
	}
	if c.TTY {
		opts = append(opts, oci.WithTTY)
	}
	if pod.Spec.HostNetwork {
		opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostHostsFile, oci.WithHostResolvconf)
		if h, err := os.Hostname(); err == nil {
			opts = append(opts, oci.WithHostname(h))
		}
	} else {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: nsPath}))
	}
	if pod.Spec.HostPID {
		opts = append(opts, oci.WithHostNamespace(specs.PIDNamespace))
	}
	if pod.Spec.HostIPC {
		opts = append(opts, oci.WithHostNamespace(specs.IPCNamespace))
	}

	mounts, err := r.mounts(p, pod, c, id)
	if err != nil {
		return nil, err
	}
	opts = append(opts, oci.WithMounts(mounts))
	opts = append(opts, resourceOpts(c, r.cfg.PidsLimit)...)
	sec, err := securityOpts(pod, c)
	if err != nil {
		return nil, err
	}
	opts = append(opts, sec...)
	return opts, nil
}

// containerArgs applies the Kubernetes rules: command replaces the
// image's entrypoint and drops its cmd; args replace the cmd.
func containerArgs(c *corev1.Container, entrypoint, cmd []string, vars map[string]string) []string {
	var out []string
	switch {
	case len(c.Command) > 0:
		out = append(out, c.Command...)
		out = append(out, c.Args...)
	case len(c.Args) > 0:
		out = append(append(out, entrypoint...), c.Args...)
	default:
		return append(append(out, entrypoint...), cmd...)
	}
	for i, a := range out {
		out[i] = expand(a, vars)
	}
	return out
}

func podHostname(pod *corev1.Pod) string {
	h := pod.Spec.Hostname
	if h == "" {
		h = pod.Name
	}
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// resourceOpts turns requests and limits into cgroup settings: cpu
// shares from the request, a CFS quota from the limit, the memory limit
// and a pids limit.
func resourceOpts(c *corev1.Container, pids int64) []oci.SpecOpts {
	var opts []oci.SpecOpts
	req, lim := c.Resources.Requests, c.Resources.Limits
	cpuReq, ok := req[corev1.ResourceCPU]
	if !ok {
		cpuReq, ok = lim[corev1.ResourceCPU]
	}
	shares := uint64(2)
	if ok {
		shares = max(uint64(cpuReq.MilliValue()*1024/1000), 2)
	}
	opts = append(opts, oci.WithCPUShares(shares))
	if q, ok := lim[corev1.ResourceCPU]; ok && !q.IsZero() {
		const period = 100000
		quota := max(q.MilliValue()*period/1000, 1000)
		opts = append(opts, oci.WithCPUCFS(quota, period))
	}
	if q, ok := lim[corev1.ResourceMemory]; ok && !q.IsZero() {
		opts = append(opts, oci.WithMemoryLimit(uint64(q.Value())))
		// No swap beyond the limit: the limit must mean OOM, as on a
		// kubelet node without swap.
		opts = append(opts, oci.WithMemorySwap(q.Value()))
	}
	if pids > 0 {
		opts = append(opts, oci.WithPidsLimit(pids))
	}
	return opts
}

// securityOpts applies the pod's and the container's security contexts.
func securityOpts(pod *corev1.Pod, c *corev1.Container) ([]oci.SpecOpts, error) {
	var opts []oci.SpecOpts
	psc := pod.Spec.SecurityContext
	sc := c.SecurityContext
	var uid, gid *int64
	if psc != nil {
		uid, gid = psc.RunAsUser, psc.RunAsGroup
	}
	if sc != nil {
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
	}
	switch {
	case uid != nil && gid != nil:
		opts = append(opts, oci.WithUIDGID(uint32(*uid), uint32(*gid)))
	case uid != nil:
		opts = append(opts, oci.WithUserID(uint32(*uid)))
	case gid != nil:
		g := uint32(*gid)
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			s.Process.User.GID = g
			return nil
		})
	}
	var groups []uint32
	if psc != nil {
		for _, g := range psc.SupplementalGroups {
			groups = append(groups, uint32(g))
		}
		if psc.FSGroup != nil {
			groups = append(groups, uint32(*psc.FSGroup))
		}
	}
	if len(groups) > 0 {
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			s.Process.User.AdditionalGids = append(s.Process.User.AdditionalGids, groups...)
			return nil
		})
	}
	seccompType := corev1.SeccompProfileTypeUnconfined
	if psc != nil && psc.SeccompProfile != nil {
		seccompType = psc.SeccompProfile.Type
	}
	if sc != nil && sc.SeccompProfile != nil {
		seccompType = sc.SeccompProfile.Type
	}
	if sc != nil {
		if sc.Privileged != nil && *sc.Privileged {
			opts = append(opts, oci.WithPrivileged, oci.WithAllDevicesAllowed, oci.WithHostDevices, oci.WithWriteableSysfs, oci.WithWriteableCgroupfs)
			seccompType = corev1.SeccompProfileTypeUnconfined
		}
		if sc.Capabilities != nil {
			var add, drop []string
			for _, c := range sc.Capabilities.Add {
				add = append(add, capName(c))
			}
			for _, c := range sc.Capabilities.Drop {
				drop = append(drop, capName(c))
			}
			for _, d := range drop {
				if d == "CAP_ALL" {
					opts = append(opts, oci.WithCapabilities(nil))
					drop = nil
					break
				}
			}
			if len(drop) > 0 {
				opts = append(opts, oci.WithDroppedCapabilities(drop))
			}
			if len(add) > 0 {
				opts = append(opts, oci.WithAddedCapabilities(add))
			}
		}
		if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
			opts = append(opts, oci.WithRootFSReadonly())
		}
		if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
			opts = append(opts, oci.WithNoNewPrivileges)
		}
	}
	switch seccompType {
	case corev1.SeccompProfileTypeRuntimeDefault:
		opts = append(opts, seccomp.WithDefaultProfile())
	case corev1.SeccompProfileTypeLocalhost:
		return nil, fmt.Errorf("seccomp profile type Localhost is not supported")
	}
	return opts, nil
}

func capName(c corev1.Capability) string {
	s := strings.ToUpper(string(c))
	if !strings.HasPrefix(s, "CAP_") {
		s = "CAP_" + s
	}
	return s
}

// mounts lists the container's bind mounts: its volumes, /etc/hosts,
// /etc/hostname, /etc/resolv.conf and the termination log.
func (r *Runtime) mounts(p *pod, pod *corev1.Pod, c *corev1.Container, id string) ([]specs.Mount, error) {
	var out []specs.Mount
	has := map[string]bool{}
	readOnly := map[string]bool{}
	for i := range pod.Spec.Volumes {
		if edge.ClaimReadOnly(&pod.Spec.Volumes[i]) {
			readOnly[pod.Spec.Volumes[i].Name] = true
		}
	}
	for _, vm := range c.VolumeMounts {
		src, err := r.volumeSource(p, pod, vm.Name)
		if err != nil {
			return nil, err
		}
		if vm.SubPath != "" {
			if strings.Contains(vm.SubPath, "..") || filepath.IsAbs(vm.SubPath) {
				return nil, fmt.Errorf("volume %s: subPath %q must be a relative path without '..'", vm.Name, vm.SubPath)
			}
			src = filepath.Join(src, vm.SubPath)
			if _, err := os.Stat(src); os.IsNotExist(err) {
				if err := os.MkdirAll(src, 0o755); err != nil {
					return nil, fmt.Errorf("volume %s: create subPath: %w", vm.Name, err)
				}
			}
		}
		opts := []string{"rbind", "rprivate"}
		if vm.ReadOnly || readOnly[vm.Name] {
			opts = append(opts, "ro")
		}
		out = append(out, specs.Mount{Destination: vm.MountPath, Type: "bind", Source: src, Options: opts})
		has[vm.MountPath] = true
	}
	if !pod.Spec.HostNetwork {
		for _, f := range []string{"hosts", "resolv.conf", "hostname"} {
			if !has["/etc/"+f] {
				out = append(out, specs.Mount{Destination: "/etc/" + f, Type: "bind", Source: filepath.Join(p.dir, "etc", f), Options: []string{"rbind", "rprivate"}})
			}
		}
	}
	if c.TerminationMessagePath != "" && !has[c.TerminationMessagePath] {
		path := r.terminationPath(p, id)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, nil, 0o666); err != nil {
			return nil, err
		}
		_ = os.Chmod(path, 0o666) // any user of the container may write it
		out = append(out, specs.Mount{Destination: c.TerminationMessagePath, Type: "bind", Source: path, Options: []string{"rbind", "rprivate"}})
	}
	return out, nil
}

func (r *Runtime) terminationPath(p *pod, id string) string {
	return filepath.Join(p.dir, "termination", id)
}

// terminationMessage is what the container wrote to its termination log,
// or the tail of its log when it failed with FallbackToLogsOnError.
func (r *Runtime) terminationMessage(p *pod, inst *instance) string {
	path := r.terminationPath(p, inst.id)
	b, _ := os.ReadFile(path)
	_ = os.Remove(path)
	if len(b) > 4096 {
		b = b[:4096]
	}
	if len(b) > 0 {
		return string(b)
	}
	p.mu.Lock()
	spec := p.spec
	p.mu.Unlock()
	cs := p.find(containerNameOf(inst.id, spec))
	if cs == nil || spec == nil {
		return ""
	}
	c := containerSpec(spec, cs.name)
	if c != nil && c.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError && inst.exitCode != 0 {
		return lastLines(inst.logPath, 80, 2048)
	}
	return ""
}

// containerNameOf finds which container of spec an instance ID belongs to.
func containerNameOf(id string, spec *corev1.Pod) string {
	if spec == nil {
		return ""
	}
	for _, list := range [][]corev1.Container{spec.Spec.InitContainers, spec.Spec.Containers} {
		for _, c := range list {
			if strings.HasPrefix(id, containerID(spec.UID, c.Name, 0)[:13]) {
				n := id[13:]
				if i := strings.LastIndexByte(n, '-'); i > 0 {
					if _, err := strconv.Atoi(n[i+1:]); err == nil && n[:i] == truncate(c.Name, 48) {
						return c.Name
					}
				}
			}
		}
	}
	return ""
}
