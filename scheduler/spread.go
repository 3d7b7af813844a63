package scheduler

import (
	"math"
)

// spreadCounts holds, for one topology spread constraint, the matching pods
// per domain over the nodes the constraint counts.
type spreadCounts struct {
	c       *spreadConstraint
	topo    *topoIndex
	counts  []int32
	present []bool // domain has at least one counted node
	// eligible[node idx]: the node is counted for this constraint.
	eligible  []bool
	domains   int
	minMatch  int32
	selfMatch int32
}

// spreadState is PodTopologySpread's precomputation for one pod, for its
// DoNotSchedule (filter) or ScheduleAnyway (score) constraints.
type spreadState struct {
	s    *Snapshot
	pod  *PodInfo
	cons []spreadCounts
}

// newSpreadState counts the pods matching each constraint of p (hard or
// soft, per hard) over the nodes that constraint covers: nodes carrying
// every constraint's key that pass the node inclusion policies.
func newSpreadState(s *Snapshot, p *PodInfo, hard bool) *spreadState {
	var st *spreadState
	for i := range p.spread {
		c := &p.spread[i]
		if c.doNotSchedule != hard {
			continue
		}
		if st == nil {
			st = &spreadState{s: s, pod: p}
		}
		t := s.topology(c.key)
		sc := spreadCounts{c: c, topo: t, counts: make([]int32, len(t.names)), present: make([]bool, len(t.names)), eligible: make([]bool, len(s.nodes))}
		if c.selector.Matches(p.Labels) {
			sc.selfMatch = 1
		}
		st.cons = append(st.cons, sc)
	}
	if st == nil {
		return nil
	}
	nodeLimited := len(p.nodeSelector) > 0 || p.requiredNodeAffinity != nil
	for i, n := range s.nodes {
		all := true
		for j := range st.cons {
			if st.cons[j].topo.domainOf[i] < 0 {
				all = false
				break
			}
		}
		if !all {
			continue
		}
		for j := range st.cons {
			sc := &st.cons[j]
			if sc.c.honorAffinity && nodeLimited && !p.matchesNodeSelectorAndAffinity(n) {
				continue
			}
			if sc.c.honorTaints && untoleratedTaint(n.taints, p.tolerations) != nil {
				continue
			}
			sc.eligible[i] = true
			if d := sc.topo.domainOf[i]; !sc.present[d] {
				sc.present[d] = true
				sc.domains++
			}
		}
	}
	for _, g := range s.groups[p.Namespace] {
		for i := range st.cons {
			sc := &st.cons[i]
			if !sc.c.selector.Matches(g.labels) {
				continue
			}
			for n, cnt := range g.nodes {
				if n.idx >= 0 && sc.eligible[n.idx] {
					sc.counts[sc.topo.domainOf[n.idx]] += cnt.live
				}
			}
		}
	}
	st.recomputeMin()
	return st
}

func (st *spreadState) hasAllKeys(n *NodeInfo) bool {
	for i := range st.cons {
		if st.cons[i].topo.domain(n) < 0 {
			return false
		}
	}
	return true
}

func (st *spreadState) recomputeMin() {
	for i := range st.cons {
		sc := &st.cons[i]
		sc.minMatch = math.MaxInt32
		for d, ok := range sc.present {
			if ok && sc.counts[d] < sc.minMatch {
				sc.minMatch = sc.counts[d]
			}
		}
		if sc.minMatch == math.MaxInt32 {
			sc.minMatch = 0
		}
	}
}

// update adjusts the counts for pod e appearing on or leaving node n.
func (st *spreadState) update(e *PodInfo, n *NodeInfo, delta int32) {
	if e.Namespace != st.pod.Namespace || e.terminating || n.idx < 0 {
		return
	}
	changed := false
	for i := range st.cons {
		sc := &st.cons[i]
		if sc.eligible[n.idx] && sc.c.selector.Matches(e.Labels) {
			sc.counts[sc.topo.domainOf[n.idx]] += delta
			changed = true
		}
	}
	if changed {
		st.recomputeMin()
	}
}

// filter: placing the pod on n must keep every constraint's skew (its
// domain's count plus itself, minus the smallest domain's count) within
// maxSkew. With fewer domains than minDomains the minimum counts as 0.
func (st *spreadState) filter(p *PodInfo, n *NodeInfo) (uint8, string) {
	for i := range st.cons {
		sc := &st.cons[i]
		d := sc.topo.domain(n)
		if d < 0 {
			return codeUnresolvable, reasonSpreadLabel
		}
		minMatch := sc.minMatch
		if int32(sc.domains) < sc.c.minDomains {
			minMatch = 0
		}
		if sc.counts[d]+sc.selfMatch-minMatch > sc.c.maxSkew {
			return codeUnschedulable, reasonSpread
		}
	}
	return codeFeasible, ""
}

// scoreSpread fills raw with PodTopologySpread's score for the feasible
// nodes (ScheduleAnyway constraints) and normalizes it to 0..100: fewer
// matching pods in a node's domains scores higher. Nodes lacking a
// constraint's key score 0.
func scoreSpread(s *Snapshot, p *PodInfo, feasible []*NodeInfo, raw []int64) bool {
	st := newSpreadState(s, p, false)
	if st == nil {
		return false
	}
	weights := make([]float64, len(st.cons))
	seen := make([]bool, 0)
	for i := range st.cons {
		sc := &st.cons[i]
		seen = append(seen[:0], make([]bool, len(sc.topo.names))...)
		size := 0
		for _, n := range feasible {
			if !st.hasAllKeys(n) {
				continue
			}
			if d := sc.topo.domain(n); !seen[d] {
				seen[d] = true
				size++
			}
		}
		weights[i] = math.Log(float64(size + 2))
	}
	const ignored = -1
	var minScore, maxScore int64 = math.MaxInt64, 0
	for j, n := range feasible {
		if !st.hasAllKeys(n) {
			raw[j] = ignored
			continue
		}
		var score float64
		for i := range st.cons {
			sc := &st.cons[i]
			cnt := sc.counts[sc.topo.domain(n)]
			score += float64(cnt)*weights[i] + float64(sc.c.maxSkew-1)
		}
		v := int64(math.Round(score))
		raw[j] = v
		minScore = min(minScore, v)
		maxScore = max(maxScore, v)
	}
	for j := range feasible {
		switch {
		case raw[j] == ignored:
			raw[j] = 0
		case maxScore == 0:
			raw[j] = maxNodeScore
		default:
			raw[j] = maxNodeScore * (maxScore + minScore - raw[j]) / maxScore
		}
	}
	return true
}
