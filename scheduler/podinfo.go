package scheduler

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
)

// PodInfo is a pod with everything the filters and scores need worked out
// once: its effective requests, host ports, compiled selectors and
// resolved priority. Building it is the expensive part of seeing a pod; the
// hot loop only reads it.
type PodInfo struct {
	// Pod is the pod as the informer reported it; in the loop that is the
	// slim copy the pod informer keeps (slimPod), not the whole object.
	Pod       *corev1.Pod
	UID       types.UID
	Namespace string
	Name      string
	Labels    labels.Set

	// Priority is the resolved priority (see PriorityResolver).
	Priority int32
	// PreemptNever is preemptionPolicy: Never.
	PreemptNever bool

	// Req is the effective request; NonZero the same with the scoring
	// defaults for cpu and memory that are not requested.
	Req     Resources
	NonZero Resources

	Ports []hostPort

	// Compiled constraints of the pod's spec.
	nodeSelector          map[string]string
	requiredNodeAffinity  *nodeSelector
	preferredNodeAffinity []weightedNodeTerm
	tolerations           []corev1.Toleration

	requiredAffinity      []affinityTerm
	requiredAntiAffinity  []affinityTerm
	preferredAffinity     []affinityTerm
	preferredAntiAffinity []affinityTerm

	spread []spreadConstraint

	pvcs   []pvcRef
	images []string
	// numContainers is the count of init and app containers, which image
	// locality scales its thresholds by.
	numContainers int

	// Bookkeeping of the snapshot.
	node        *NodeInfo
	nodePos     int // position in node.Pods
	affPos      int // position in Snapshot.podsWithAffinity, or -1
	antiPos     int // position in Snapshot.podsWithRequiredAnti, or -1
	group       *labelGroup
	terminating bool
	assumed     bool
	// boundAt is when the API accepted an assumed pod's binding.
	boundAt time.Time
	// nominatedNode is status.nominatedNodeName of a pending pod.
	nominatedNode string
	// startTime orders victims of equal priority (older pods are more
	// important).
	startTime time.Time
}

// Key is namespace/name.
func (p *PodInfo) Key() string { return p.Namespace + "/" + p.Name }

// hasAffinity tells whether the pod has any inter-pod (anti-)affinity term.
func (p *PodInfo) hasAffinity() bool {
	return len(p.requiredAffinity)+len(p.requiredAntiAffinity)+len(p.preferredAffinity)+len(p.preferredAntiAffinity) > 0
}

// hasScoringTerms tells whether the inter-pod score reads the pod's terms
// when other pods are placed.
func (p *PodInfo) hasScoringTerms() bool {
	return len(p.requiredAffinity)+len(p.preferredAffinity)+len(p.preferredAntiAffinity) > 0
}

type hostPort struct {
	ip       string
	protocol corev1.Protocol
	port     int32
}

func (a hostPort) conflicts(b hostPort) bool {
	if a.port != b.port || a.protocol != b.protocol {
		return false
	}
	return a.ip == b.ip || a.ip == "0.0.0.0" || b.ip == "0.0.0.0" || a.ip == "::" || b.ip == "::"
}

type pvcRef struct {
	name string
	// ephemeral: the claim of a generic ephemeral volume, which must be
	// owned by the pod.
	ephemeral bool
}

// affinityTerm is a compiled PodAffinityTerm.
type affinityTerm struct {
	selector   labels.Selector
	namespaces map[string]struct{}
	// nsSelector is nil when the term has none; an empty one selects every
	// namespace.
	nsSelector  labels.Selector
	topologyKey string
	weight      int32
	// id is shared by terms that are identical (replicas of one
	// template), so a decision matches each distinct term once.
	id int32
}

// termIDs interns term signatures.
var termIDs = struct {
	sync.Mutex
	ids map[string]int32
}{ids: map[string]int32{}}

func internTerm(t *affinityTerm) int32 {
	nss := make([]string, 0, len(t.namespaces))
	for ns := range t.namespaces {
		nss = append(nss, ns)
	}
	sort.Strings(nss)
	sig := t.selector.String() + "\x00" + strings.Join(nss, ",") + "\x00" + t.topologyKey
	if t.nsSelector != nil {
		sig += "\x00" + t.nsSelector.String()
	}
	termIDs.Lock()
	defer termIDs.Unlock()
	id, ok := termIDs.ids[sig]
	if !ok {
		id = int32(len(termIDs.ids))
		termIDs.ids[sig] = id
	}
	return id
}

func numTermIDs() int {
	termIDs.Lock()
	defer termIDs.Unlock()
	return len(termIDs.ids)
}

// matchesNamespace tells whether a pod in namespace ns (labelled nsLabels)
// is in the term's scope.
func (t *affinityTerm) matchesNamespace(ns string, nsLabels labels.Set) bool {
	if _, ok := t.namespaces[ns]; ok {
		return true
	}
	return t.nsSelector != nil && nsLabels != nil && t.nsSelector.Matches(nsLabels)
}

// matches tells whether an existing pod (namespace ns, labels l) satisfies
// the term's pod selector and namespace scope.
func (t *affinityTerm) matches(ns string, l labels.Set, nsLabels labels.Set) bool {
	return t.matchesNamespace(ns, nsLabels) && t.selector.Matches(l)
}

// spreadConstraint is a compiled TopologySpreadConstraint.
type spreadConstraint struct {
	maxSkew       int32
	key           string
	selector      labels.Selector
	minDomains    int32
	doNotSchedule bool
	// honorAffinity: nodeAffinityPolicy Honor (the default) counts only
	// nodes that match the pod's nodeSelector and required node affinity.
	honorAffinity bool
	// honorTaints: nodeTaintsPolicy Honor (default Ignore) counts only
	// nodes whose taints the pod tolerates.
	honorTaints bool
}

// PriorityResolver gives the priority and preemption policy of a pod.
type PriorityResolver func(pod *corev1.Pod) (priority int32, preemptNever bool)

// StaticPriority resolves priority from the pod spec alone, 0 when unset.
func StaticPriority(pod *corev1.Pod) (int32, bool) {
	var p int32
	if pod.Spec.Priority != nil {
		p = *pod.Spec.Priority
	}
	return p, pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy == corev1.PreemptNever
}

// NewPodInfo compiles pod. prio may be nil (StaticPriority).
func NewPodInfo(pod *corev1.Pod, prio PriorityResolver) (*PodInfo, error) {
	if prio == nil {
		prio = StaticPriority
	}
	p := &PodInfo{
		Pod: pod, UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name,
		Labels: labels.Set(pod.Labels), affPos: -1, antiPos: -1, nodePos: -1,
		terminating:   pod.DeletionTimestamp != nil,
		nominatedNode: pod.Status.NominatedNodeName,
	}
	if p.Labels == nil {
		p.Labels = labels.Set{}
	}
	p.Priority, p.PreemptNever = prio(pod)
	if pod.Status.StartTime != nil {
		p.startTime = pod.Status.StartTime.Time
	} else {
		p.startTime = pod.CreationTimestamp.Time
	}
	p.Req = podRequests(pod, false)
	p.NonZero = podRequests(pod, true)
	p.tolerations = pod.Spec.Tolerations
	p.nodeSelector = pod.Spec.NodeSelector

	for i := range pod.Spec.Containers {
		p.addPorts(&pod.Spec.Containers[i])
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			p.addPorts(c)
		}
	}
	for i := range pod.Spec.InitContainers {
		p.images = append(p.images, normalizedImage(pod.Spec.InitContainers[i].Image))
	}
	for i := range pod.Spec.Containers {
		p.images = append(p.images, normalizedImage(pod.Spec.Containers[i].Image))
	}
	p.numContainers = len(pod.Spec.InitContainers) + len(pod.Spec.Containers)

	for _, v := range pod.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			p.pvcs = append(p.pvcs, pvcRef{name: v.PersistentVolumeClaim.ClaimName})
		case v.Ephemeral != nil:
			p.pvcs = append(p.pvcs, pvcRef{name: pod.Name + "-" + v.Name, ephemeral: true})
		}
	}

	if a := pod.Spec.Affinity; a != nil {
		if na := a.NodeAffinity; na != nil {
			if na.RequiredDuringSchedulingIgnoredDuringExecution != nil {
				ns, err := compileNodeSelector(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms)
				if err != nil {
					return nil, fmt.Errorf("compile required node affinity: %w", err)
				}
				p.requiredNodeAffinity = ns
			}
			for _, t := range na.PreferredDuringSchedulingIgnoredDuringExecution {
				if t.Weight == 0 {
					continue
				}
				ct, err := compileNodeTerm(t.Preference)
				if err != nil {
					return nil, fmt.Errorf("compile preferred node affinity: %w", err)
				}
				p.preferredNodeAffinity = append(p.preferredNodeAffinity, weightedNodeTerm{term: ct, weight: t.Weight})
			}
		}
		if pa := a.PodAffinity; pa != nil {
			for i := range pa.RequiredDuringSchedulingIgnoredDuringExecution {
				t, err := p.compileTerm(&pa.RequiredDuringSchedulingIgnoredDuringExecution[i], 0)
				if err != nil {
					return nil, err
				}
				p.requiredAffinity = append(p.requiredAffinity, t)
			}
			for i := range pa.PreferredDuringSchedulingIgnoredDuringExecution {
				w := &pa.PreferredDuringSchedulingIgnoredDuringExecution[i]
				t, err := p.compileTerm(&w.PodAffinityTerm, w.Weight)
				if err != nil {
					return nil, err
				}
				p.preferredAffinity = append(p.preferredAffinity, t)
			}
		}
		if pa := a.PodAntiAffinity; pa != nil {
			for i := range pa.RequiredDuringSchedulingIgnoredDuringExecution {
				t, err := p.compileTerm(&pa.RequiredDuringSchedulingIgnoredDuringExecution[i], 0)
				if err != nil {
					return nil, err
				}
				p.requiredAntiAffinity = append(p.requiredAntiAffinity, t)
			}
			for i := range pa.PreferredDuringSchedulingIgnoredDuringExecution {
				w := &pa.PreferredDuringSchedulingIgnoredDuringExecution[i]
				t, err := p.compileTerm(&w.PodAffinityTerm, w.Weight)
				if err != nil {
					return nil, err
				}
				p.preferredAntiAffinity = append(p.preferredAntiAffinity, t)
			}
		}
	}

	for i := range pod.Spec.TopologySpreadConstraints {
		c := &pod.Spec.TopologySpreadConstraints[i]
		sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
		if err != nil {
			return nil, fmt.Errorf("compile topology spread selector: %w", err)
		}
		// matchLabelKeys narrows the selector to pods that share the
		// incoming pod's values for those keys (one revision of a rollout,
		// typically). Keys the pod lacks are ignored.
		for _, k := range c.MatchLabelKeys {
			if v, ok := pod.Labels[k]; ok {
				r, err := labels.NewRequirement(k, selection.In, []string{v})
				if err != nil {
					return nil, fmt.Errorf("compile matchLabelKeys: %w", err)
				}
				sel = sel.Add(*r)
			}
		}
		sc := spreadConstraint{
			maxSkew: c.MaxSkew, key: c.TopologyKey, selector: sel, minDomains: 1,
			doNotSchedule: c.WhenUnsatisfiable != corev1.ScheduleAnyway,
			honorAffinity: c.NodeAffinityPolicy == nil || *c.NodeAffinityPolicy == corev1.NodeInclusionPolicyHonor,
			honorTaints:   c.NodeTaintsPolicy != nil && *c.NodeTaintsPolicy == corev1.NodeInclusionPolicyHonor,
		}
		if c.MinDomains != nil && *c.MinDomains > 0 {
			sc.minDomains = *c.MinDomains
		}
		p.spread = append(p.spread, sc)
	}
	return p, nil
}

func (p *PodInfo) addPorts(c *corev1.Container) {
	for _, cp := range c.Ports {
		if cp.HostPort <= 0 {
			continue
		}
		hp := hostPort{ip: cp.HostIP, protocol: cp.Protocol, port: cp.HostPort}
		if hp.ip == "" {
			hp.ip = "0.0.0.0"
		}
		if hp.protocol == "" {
			hp.protocol = corev1.ProtocolTCP
		}
		p.Ports = append(p.Ports, hp)
	}
}

// compileTerm compiles a pod (anti-)affinity term of p. Without namespaces
// and namespaceSelector a term covers the pod's own namespace.
// matchLabelKeys and mismatchLabelKeys are folded into the selector, which
// is idempotent if the API server already did it.
func (p *PodInfo) compileTerm(t *corev1.PodAffinityTerm, weight int32) (affinityTerm, error) {
	sel, err := metav1.LabelSelectorAsSelector(t.LabelSelector)
	if err != nil {
		return affinityTerm{}, fmt.Errorf("compile pod affinity selector: %w", err)
	}
	if t.LabelSelector != nil {
		for _, k := range t.MatchLabelKeys {
			if v, ok := p.Labels[k]; ok {
				r, err := labels.NewRequirement(k, selection.In, []string{v})
				if err != nil {
					return affinityTerm{}, fmt.Errorf("compile matchLabelKeys: %w", err)
				}
				sel = sel.Add(*r)
			}
		}
		for _, k := range t.MismatchLabelKeys {
			if v, ok := p.Labels[k]; ok {
				r, err := labels.NewRequirement(k, selection.NotIn, []string{v})
				if err != nil {
					return affinityTerm{}, fmt.Errorf("compile mismatchLabelKeys: %w", err)
				}
				sel = sel.Add(*r)
			}
		}
	}
	at := affinityTerm{selector: sel, topologyKey: t.TopologyKey, weight: weight, namespaces: map[string]struct{}{}}
	for _, ns := range t.Namespaces {
		at.namespaces[ns] = struct{}{}
	}
	if t.NamespaceSelector != nil {
		nss, err := metav1.LabelSelectorAsSelector(t.NamespaceSelector)
		if err != nil {
			return affinityTerm{}, fmt.Errorf("compile namespace selector: %w", err)
		}
		at.nsSelector = nss
	}
	if len(t.Namespaces) == 0 && t.NamespaceSelector == nil {
		at.namespaces[p.Namespace] = struct{}{}
	}
	at.id = internTerm(&at)
	return at, nil
}

// normalizedImage gives an image reference without tag or digest the
// implicit ":latest", as node status reports it.
func normalizedImage(name string) string {
	if strings.LastIndex(name, ":") <= strings.LastIndex(name, "/") && !strings.Contains(name, "@") {
		return name + ":latest"
	}
	return name
}

// ---- node selectors ----

type nodeReq struct {
	key    string
	op     corev1.NodeSelectorOperator
	values []string
	num    int64
	field  bool
}

type nodeTerm struct{ reqs []nodeReq }

type weightedNodeTerm struct {
	term   nodeTerm
	weight int32
}

// nodeSelector is a compiled list of NodeSelectorTerms (ORed).
type nodeSelector struct{ terms []nodeTerm }

func compileNodeSelector(terms []corev1.NodeSelectorTerm) (*nodeSelector, error) {
	ns := &nodeSelector{}
	for _, t := range terms {
		ct, err := compileNodeTerm(t)
		if err != nil {
			return nil, err
		}
		ns.terms = append(ns.terms, ct)
	}
	return ns, nil
}

func compileNodeTerm(t corev1.NodeSelectorTerm) (nodeTerm, error) {
	var ct nodeTerm
	for _, e := range t.MatchExpressions {
		r := nodeReq{key: e.Key, op: e.Operator, values: e.Values}
		switch e.Operator {
		case corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt:
			if len(e.Values) != 1 {
				return ct, fmt.Errorf("operator %s needs exactly one value, got %d", e.Operator, len(e.Values))
			}
			n, err := strconv.ParseInt(e.Values[0], 10, 64)
			if err != nil {
				return ct, fmt.Errorf("parse %s value %q: %w", e.Operator, e.Values[0], err)
			}
			r.num = n
		case corev1.NodeSelectorOpIn, corev1.NodeSelectorOpNotIn, corev1.NodeSelectorOpExists, corev1.NodeSelectorOpDoesNotExist:
		default:
			return ct, fmt.Errorf("unknown node selector operator %q", e.Operator)
		}
		ct.reqs = append(ct.reqs, r)
	}
	for _, f := range t.MatchFields {
		if f.Key != "metadata.name" {
			return ct, fmt.Errorf("unsupported node field selector key %q", f.Key)
		}
		if f.Operator != corev1.NodeSelectorOpIn && f.Operator != corev1.NodeSelectorOpNotIn {
			return ct, fmt.Errorf("unsupported node field selector operator %q", f.Operator)
		}
		ct.reqs = append(ct.reqs, nodeReq{key: f.Key, op: f.Operator, values: f.Values, field: true})
	}
	return ct, nil
}

// matches: a term without requirements selects no node, as upstream.
func (t *nodeTerm) matches(name string, l map[string]string) bool {
	if len(t.reqs) == 0 {
		return false
	}
	for i := range t.reqs {
		if !t.reqs[i].matches(name, l) {
			return false
		}
	}
	return true
}

func (r *nodeReq) matches(name string, l map[string]string) bool {
	var v string
	var ok bool
	if r.field {
		v, ok = name, true
	} else {
		v, ok = l[r.key]
	}
	switch r.op {
	case corev1.NodeSelectorOpIn:
		return ok && contains(r.values, v)
	case corev1.NodeSelectorOpNotIn:
		return !ok || !contains(r.values, v)
	case corev1.NodeSelectorOpExists:
		return ok
	case corev1.NodeSelectorOpDoesNotExist:
		return !ok
	case corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt:
		if !ok {
			return false
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return false
		}
		if r.op == corev1.NodeSelectorOpGt {
			return n > r.num
		}
		return n < r.num
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (ns *nodeSelector) matches(name string, l map[string]string) bool {
	for i := range ns.terms {
		if ns.terms[i].matches(name, l) {
			return true
		}
	}
	return false
}

// matchesNodeSelectorAndAffinity is the NodeAffinity filter's test:
// spec.nodeSelector and required node affinity both hold.
func (p *PodInfo) matchesNodeSelectorAndAffinity(n *NodeInfo) bool {
	for k, v := range p.nodeSelector {
		if lv, ok := n.Labels[k]; !ok || lv != v {
			return false
		}
	}
	return p.requiredNodeAffinity == nil || p.requiredNodeAffinity.matches(n.Name, n.Labels)
}

// labelKey is a canonical string for a namespace and label set; pods that
// share it share a labelGroup.
func labelKey(ns string, l map[string]string) string {
	keys := make([]string, 0, len(l))
	n := len(ns) + 1
	for k, v := range l {
		keys = append(keys, k)
		n += len(k) + len(v) + 2
	}
	sort.Strings(keys)
	var b strings.Builder
	b.Grow(n)
	b.WriteString(ns)
	b.WriteByte(0)
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(l[k])
		b.WriteByte(0)
	}
	return b.String()
}
