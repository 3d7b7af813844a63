package scheduler

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
)

// Decider makes placement decisions over a Snapshot. It keeps buffers
// between calls to avoid allocating per pod, the round-robin start of the
// node search, and the random source that breaks ties. It is not safe for
// concurrent use; the loop owns one.
type Decider struct {
	// PercentageOfNodesToScore bounds the search once enough feasible
	// nodes are found: 0 is upstream's adaptive default (50% minus 1% per
	// 125 nodes, at least 5%, at least 100 nodes); 100 checks every node.
	PercentageOfNodesToScore int

	rnd       *rand.Rand
	nextStart int

	feasible []*NodeInfo
	total    []int64
	raw      []int64
	// codes[node idx] is the last decision's filter result per node, read
	// by Preempt.
	codes   []uint8
	reasons map[string]int
	v       verdict
	st      cycleState
}

// NewDecider returns a Decider whose ties are broken by a generator
// seeded with seed.
func NewDecider(seed uint64) *Decider {
	return &Decider{rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), reasons: map[string]int{}}
}

// Decision is the outcome for one pod.
type Decision struct {
	// Node is the chosen node; empty when the pod does not fit.
	Node string
	// Err explains why no node fits.
	Err *FitError
	// Volumes lists what to write for unbound claims after binding.
	Volumes []VolumeChoice
	// Evaluated and Feasible count the nodes filtered and accepted.
	Evaluated, Feasible int
}

// FitError is upstream's "0/N nodes are available" explanation.
type FitError struct {
	NumAllNodes int
	// PreFilterMsg is set when the pod was rejected before any node was
	// looked at (a missing claim, for instance).
	PreFilterMsg string
	// Reasons counts the nodes that gave each reason.
	Reasons map[string]int
	// PostFilterMsg is preemption's explanation, already prefixed.
	PostFilterMsg string
	// Helps lists the cluster changes that may make the pod fit.
	Helps eventMask
}

// Error renders the message the FailedScheduling event and the
// PodScheduled condition carry.
func (e *FitError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "0/%d nodes are available:", e.NumAllNodes)
	if e.PreFilterMsg != "" {
		fmt.Fprintf(&b, " %s.", e.PreFilterMsg)
	} else if h := histogram(e.Reasons); h != "" {
		fmt.Fprintf(&b, " %s.", h)
	}
	if e.PostFilterMsg != "" {
		fmt.Fprintf(&b, " %s.", strings.TrimSuffix(e.PostFilterMsg, "."))
	}
	return b.String()
}

// histogram renders "N reason" pairs sorted as strings, as upstream.
func histogram(reasons map[string]int) string {
	parts := make([]string, 0, len(reasons))
	for r, n := range reasons {
		parts = append(parts, fmt.Sprintf("%d %s", n, r))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// numFeasibleNodesToFind is how many feasible nodes are enough to stop
// searching.
func (d *Decider) numFeasibleNodesToFind(numNodes int) int {
	const minNodes, basePct, minPct = 100, 50, 5
	if numNodes < minNodes || d.PercentageOfNodesToScore >= 100 {
		return numNodes
	}
	pct := d.PercentageOfNodesToScore
	if pct <= 0 {
		pct = basePct - numNodes/125
		if pct < minPct {
			pct = minPct
		}
	}
	n := numNodes * pct / 100
	if n < minNodes {
		return minNodes
	}
	return n
}

// prepare computes the per-pod state of p, or the reason it fits nowhere.
func (d *Decider) prepare(s *Snapshot, p *PodInfo) (string, plugin) {
	d.st = cycleState{pod: p}
	vs, msg := newVolumeState(s, p)
	if msg != "" {
		return msg, plugVolume
	}
	d.st.volumes = vs
	d.st.spread = newSpreadState(s, p, true)
	d.st.affinity = newAffinityState(s, p)
	return "", plugNone
}

// Decide picks a node for p. It does not change the snapshot: assuming
// the pod onto the node is the caller's move.
func (d *Decider) Decide(s *Snapshot, p *PodInfo) Decision {
	n := len(s.nodes)
	d.codes = growUint8(d.codes, n)
	clear(d.reasons)
	if n == 0 {
		return Decision{Err: &FitError{Reasons: map[string]int{}, Helps: evNodeAdd}}
	}
	if msg, pl := d.prepare(s, p); msg != "" {
		for i := range d.codes {
			d.codes[i] = codeUnresolvable
		}
		return Decision{Err: &FitError{NumAllNodes: n, PreFilterMsg: msg, Helps: helpsAfter[pl] | evPVC}}
	}

	// A node preemption promised the pod is tried first and taken if it
	// fits, so the room made there is used.
	if p.nominatedNode != "" {
		if nn := s.Node(p.nominatedNode); nn != nil {
			d.filterNode(s, &d.st, nn, false, &d.v)
			if d.v.code == codeFeasible {
				return d.finish(s, p, nn, 1, 1)
			}
		}
	}

	want := d.numFeasibleNodesToFind(n)
	d.feasible = d.feasible[:0]
	var helps eventMask
	processed := 0
	for i := 0; i < n && len(d.feasible) < want; i++ {
		node := s.nodes[(d.nextStart+i)%n]
		processed++
		d.filterNode(s, &d.st, node, true, &d.v)
		d.codes[node.idx] = d.v.code
		if d.v.code == codeFeasible {
			d.feasible = append(d.feasible, node)
			continue
		}
		helps |= helpsAfter[d.v.plugin]
		for _, r := range d.v.reasons {
			d.reasons[r]++
		}
	}
	d.nextStart = (d.nextStart + processed) % n
	if len(d.feasible) == 0 {
		reasons := make(map[string]int, len(d.reasons))
		for k, v := range d.reasons {
			reasons[k] = v
		}
		return Decision{Err: &FitError{NumAllNodes: n, Reasons: reasons, Helps: helps}, Evaluated: processed}
	}
	if len(d.feasible) == 1 {
		return d.finish(s, p, d.feasible[0], processed, 1)
	}
	d.total = growInt64(d.total, len(d.feasible))
	d.raw = growInt64(d.raw, len(d.feasible))
	d.scoreNodes(s, p, d.feasible, d.total)
	return d.finish(s, p, d.pick(d.feasible, d.total), processed, len(d.feasible))
}

func (d *Decider) finish(s *Snapshot, p *PodInfo, n *NodeInfo, evaluated, feasible int) Decision {
	dec := Decision{Node: n.Name, Evaluated: evaluated, Feasible: feasible}
	if d.st.volumes != nil && len(d.st.volumes.unbound) > 0 {
		dec.Volumes = d.st.volumes.choices(n)
	}
	return dec
}

// pick returns a node with the highest score, uniformly at random among
// ties (reservoir sampling).
func (d *Decider) pick(nodes []*NodeInfo, scores []int64) *NodeInfo {
	best, seen := 0, 1
	for i := 1; i < len(nodes); i++ {
		switch {
		case scores[i] > scores[best]:
			best, seen = i, 1
		case scores[i] == scores[best]:
			seen++
			if d.rnd.IntN(seen) == 0 {
				best = i
			}
		}
	}
	return nodes[best]
}

// Scores returns each feasible node's total score for p, for tests and
// debugging; it checks every node.
func (d *Decider) Scores(s *Snapshot, p *PodInfo) map[string]int64 {
	if msg, _ := d.prepare(s, p); msg != "" {
		return nil
	}
	d.feasible = d.feasible[:0]
	for _, n := range s.nodes {
		d.filterNode(s, &d.st, n, false, &d.v)
		if d.v.code == codeFeasible {
			d.feasible = append(d.feasible, n)
		}
	}
	d.total = growInt64(d.total, len(d.feasible))
	d.raw = growInt64(d.raw, len(d.feasible))
	d.scoreNodes(s, p, d.feasible, d.total)
	out := make(map[string]int64, len(d.feasible))
	for i, n := range d.feasible {
		out[n.Name] = d.total[i]
	}
	return out
}

func growInt64(b []int64, n int) []int64 {
	if cap(b) < n {
		return make([]int64, n, n*5/4+8)
	}
	b = b[:n]
	clear(b)
	return b
}

func growUint8(b []uint8, n int) []uint8 {
	if cap(b) < n {
		return make([]uint8, n, n*5/4+8)
	}
	b = b[:n]
	clear(b)
	return b
}
