package scheduler

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// Snapshot is the scheduler's view of the cluster. It is updated in place
// by the one goroutine that also makes decisions, so it never needs
// copying; derived indexes (topology domains, label groups) are kept up to
// date incrementally or rebuilt lazily when their generation is stale.
//
// A Snapshot is not safe for concurrent use.
type Snapshot struct {
	nodes      []*NodeInfo
	nodeByName map[string]*NodeInfo
	pods       map[types.UID]*PodInfo
	// nominated holds pending pods that have status.nominatedNodeName.
	nominated map[types.UID]*PodInfo

	// nodeGen changes whenever the node list or a node's labels change;
	// topology indexes built at another generation are rebuilt.
	nodeGen uint64
	topo    map[string]*topoIndex

	// groups indexes assigned pods by namespace and exact label set.
	// Inter-pod affinity and topology spread match selectors against a
	// group once instead of against every pod: replicas of one workload
	// share labels, so there are far fewer groups than pods.
	groups map[string]map[string]*labelGroup

	// podsWithAffinity holds pods with terms the inter-pod score reads
	// (required affinity, preferred affinity or anti-affinity).
	podsWithAffinity     []*PodInfo
	podsWithRequiredAnti []*PodInfo
	// antiByTerm aggregates the required anti-affinity terms of assigned
	// pods by term id, counted per node, so that a decision matches each
	// distinct term against the incoming pod once.
	antiByTerm map[int32]*antiAgg

	imageNodes map[string]int

	namespaces map[string]labels.Set
	pvcs       map[string]*corev1.PersistentVolumeClaim
	pvs        map[string]*corev1.PersistentVolume
	classes    map[string]*storagev1.StorageClass
	pdbs       map[string]*pdbInfo
}

// NewSnapshot returns an empty snapshot.
func NewSnapshot() *Snapshot {
	return &Snapshot{
		nodeByName: map[string]*NodeInfo{},
		pods:       map[types.UID]*PodInfo{},
		nominated:  map[types.UID]*PodInfo{},
		topo:       map[string]*topoIndex{},
		groups:     map[string]map[string]*labelGroup{},
		imageNodes: map[string]int{},
		antiByTerm: map[int32]*antiAgg{},
		namespaces: map[string]labels.Set{},
		pvcs:       map[string]*corev1.PersistentVolumeClaim{},
		pvs:        map[string]*corev1.PersistentVolume{},
		classes:    map[string]*storagev1.StorageClass{},
		pdbs:       map[string]*pdbInfo{},
	}
}

// NumNodes is the number of live nodes.
func (s *Snapshot) NumNodes() int { return len(s.nodes) }

// Nodes returns the live nodes; the slice must not be modified.
func (s *Snapshot) Nodes() []*NodeInfo { return s.nodes }

// Node returns the named node, or nil.
func (s *Snapshot) Node(name string) *NodeInfo {
	if n := s.nodeByName[name]; n != nil && n.idx >= 0 {
		return n
	}
	return nil
}

// Pod returns an assigned or assumed pod by UID.
func (s *Snapshot) Pod(uid types.UID) *PodInfo { return s.pods[uid] }

// NumPods is the number of assigned and assumed pods.
func (s *Snapshot) NumPods() int { return len(s.pods) }

// Change bits a node update reports, for requeueing unschedulable pods.
const (
	nodeChangedAllocatable eventMask = evNodeAllocatable
	nodeChangedLabels      eventMask = evNodeLabel
	nodeChangedTaints      eventMask = evNodeTaint
)

// SetNode adds or updates a node and tells what changed in a way that can
// make pending pods schedulable.
func (s *Snapshot) SetNode(node *corev1.Node) eventMask {
	n := s.nodeByName[node.Name]
	if n == nil {
		n = newNodeInfo(node.Name)
		s.nodeByName[node.Name] = n
	}
	if n.idx < 0 {
		n.setNode(node)
		n.idx = len(s.nodes)
		s.nodes = append(s.nodes, n)
		s.nodeGen++
		s.addImages(n, 1)
		return evNodeAdd
	}
	old := n.Node
	oldAlloc := n.Allocatable
	oldTaints, oldUnsched := n.taints, n.unschedulable
	s.addImages(n, -1)
	n.setNode(node)
	s.addImages(n, 1)
	var m eventMask
	if !maps.Equal(old.Labels, node.Labels) {
		s.nodeGen++
		m |= nodeChangedLabels
	}
	if allocGrew(&oldAlloc, &n.Allocatable) {
		m |= nodeChangedAllocatable
	}
	if oldUnsched != n.unschedulable || !slices.EqualFunc(oldTaints, n.taints, func(a, b corev1.Taint) bool {
		return a.Key == b.Key && a.Value == b.Value && a.Effect == b.Effect
	}) {
		m |= nodeChangedTaints
	}
	return m
}

func allocGrew(a, b *Resources) bool {
	if b.MilliCPU > a.MilliCPU || b.Memory > a.Memory || b.EphemeralStorage > a.EphemeralStorage || b.Pods > a.Pods {
		return true
	}
	for k, v := range b.Scalar {
		if v > a.Scalar[k] {
			return true
		}
	}
	return false
}

func (s *Snapshot) addImages(n *NodeInfo, d int) {
	for name := range n.images {
		s.imageNodes[name] += d
		if s.imageNodes[name] <= 0 {
			delete(s.imageNodes, name)
		}
	}
}

// RemoveNode takes a node out of the schedulable set. Its pods stay
// counted until they are removed themselves.
func (s *Snapshot) RemoveNode(name string) {
	n := s.nodeByName[name]
	if n == nil || n.idx < 0 {
		return
	}
	s.addImages(n, -1)
	last := len(s.nodes) - 1
	s.nodes[n.idx] = s.nodes[last]
	s.nodes[n.idx].idx = n.idx
	s.nodes[last] = nil
	s.nodes = s.nodes[:last]
	n.idx = -1
	n.Node = nil
	s.nodeGen++
	if len(n.Pods) == 0 && len(n.nominated) == 0 {
		delete(s.nodeByName, name)
	}
}

// AddPod counts p on the named node (which need not be known yet).
// assumed marks a pod whose binding is not confirmed.
func (s *Snapshot) AddPod(p *PodInfo, nodeName string, assumed bool) {
	if old := s.pods[p.UID]; old != nil {
		s.RemovePod(p.UID)
	}
	n := s.nodeByName[nodeName]
	if n == nil {
		n = newNodeInfo(nodeName)
		s.nodeByName[nodeName] = n
	}
	p.assumed = assumed
	s.pods[p.UID] = p
	n.addPod(p)
	s.groupAdd(p, n)
	for i := range p.requiredAntiAffinity {
		t := &p.requiredAntiAffinity[i]
		a := s.antiByTerm[t.id]
		if a == nil {
			a = &antiAgg{term: t, nodes: map[*NodeInfo]int32{}}
			s.antiByTerm[t.id] = a
		}
		a.nodes[n]++
		a.total++
	}
	if p.hasScoringTerms() {
		p.affPos = len(s.podsWithAffinity)
		s.podsWithAffinity = append(s.podsWithAffinity, p)
	}
	if len(p.requiredAntiAffinity) > 0 {
		p.antiPos = len(s.podsWithRequiredAnti)
		s.podsWithRequiredAnti = append(s.podsWithRequiredAnti, p)
	}
}

// RemovePod stops counting the pod with uid; it returns the removed pod.
func (s *Snapshot) RemovePod(uid types.UID) *PodInfo {
	p := s.pods[uid]
	if p == nil {
		return nil
	}
	delete(s.pods, uid)
	n := p.node
	n.removePod(p)
	s.groupRemove(p, n)
	for i := range p.requiredAntiAffinity {
		t := &p.requiredAntiAffinity[i]
		if a := s.antiByTerm[t.id]; a != nil {
			if a.nodes[n]--; a.nodes[n] <= 0 {
				delete(a.nodes, n)
			}
			if a.total--; a.total <= 0 {
				delete(s.antiByTerm, t.id)
			}
		}
	}
	if p.affPos >= 0 {
		s.podsWithAffinity = removeAt(s.podsWithAffinity, p.affPos, func(q *PodInfo, i int) { q.affPos = i })
		p.affPos = -1
	}
	if p.antiPos >= 0 {
		s.podsWithRequiredAnti = removeAt(s.podsWithRequiredAnti, p.antiPos, func(q *PodInfo, i int) { q.antiPos = i })
		p.antiPos = -1
	}
	p.node = nil
	if n.idx < 0 && len(n.Pods) == 0 && len(n.nominated) == 0 {
		delete(s.nodeByName, n.Name)
	}
	return p
}

func removeAt(list []*PodInfo, i int, setPos func(*PodInfo, int)) []*PodInfo {
	last := len(list) - 1
	list[i] = list[last]
	setPos(list[i], i)
	list[last] = nil
	return list[:last]
}

// ConfirmPod replaces the object of an assigned pod whose binding the
// informer reported. Only when node, labels and termination state are
// unchanged can the counts stay as they are; otherwise the pod is counted
// again from scratch.
func (s *Snapshot) ConfirmPod(pod *corev1.Pod, build func() (*PodInfo, error)) error {
	if p := s.pods[pod.UID]; p != nil && p.node != nil && p.node.Name == pod.Spec.NodeName &&
		(pod.DeletionTimestamp != nil) == p.terminating && maps.Equal(p.Pod.Labels, pod.Labels) &&
		samePodSpecForScheduling(p.Pod, pod) {
		p.Pod = pod
		p.assumed = false
		if pod.Status.StartTime != nil {
			p.startTime = pod.Status.StartTime.Time
		}
		return nil
	}
	p, err := build()
	if err != nil {
		return err
	}
	s.AddPod(p, pod.Spec.NodeName, false)
	return nil
}

// samePodSpecForScheduling compares the parts of a bound pod's spec the
// snapshot derives counts from and that may change after binding
// (resources under in-place resize).
func samePodSpecForScheduling(a, b *corev1.Pod) bool {
	if len(a.Spec.Containers) != len(b.Spec.Containers) {
		return false
	}
	for i := range a.Spec.Containers {
		ra, rb := a.Spec.Containers[i].Resources, b.Spec.Containers[i].Resources
		if !resourceListEqual(ra.Requests, rb.Requests) || !resourceListEqual(ra.Limits, rb.Limits) {
			return false
		}
	}
	return true
}

func resourceListEqual(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Cmp(w) != 0 {
			return false
		}
	}
	return true
}

// SetNominated records that pending pod p was promised its
// nominatedNode; an empty nominatedNode clears the promise.
func (s *Snapshot) SetNominated(p *PodInfo) {
	s.ClearNominated(p.UID)
	if p.nominatedNode == "" {
		return
	}
	n := s.nodeByName[p.nominatedNode]
	if n == nil {
		n = newNodeInfo(p.nominatedNode)
		s.nodeByName[p.nominatedNode] = n
	}
	n.addNominated(p)
	s.nominated[p.UID] = p
}

// ClearNominated forgets the promise made to the pod with uid.
func (s *Snapshot) ClearNominated(uid types.UID) {
	p := s.nominated[uid]
	if p == nil {
		return
	}
	delete(s.nominated, uid)
	if n := s.nodeByName[p.nominatedNode]; n != nil {
		n.removeNominated(p)
		if n.idx < 0 && len(n.Pods) == 0 && len(n.nominated) == 0 {
			delete(s.nodeByName, n.Name)
		}
	}
}

// SetNamespace records a namespace's labels.
func (s *Snapshot) SetNamespace(ns *corev1.Namespace) {
	l := labels.Set{}
	maps.Copy(l, ns.Labels)
	l[corev1.LabelMetadataName] = ns.Name
	s.namespaces[ns.Name] = l
}

// RemoveNamespace forgets a namespace.
func (s *Snapshot) RemoveNamespace(name string) { delete(s.namespaces, name) }

// nsLabels returns a namespace's labels; a namespace not seen yet has only
// its automatic name label.
func (s *Snapshot) nsLabels(ns string) labels.Set {
	if l, ok := s.namespaces[ns]; ok {
		return l
	}
	return labels.Set{corev1.LabelMetadataName: ns}
}

// SetPVC, SetPV and SetStorageClass record storage objects; the Remove
// forms forget them.
func (s *Snapshot) SetPVC(c *corev1.PersistentVolumeClaim) { s.pvcs[c.Namespace+"/"+c.Name] = c }

// RemovePVC forgets a claim.
func (s *Snapshot) RemovePVC(ns, name string) { delete(s.pvcs, ns+"/"+name) }

// SetPV records a volume.
func (s *Snapshot) SetPV(v *corev1.PersistentVolume) { s.pvs[v.Name] = v }

// RemovePV forgets a volume.
func (s *Snapshot) RemovePV(name string) { delete(s.pvs, name) }

// SetStorageClass records a class.
func (s *Snapshot) SetStorageClass(c *storagev1.StorageClass) { s.classes[c.Name] = c }

// RemoveStorageClass forgets a class.
func (s *Snapshot) RemoveStorageClass(name string) { delete(s.classes, name) }

// pdbInfo is a compiled PodDisruptionBudget.
type pdbInfo struct {
	pdb      *policyv1.PodDisruptionBudget
	selector labels.Selector
}

// SetPDB records a PodDisruptionBudget.
func (s *Snapshot) SetPDB(p *policyv1.PodDisruptionBudget) {
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
	if err != nil || p.Spec.Selector == nil || sel.Empty() {
		// An empty or invalid selector covers no pod, as upstream's
		// preemption reads it.
		sel = labels.Nothing()
	}
	s.pdbs[p.Namespace+"/"+p.Name] = &pdbInfo{pdb: p, selector: sel}
}

// RemovePDB forgets a PodDisruptionBudget.
func (s *Snapshot) RemovePDB(ns, name string) { delete(s.pdbs, ns+"/"+name) }

// antiAgg is one distinct required anti-affinity term and how many
// assigned pods on each node carry it.
type antiAgg struct {
	term  *affinityTerm
	nodes map[*NodeInfo]int32
	total int32
}

// ---- label groups ----

type groupCount struct{ all, live int32 }

// labelGroup is the set of assigned pods with one namespace and one exact
// label set, counted per node. live excludes terminating pods, which
// topology spread does not count.
type labelGroup struct {
	key    string
	ns     string
	labels labels.Set
	nodes  map[*NodeInfo]*groupCount
	total  int
}

func (s *Snapshot) groupAdd(p *PodInfo, n *NodeInfo) {
	byNS := s.groups[p.Namespace]
	if byNS == nil {
		byNS = map[string]*labelGroup{}
		s.groups[p.Namespace] = byNS
	}
	key := labelKey("", p.Labels)
	g := byNS[key]
	if g == nil {
		g = &labelGroup{key: key, ns: p.Namespace, labels: p.Labels, nodes: map[*NodeInfo]*groupCount{}}
		byNS[key] = g
	}
	c := g.nodes[n]
	if c == nil {
		c = &groupCount{}
		g.nodes[n] = c
	}
	c.all++
	if !p.terminating {
		c.live++
	}
	g.total++
	p.group = g
}

func (s *Snapshot) groupRemove(p *PodInfo, n *NodeInfo) {
	g := p.group
	if g == nil {
		return
	}
	p.group = nil
	if c := g.nodes[n]; c != nil {
		c.all--
		if !p.terminating {
			c.live--
		}
		if c.all <= 0 {
			delete(g.nodes, n)
		}
	}
	g.total--
	if g.total <= 0 {
		delete(s.groups[g.ns], g.key)
		if len(s.groups[g.ns]) == 0 {
			delete(s.groups, g.ns)
		}
	}
}

// ---- topology domains ----

// topoIndex numbers the values of one node label (a topology key) so
// that per-domain counts are slices, not maps.
type topoIndex struct {
	gen      uint64
	domainOf []int32 // by node idx; -1 when the node lacks the label
	names    []string
	byName   map[string]int32
}

// topology returns the domain index of key, rebuilding it if nodes or
// their labels changed since it was built.
func (s *Snapshot) topology(key string) *topoIndex {
	t := s.topo[key]
	if t != nil && t.gen == s.nodeGen {
		return t
	}
	if t == nil {
		t = &topoIndex{}
		s.topo[key] = t
	}
	t.gen = s.nodeGen
	t.domainOf = slices.Grow(t.domainOf[:0], len(s.nodes))[:len(s.nodes)]
	t.names = t.names[:0]
	t.byName = make(map[string]int32, len(t.byName))
	for i, n := range s.nodes {
		v, ok := n.Labels[key]
		if !ok {
			t.domainOf[i] = -1
			continue
		}
		d, ok := t.byName[v]
		if !ok {
			d = int32(len(t.names))
			t.byName[v] = d
			t.names = append(t.names, v)
		}
		t.domainOf[i] = d
	}
	return t
}

// domain returns the domain of node n under t, or -1.
func (t *topoIndex) domain(n *NodeInfo) int32 {
	if n.idx < 0 || n.idx >= len(t.domainOf) {
		return -1
	}
	return t.domainOf[n.idx]
}
