package scheduler

import (
	"math"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
)

const maxNodeScore = 100

// Weights of the default profile's scores.
const (
	weightTaint        = 3
	weightNodeAffinity = 2
	weightSpread       = 2
	weightInterPod     = 2
	weightFit          = 1
	weightBalanced     = 1
	weightImage        = 1
)

// Image locality thresholds, as upstream: images under 23 MB do not
// matter, and a container's worth saturates at 1000 MB.
const (
	mb                   = 1024 * 1024
	imageMinThreshold    = 23 * mb
	imageMaxPerContainer = 1000 * mb
)

// scoreNodes adds every score plugin's weighted, normalized score of each
// feasible node to total.
func (d *Decider) scoreNodes(s *Snapshot, p *PodInfo, feasible []*NodeInfo, total []int64) {
	raw := d.raw[:len(feasible)]

	for i, n := range feasible {
		total[i] = weightFit * leastAllocated(p, n)
	}
	if p.Req.MilliCPU != 0 || p.Req.Memory != 0 {
		for i, n := range feasible {
			total[i] += weightBalanced * balancedAllocation(p, n)
		}
	}
	if len(s.imageNodes) > 0 && len(p.images) > 0 {
		for i, n := range feasible {
			total[i] += weightImage * imageLocality(s, p, n)
		}
	}

	// TaintToleration: fewer intolerable PreferNoSchedule taints is better.
	anyPrefer := false
	for i, n := range feasible {
		raw[i] = countPreferNoSchedule(p, n)
		anyPrefer = anyPrefer || raw[i] > 0
	}
	if anyPrefer {
		normalize(raw, true)
		for i := range feasible {
			total[i] += weightTaint * raw[i]
		}
	}
	// With no such taint anywhere every node gets the same maximum, which
	// cannot change the choice; it is left out to save the work.

	if len(p.preferredNodeAffinity) > 0 {
		for i, n := range feasible {
			var sum int64
			for j := range p.preferredNodeAffinity {
				if p.preferredNodeAffinity[j].term.matches(n.Name, n.Labels) {
					sum += int64(p.preferredNodeAffinity[j].weight)
				}
			}
			raw[i] = sum
		}
		normalize(raw, false)
		for i := range feasible {
			total[i] += weightNodeAffinity * raw[i]
		}
	}

	if scoreSpread(s, p, feasible, raw) {
		for i := range feasible {
			total[i] += weightSpread * raw[i]
		}
	}

	if scoreInterPod(s, p, feasible, raw) {
		for i := range feasible {
			total[i] += weightInterPod * raw[i]
		}
	}
}

// normalize scales raw scores to 0..maxNodeScore against the largest;
// reverse makes the smallest best.
func normalize(raw []int64, reverse bool) {
	var top int64
	for _, v := range raw {
		top = max(top, v)
	}
	for i, v := range raw {
		if top == 0 {
			if reverse {
				raw[i] = maxNodeScore
			}
			continue
		}
		v = maxNodeScore * v / top
		if reverse {
			v = maxNodeScore - v
		}
		raw[i] = v
	}
}

// leastAllocated favours nodes with more room left after the pod, cpu and
// memory weighted equally, counting unrequested resources at the defaults.
func leastAllocated(p *PodInfo, n *NodeInfo) int64 {
	var sum, weights int64
	if a := n.Allocatable.MilliCPU; a > 0 {
		sum += leastRequested(n.NonZeroRequested.MilliCPU+p.NonZero.MilliCPU, a)
		weights++
	}
	if a := n.Allocatable.Memory; a > 0 {
		sum += leastRequested(n.NonZeroRequested.Memory+p.NonZero.Memory, a)
		weights++
	}
	if weights == 0 {
		return 0
	}
	return sum / weights
}

func leastRequested(requested, capacity int64) int64 {
	if requested > capacity {
		return 0
	}
	return (capacity - requested) * maxNodeScore / capacity
}

// balancedAllocation favours nodes whose cpu and memory would be used in
// equal proportion.
func balancedAllocation(p *PodInfo, n *NodeInfo) int64 {
	var f [2]float64
	k := 0
	if a := n.Allocatable.MilliCPU; a > 0 {
		f[k] = min(float64(n.Requested.MilliCPU+p.Req.MilliCPU)/float64(a), 1)
		k++
	}
	if a := n.Allocatable.Memory; a > 0 {
		f[k] = min(float64(n.Requested.Memory+p.Req.Memory)/float64(a), 1)
		k++
	}
	std := 0.0
	if k == 2 {
		std = math.Abs((f[0] - f[1]) / 2)
	}
	return int64((1 - std) * maxNodeScore)
}

// imageLocality favours nodes that already have the pod's images, each
// image weighted by its size and how widely it is spread (an image on
// every node is no reason to pick one).
func imageLocality(s *Snapshot, p *PodInfo, n *NodeInfo) int64 {
	if len(n.images) == 0 {
		return 0
	}
	var sum int64
	total := float64(len(s.nodes))
	for _, img := range p.images {
		if size, ok := n.images[img]; ok {
			sum += int64(float64(size) * float64(s.imageNodes[img]) / total)
		}
	}
	maxThreshold := int64(imageMaxPerContainer) * int64(p.numContainers)
	sum = max(sum, imageMinThreshold)
	sum = min(sum, maxThreshold)
	return maxNodeScore * (sum - imageMinThreshold) / (maxThreshold - imageMinThreshold)
}

func countPreferNoSchedule(p *PodInfo, n *NodeInfo) int64 {
	var c int64
	for i := range n.taints {
		t := &n.taints[i]
		if t.Effect != corev1.TaintEffectPreferNoSchedule {
			continue
		}
		tolerated := false
		for j := range p.tolerations {
			tol := &p.tolerations[j]
			if (tol.Effect == "" || tol.Effect == corev1.TaintEffectPreferNoSchedule) && tol.ToleratesTaint(logr.Discard(), t, false) {
				tolerated = true
				break
			}
		}
		if !tolerated {
			c++
		}
	}
	return c
}

// scoreInterPod is InterPodAffinity's score: per topology domain, the
// weights of the incoming pod's preferred terms that existing pods
// satisfy (anti-affinity subtracts), plus the existing pods' required
// affinity (weight 1) and preferred terms that the incoming pod satisfies.
// Normalized min..max to 0..100.
func scoreInterPod(s *Snapshot, p *PodInfo, feasible []*NodeInfo, raw []int64) bool {
	hasOwn := len(p.preferredAffinity)+len(p.preferredAntiAffinity) > 0
	if !hasOwn && len(s.podsWithAffinity) == 0 {
		return false
	}
	type keyScores struct {
		topo   *topoIndex
		scores []int64
	}
	var byKey []keyScores
	slot := func(key string) *keyScores {
		for i := range byKey {
			if byKey[i].topo == s.topo[key] {
				return &byKey[i]
			}
		}
		t := s.topology(key)
		byKey = append(byKey, keyScores{topo: t, scores: make([]int64, len(t.names))})
		return &byKey[len(byKey)-1]
	}
	add := func(key string, n *NodeInfo, w int64) {
		ks := slot(key)
		if d := ks.topo.domain(n); d >= 0 {
			ks.scores[d] += w
		}
	}
	nsl := s.nsLabels(p.Namespace)
	if hasOwn {
		terms := resolveNamespaces(s, p.preferredAffinity)
		for i := range terms {
			t := &terms[i]
			forEachGroup(s, t, func(g *labelGroup) {
				if t.selector.Matches(g.labels) {
					for n, c := range g.nodes {
						add(t.topologyKey, n, int64(t.weight)*int64(c.all))
					}
				}
			})
		}
		terms = resolveNamespaces(s, p.preferredAntiAffinity)
		for i := range terms {
			t := &terms[i]
			forEachGroup(s, t, func(g *labelGroup) {
				if t.selector.Matches(g.labels) {
					for n, c := range g.nodes {
						add(t.topologyKey, n, -int64(t.weight)*int64(c.all))
					}
				}
			})
		}
	}
	for _, e := range s.podsWithAffinity {
		for i := range e.requiredAffinity {
			if t := &e.requiredAffinity[i]; t.matches(p.Namespace, p.Labels, nsl) {
				add(t.topologyKey, e.node, 1)
			}
		}
		for i := range e.preferredAffinity {
			if t := &e.preferredAffinity[i]; t.matches(p.Namespace, p.Labels, nsl) {
				add(t.topologyKey, e.node, int64(t.weight))
			}
		}
		for i := range e.preferredAntiAffinity {
			if t := &e.preferredAntiAffinity[i]; t.matches(p.Namespace, p.Labels, nsl) {
				add(t.topologyKey, e.node, -int64(t.weight))
			}
		}
	}
	if len(byKey) == 0 {
		return false
	}
	var lo, hi int64 = math.MaxInt64, math.MinInt64
	for j, n := range feasible {
		var v int64
		for i := range byKey {
			if d := byKey[i].topo.domain(n); d >= 0 {
				v += byKey[i].scores[d]
			}
		}
		raw[j] = v
		lo, hi = min(lo, v), max(hi, v)
	}
	for j := range feasible {
		if hi-lo > 0 {
			raw[j] = maxNodeScore * (raw[j] - lo) / (hi - lo)
		} else {
			raw[j] = 0
		}
	}
	return true
}
