package edge

import (
	"context"
	"errors"
	"net/netip"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/dataplane"
)

// With the eBPF dataplane, the node serves its pods' host ports (a
// container port's hostPort) in eBPF rather than through the runtime's
// network (the CNI portmap plugin, which writes iptables rules): the pod
// workers give the dataplane each pod's host ports once the runtime knows
// the pod's addresses, and take them away when the pod stops. After an
// agent restart the ports of the pods the runtime still runs are given
// before the dataplane's first Sync, which would otherwise remove them.

// hostPortFeed gives the dataplane the host ports of the node's pods.
type hostPortFeed struct {
	dp *dataplane.Dataplane

	mu sync.Mutex
	// set holds the pods whose ports the dataplane has, with the error
	// last reported for them (so that it is reported once).
	set map[types.UID]string
	// gone holds the pods removed before the seeding, which must not
	// give them again from a pod list read earlier; nil afterwards.
	gone map[types.UID]bool
}

func newHostPortFeed(dp *dataplane.Dataplane) *hostPortFeed {
	return &hostPortFeed{dp: dp, set: map[types.UID]string{}, gone: map[types.UID]bool{}}
}

// containerHostPorts lists the host ports pod asks for; none for a
// host-network pod, whose containers bind the node's ports themselves.
func containerHostPorts(pod *corev1.Pod) []corev1.ContainerPort {
	if pod.Spec.HostNetwork {
		return nil
	}
	var out []corev1.ContainerPort
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort > 0 {
				out = append(out, p)
			}
		}
	}
	return out
}

// hostPortsOf pairs the pod's host ports with its addresses: a port with a
// host address goes to the pod address of that family, one without to
// each pod address (both families on a dual-stack pod).
func hostPortsOf(ports []corev1.ContainerPort, ips []netip.Addr) []dataplane.HostPort {
	var out []dataplane.HostPort
	for _, p := range ports {
		var host netip.Addr
		if p.HostIP != "" {
			h, err := netip.ParseAddr(p.HostIP)
			if err != nil {
				continue // the API validates hostIP
			}
			host = h.Unmap()
		}
		for _, ip := range ips {
			ip = ip.Unmap()
			if host.IsValid() && !host.IsUnspecified() && host.Is6() != ip.Is6() {
				continue
			}
			out = append(out, dataplane.HostPort{HostIP: host, Port: uint16(p.HostPort), Protocol: p.Protocol,
				PodIP: ip, PodPort: uint16(p.ContainerPort)})
		}
	}
	return out
}

// update gives the dataplane the host ports of a running pod, at the
// addresses the runtime gave it; a pod without addresses yet has none.
func (f *hostPortFeed) update(ctx context.Context, a *Agent, pod *corev1.Pod) {
	ports := containerHostPorts(pod)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone[pod.UID] {
		return
	}
	_, had := f.set[pod.UID]
	if len(ports) == 0 && !had {
		return
	}
	var hps []dataplane.HostPort
	if len(ports) > 0 {
		st, err := a.cfg.Runtime.PodStatus(ctx, pod.UID)
		if err != nil && !errors.Is(err, ErrPodNotFound) {
			a.log.Warn("read the pod's addresses for its host ports", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			return
		}
		if st != nil {
			hps = hostPortsOf(ports, st.IPs)
		}
	}
	if len(hps) == 0 && !had {
		return
	}
	err := f.dp.SetHostPorts(pod.UID, hps)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if len(hps) == 0 {
		delete(f.set, pod.UID)
	} else {
		if msg != "" && f.set[pod.UID] != msg {
			a.log.Warn("host ports of the pod not served", "pod", pod.Namespace+"/"+pod.Name, "err", err)
			a.recordEvent(PodEvent{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name, Warning: true,
				Reason: "HostPortUnsupported", Message: msg})
		}
		f.set[pod.UID] = msg
	}
}

// remove takes a stopped pod's host ports away. final says the pod is gone
// for good: it is never given again.
func (f *hostPortFeed) remove(uid types.UID, final bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if final && f.gone != nil {
		f.gone[uid] = true
	}
	if _, had := f.set[uid]; !had {
		return
	}
	delete(f.set, uid)
	_ = f.dp.SetHostPorts(uid, nil) // removing is never refused
}

// seed gives the host ports of every pod the agent runs, before the
// dataplane's first Sync.
func (f *hostPortFeed) seed(ctx context.Context, a *Agent) {
	for _, pod := range a.pods.pods() {
		if pod.DeletionTimestamp != nil || terminal(a.status.base(pod).Phase) {
			continue
		}
		f.update(ctx, a, pod)
	}
	f.mu.Lock()
	f.gone = nil
	f.mu.Unlock()
}

// The pod workers' calls; nothing happens without the eBPF dataplane.

func (a *Agent) hostPortsUp(ctx context.Context, pod *corev1.Pod) {
	if a.net != nil && a.net.hostPorts != nil {
		a.net.hostPorts.update(ctx, a, pod)
	}
}

func (a *Agent) hostPortsDown(uid types.UID, final bool) {
	if a.net != nil && a.net.hostPorts != nil {
		a.net.hostPorts.remove(uid, final)
	}
}
