package edge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// Node labels the agent sets.
const (
	LabelHostname = "kubernetes.io/hostname"
	LabelOS       = "kubernetes.io/os"
	LabelArch     = "kubernetes.io/arch"
	LabelZone     = "topology.kubernetes.io/zone"
)

// kubeletPort is advertised in daemonEndpoints for tools that read it; the
// hub reaches the node server through the tunnel, not this port.
const kubeletPort = 10250

// hostFacts are the parts of nodeInfo that come from the machine.
type hostFacts struct {
	MachineID, SystemUUID, BootID string
	KernelVersion, OSImage        string
}

func readHostFacts() hostFacts {
	var f hostFacts
	read := func(p string) string {
		b, _ := os.ReadFile(p)
		return strings.TrimSpace(string(b))
	}
	f.MachineID = read("/etc/machine-id")
	f.SystemUUID = read("/sys/class/dmi/id/product_uuid")
	f.BootID = read("/proc/sys/kernel/random/boot_id")
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		f.KernelVersion = unix.ByteSliceToString(u.Release[:])
	}
	f.OSImage = "Linux"
	for _, line := range strings.Split(read("/etc/os-release"), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			f.OSImage = strings.Trim(v, `"`)
		}
	}
	return f
}

// nodeInput is what the Node object is built from.
type nodeInput struct {
	name     string
	ip       netip.Addr
	zone     string
	labels   map[string]string
	info     RuntimeInfo
	infoErr  error // the runtime did not answer: not ready
	capacity corev1.ResourceList
	host     hostFacts
	version  string // the agent's
	now      time.Time
	extra    *corev1.NodeCondition   // Agent.SetNodeCondition's
	images   []corev1.ContainerImage // the runtime's, when it says (ImageStager)
}

// KubeletVersion is what an agent of the given version reports as its
// kubelet version: the Kubernetes version it implements, marked as
// tether's, with the agent's version as semantic version build metadata
// (so tools comparing Kubernetes versions read the first part), e.g.
// v1.37.2-tether+v0.4.1. Characters build metadata cannot hold become
// hyphens.
func KubeletVersion(agent string) string {
	if agent == "" {
		return KubernetesVersion + "-tether"
	}
	b := []byte(agent)
	for i, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '.') {
			b[i] = '-'
		}
	}
	return KubernetesVersion + "-tether+" + string(b)
}

// nodeLabels are the labels the agent owns on its Node.
func nodeLabels(in nodeInput) map[string]string {
	l := map[string]string{
		LabelHostname: in.name,
		LabelOS:       goruntime.GOOS,
		LabelArch:     goruntime.GOARCH,
	}
	if in.zone != "" {
		l[LabelZone] = in.zone
	}
	for k, v := range in.labels {
		l[k] = v
	}
	return l
}

// buildNodeStatus computes the Node status; old supplies the transition
// times of unchanged conditions.
func buildNodeStatus(in nodeInput, old *corev1.NodeStatus) corev1.NodeStatus {
	capacity := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110")}
	for k, v := range in.info.Capacity {
		capacity[k] = v.DeepCopy()
	}
	for k, v := range in.capacity {
		capacity[k] = v.DeepCopy()
	}
	st := corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity.DeepCopy(),
		Phase:       "",
		Addresses:   []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: in.name}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{
			KubeletEndpoint: corev1.DaemonEndpoint{Port: kubeletPort},
		},
		NodeInfo: corev1.NodeSystemInfo{
			MachineID:       in.host.MachineID,
			SystemUUID:      in.host.SystemUUID,
			BootID:          in.host.BootID,
			KernelVersion:   in.host.KernelVersion,
			OSImage:         in.host.OSImage,
			OperatingSystem: goruntime.GOOS,
			Architecture:    goruntime.GOARCH,
			KubeletVersion:  KubeletVersion(in.version),
		},
	}
	st.Images = in.images
	if in.info.Name != "" {
		st.NodeInfo.ContainerRuntimeVersion = in.info.Name + "://" + in.info.Version
	}
	if in.ip.IsValid() {
		st.Addresses = append([]corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: in.ip.String()}}, st.Addresses...)
	}
	now := metav1.NewTime(in.now).Rfc3339Copy()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		c := corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
		if old != nil {
			for _, o := range old.Conditions {
				if o.Type == t && o.Status == s {
					c.LastTransitionTime = o.LastTransitionTime
				}
			}
		}
		return c
	}
	ready := cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "tether edge agent is posting ready status")
	if in.infoErr != nil {
		ready = cond(corev1.NodeReady, corev1.ConditionFalse, "KubeletNotReady", fmt.Sprintf("container runtime is down: %v", in.infoErr))
	}
	st.Conditions = []corev1.NodeCondition{
		cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "node has sufficient memory available"),
		cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "node has no disk pressure"),
		cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "node has sufficient PID available"),
		ready,
	}
	if e := in.extra; e != nil {
		c := cond(e.Type, e.Status, e.Reason, e.Message)
		if old != nil {
			// A new reason or message is a transition too: a
			// condition reporting one attempt after another must show
			// when the latest began.
			for _, o := range old.Conditions {
				if o.Type == e.Type && (o.Reason != e.Reason || o.Message != e.Message) {
					c.LastTransitionTime = now
				}
			}
		}
		st.Conditions = append(st.Conditions, c)
	}
	return st
}

// sameNodeStatus compares two statuses leaving out the heartbeat times,
// which change at every computation.
func sameNodeStatus(a, b corev1.NodeStatus) bool {
	strip := func(s corev1.NodeStatus) corev1.NodeStatus {
		s = *s.DeepCopy()
		for i := range s.Conditions {
			s.Conditions[i].LastHeartbeatTime = metav1.Time{}
		}
		// Fields other writers own (volumes) do not count.
		s.VolumesInUse, s.VolumesAttached = nil, nil
		return s
	}
	return apiequality.Semantic.DeepEqual(strip(a), strip(b))
}

// statusPatch returns a strategic merge patch from old to new of a Node's
// or a Pod's status: only what changed goes on the wire.
func statusPatch(old, cur, schema any) ([]byte, error) {
	oldJSON, err := json.Marshal(old)
	if err != nil {
		return nil, fmt.Errorf("encode old status: %w", err)
	}
	newJSON, err := json.Marshal(cur)
	if err != nil {
		return nil, fmt.Errorf("encode new status: %w", err)
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(oldJSON, newJSON, schema)
	if err != nil {
		return nil, fmt.Errorf("compute status patch: %w", err)
	}
	return dropElementOrder(patch)
}

// dropElementOrder removes the $setElementOrder directives from a patch.
// They only pin the order of merged lists (conditions, addresses), which
// no reader depends on, and they would double the size of the periodic
// heartbeat patch.
func dropElementOrder(patch []byte) ([]byte, error) {
	if !bytes.Contains(patch, []byte(`"$setElementOrder/`)) {
		return patch, nil
	}
	var m map[string]any
	if err := json.Unmarshal(patch, &m); err != nil {
		return nil, fmt.Errorf("decode status patch: %w", err)
	}
	var walk func(map[string]any)
	walk = func(m map[string]any) {
		for k, v := range m {
			if strings.HasPrefix(k, "$setElementOrder/") {
				delete(m, k)
			} else if sub, ok := v.(map[string]any); ok {
				walk(sub)
			}
		}
	}
	walk(m)
	return json.Marshal(m)
}

func emptyPatch(p []byte) bool { return bytes.Equal(p, []byte("{}")) }

// primaryIP returns the address this host uses to reach host, or else its
// first global unicast address.
func primaryIP(host string) netip.Addr {
	if c, err := net.Dial("udp", net.JoinHostPort(host, "9")); err == nil {
		// UDP "connect" sends nothing: it only picks the route.
		ap, _ := netip.ParseAddrPort(c.LocalAddr().String())
		c.Close()
		if a := ap.Addr().Unmap(); a.IsValid() && !a.IsLoopback() {
			return a
		}
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().IsGlobalUnicast() {
				return ip.Unmap()
			}
		}
	}
	return netip.Addr{}
}
