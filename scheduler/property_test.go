package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// randomCluster builds a snapshot of random nodes.
func randomCluster(r *rand.Rand, numNodes int) *Snapshot {
	s := NewSnapshot()
	for i := range numNodes {
		lbl := map[string]string{corev1.LabelHostname: fmt.Sprintf("n%d", i)}
		if r.IntN(8) != 0 {
			lbl["zone"] = fmt.Sprintf("z%d", r.IntN(3))
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i), Labels: lbl}}
		n.Status.Allocatable = corev1.ResourceList{
			corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(500+r.IntN(4000)), resource.DecimalSI),
			corev1.ResourceMemory: *resource.NewQuantity(int64(1+r.IntN(8))<<30, resource.BinarySI),
			corev1.ResourcePods:   *resource.NewQuantity(int64(2+r.IntN(20)), resource.DecimalSI),
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		if r.IntN(6) == 0 {
			n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Effect: corev1.TaintEffectNoSchedule}}
		}
		s.SetNode(n)
	}
	return s
}

func randomPod(r *rand.Rand, i int) *corev1.Pod {
	app := fmt.Sprintf("app%d", r.IntN(4))
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "default",
		UID: types.UID(fmt.Sprintf("uid-%d", i)), Labels: map[string]string{"app": app}}}
	p.Spec.Containers = []corev1.Container{{Name: "c", Image: "app", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(r.IntN(1500)), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(int64(r.IntN(2048))<<20, resource.BinarySI),
	}}}}
	if r.IntN(5) == 0 {
		p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
	switch r.IntN(4) {
	case 0:
		key := corev1.LabelHostname
		if r.IntN(3) == 0 {
			key = "zone"
		}
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{LabelSelector: sel, TopologyKey: key}}}}
	case 1:
		key := "zone"
		if r.IntN(2) == 0 {
			key = corev1.LabelHostname
		}
		p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: int32(1 + r.IntN(2)), TopologyKey: key, WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: sel}}
	}
	return p
}

type placed struct {
	pod  *corev1.Pod
	node *NodeInfo
}

// TestProperties schedules random pods on random clusters and checks the
// invariants no decision may break: allocatable is never exceeded,
// required anti-affinity holds in both directions, and a DoNotSchedule
// spread constraint's skew stays within maxSkew.
func TestProperties(t *testing.T) {
	cases := 300
	if testing.Short() {
		cases = 60
	}
	for c := range cases {
		r := rand.New(rand.NewPCG(uint64(c), 7))
		s := randomCluster(r, 3+r.IntN(25))
		d := NewDecider(uint64(c))
		var all []placed
		for i := range 20 + r.IntN(60) {
			pod := randomPod(r, i)
			pi, err := NewPodInfo(pod, nil)
			if err != nil {
				t.Fatal(err)
			}
			var before map[string]int
			var spreadKey string
			if len(pod.Spec.TopologySpreadConstraints) > 0 {
				spreadKey = pod.Spec.TopologySpreadConstraints[0].TopologyKey
				before = domainCounts(s, all, spreadKey, pod)
			}
			dec := d.Decide(s, pi)
			if dec.Err != nil {
				continue
			}
			n := s.Node(dec.Node)
			s.AddPod(pi, dec.Node, true)
			pod.Spec.NodeName = dec.Node
			all = append(all, placed{pod, n})
			if spreadKey != "" {
				checkSkew(t, c, pod, before, n.Labels[spreadKey])
			}
		}
		checkResources(t, c, s)
		checkAntiAffinity(t, c, all)
	}
}

func checkResources(t *testing.T, c int, s *Snapshot) {
	for _, n := range s.nodes {
		var cpu, mem int64
		for _, p := range n.Pods {
			cpu += p.Req.MilliCPU
			mem += p.Req.Memory
		}
		if cpu > n.Allocatable.MilliCPU || mem > n.Allocatable.Memory || int64(len(n.Pods)) > n.Allocatable.Pods {
			t.Errorf("case %d: node %s over-committed: cpu %d/%d mem %d/%d pods %d/%d", c, n.Name,
				cpu, n.Allocatable.MilliCPU, mem, n.Allocatable.Memory, len(n.Pods), n.Allocatable.Pods)
		}
	}
}

func checkAntiAffinity(t *testing.T, c int, all []placed) {
	for _, a := range all {
		if a.pod.Spec.Affinity == nil || a.pod.Spec.Affinity.PodAntiAffinity == nil {
			continue
		}
		for _, term := range a.pod.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			sel, _ := metav1.LabelSelectorAsSelector(term.LabelSelector)
			va, ok := a.node.Labels[term.TopologyKey]
			if !ok {
				continue
			}
			for _, b := range all {
				if b.pod == a.pod || !sel.Matches(labels.Set(b.pod.Labels)) {
					continue
				}
				if vb, ok := b.node.Labels[term.TopologyKey]; ok && vb == va {
					t.Errorf("case %d: %s (anti-affinity %v on %s) shares %s=%s with %s", c, a.pod.Name, term.LabelSelector.MatchLabels, a.node.Name, term.TopologyKey, va, b.pod.Name)
				}
			}
		}
	}
}

// domainCounts counts, by brute force, the placed pods matching pod's
// spread selector per domain of key, over the nodes the constraint covers.
func domainCounts(s *Snapshot, all []placed, key string, pod *corev1.Pod) map[string]int {
	counts := map[string]int{}
	for _, n := range s.nodes {
		if v, ok := n.Labels[key]; ok {
			counts[v] += 0
		}
	}
	sel, _ := metav1.LabelSelectorAsSelector(pod.Spec.TopologySpreadConstraints[0].LabelSelector)
	for _, p := range all {
		if v, ok := p.node.Labels[key]; ok && sel.Matches(labels.Set(p.pod.Labels)) {
			counts[v]++
		}
	}
	return counts
}

func checkSkew(t *testing.T, c int, pod *corev1.Pod, before map[string]int, domain string) {
	minCount := -1
	for _, v := range before {
		if minCount < 0 || v < minCount {
			minCount = v
		}
	}
	maxSkew := int(pod.Spec.TopologySpreadConstraints[0].MaxSkew)
	if got := before[domain] + 1 - minCount; got > maxSkew {
		t.Errorf("case %d: %s placed in %s=%s with skew %d > %d (counts before %v)", c, pod.Name,
			pod.Spec.TopologySpreadConstraints[0].TopologyKey, domain, got, maxSkew, before)
	}
}
