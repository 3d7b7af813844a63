package scheduler

import (
	"math"
	"sort"
	"time"
)

// Upstream's preemption messages.
const (
	msgPreemptNever         = "not eligible due to preemptionPolicy=Never."
	msgTerminatingNominee   = "not eligible due to a terminating pod on the nominated node."
	msgPreemptionNotHelpful = "Preemption is not helpful for scheduling"
	msgNoVictims            = "No preemption victims found for incoming pod"
)

// Preemption is the outcome of trying to make room for a pod.
type Preemption struct {
	// Node is where room will be made; empty when preemption cannot help.
	Node string
	// Victims are the pods to delete, most important first.
	Victims []*PodInfo
	// PDBViolations counts victims whose eviction breaks a budget.
	PDBViolations int
	// LosingNomination are lower-priority pods that were promised Node and
	// must give the promise up.
	LosingNomination []*PodInfo
	// Msg is the "preemption: ..." explanation when Node is empty.
	Msg string
}

type candidate struct {
	node       *NodeInfo
	victims    []*PodInfo
	violations int
}

// Preempt looks for a node where deleting lower-priority pods would let p
// fit, right after Decide failed for p (it reads that decision's
// per-node results). Victims are chosen as upstream: on each node remove
// every lower-priority pod, then give back as many as still leave room,
// PDB-protected ones first; among nodes prefer the fewest budget
// violations, then the lowest highest victim priority, the smallest
// priority sum, the fewest victims, and the most recently started
// highest-priority victims.
func (d *Decider) Preempt(s *Snapshot, p *PodInfo, fe *FitError) Preemption {
	if p.PreemptNever {
		return Preemption{Msg: "preemption: " + msgPreemptNever}
	}
	if p.nominatedNode != "" {
		if n := s.Node(p.nominatedNode); n != nil && d.codes[n.idx] != codeUnresolvable {
			for _, q := range n.Pods {
				if q.terminating && q.Priority < p.Priority {
					return Preemption{Msg: "preemption: " + msgTerminatingNominee}
				}
			}
		}
	}
	numNodes := len(s.nodes)
	var potential []*NodeInfo
	if fe.PreFilterMsg == "" {
		for _, n := range s.nodes {
			if d.codes[n.idx] == codeUnschedulable {
				potential = append(potential, n)
			}
		}
	}
	reasons := map[string]int{}
	notHelpful := func() Preemption {
		if left := numNodes - sumCounts(reasons); left > 0 {
			reasons[msgPreemptionNotHelpful] += left
		}
		e := &FitError{NumAllNodes: numNodes, Reasons: reasons}
		return Preemption{Msg: "preemption: " + e.Error()}
	}
	if len(potential) == 0 {
		return notHelpful()
	}
	if msg, _ := d.prepare(s, p); msg != "" {
		return notHelpful()
	}

	want := len(potential) / 10
	if want < 100 {
		want = 100
	}
	want = min(want, len(potential))
	offset := d.rnd.IntN(len(potential))
	var cands []candidate
	for i := 0; i < len(potential) && len(cands) < want; i++ {
		n := potential[(offset+i)%len(potential)]
		victims, violations, reason := d.selectVictims(s, p, n)
		if reason != "" {
			reasons[reason]++
			continue
		}
		cands = append(cands, candidate{node: n, victims: victims, violations: violations})
	}
	if len(cands) == 0 {
		return notHelpful()
	}
	best := pickCandidate(cands)
	out := Preemption{Node: best.node.Name, Victims: best.victims, PDBViolations: best.violations}
	for _, q := range best.node.nominated {
		if q.Priority < p.Priority && q.UID != p.UID {
			out.LosingNomination = append(out.LosingNomination, q)
		}
	}
	return out
}

func sumCounts(m map[string]int) int {
	t := 0
	for _, v := range m {
		t += v
	}
	return t
}

// selectVictims finds the fewest, least important pods on n whose removal
// lets p fit. It changes n and the cycle state while it works and puts
// everything back before returning. reason is set when no removal helps.
func (d *Decider) selectVictims(s *Snapshot, p *PodInfo, n *NodeInfo) (victims []*PodInfo, violations int, reason string) {
	var potential []*PodInfo
	for _, q := range n.Pods {
		if q.Priority < p.Priority {
			potential = append(potential, q)
		}
	}
	if len(potential) == 0 {
		return nil, 0, msgNoVictims
	}
	remove := func(q *PodInfo) {
		n.removePod(q)
		d.stUpdate(q, n, -1)
	}
	add := func(q *PodInfo) {
		n.addPod(q)
		d.stUpdate(q, n, 1)
	}
	for _, q := range potential {
		remove(q)
	}
	gone := make(map[*PodInfo]bool, len(potential))
	for _, q := range potential {
		gone[q] = true
	}
	defer func() {
		for _, q := range potential {
			if gone[q] {
				add(q)
			}
		}
	}()

	d.filterNode(s, &d.st, n, true, &d.v)
	if d.v.code != codeFeasible {
		if len(d.v.reasons) > 0 {
			return nil, 0, d.v.reasons[0]
		}
		return nil, 0, msgPreemptionNotHelpful
	}

	// Most important first: those are the ones most worth giving back.
	sort.SliceStable(potential, func(i, j int) bool { return moreImportant(potential[i], potential[j]) })
	violating, safe := splitByPDB(s, potential)
	reprieve := func(q *PodInfo) bool {
		add(q)
		gone[q] = false
		d.filterNode(s, &d.st, n, false, &d.v)
		if d.v.code == codeFeasible {
			return true
		}
		remove(q)
		gone[q] = true
		return false
	}
	for _, q := range violating {
		if !reprieve(q) {
			victims = append(victims, q)
			violations++
		}
	}
	for _, q := range safe {
		if !reprieve(q) {
			victims = append(victims, q)
		}
	}
	sort.SliceStable(victims, func(i, j int) bool { return moreImportant(victims[i], victims[j]) })
	return victims, violations, ""
}

func (d *Decider) stUpdate(q *PodInfo, n *NodeInfo, delta int32) {
	if d.st.affinity != nil {
		d.st.affinity.update(q, n, delta)
	}
	if d.st.spread != nil {
		d.st.spread.update(q, n, delta)
	}
}

// moreImportant orders pods by priority, then by age (older first).
func moreImportant(a, b *PodInfo) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	return a.startTime.Before(b.startTime)
}

// splitByPDB walks pods (most important first) and charges each to the
// budgets that cover it; a pod that takes a budget below zero allowed
// disruptions would violate it.
func splitByPDB(s *Snapshot, pods []*PodInfo) (violating, safe []*PodInfo) {
	if len(s.pdbs) == 0 {
		return nil, pods
	}
	allowed := make(map[*pdbInfo]int32, len(s.pdbs))
	for _, b := range s.pdbs {
		allowed[b] = b.pdb.Status.DisruptionsAllowed
	}
	for _, q := range pods {
		bad := false
		for _, b := range s.pdbs {
			if b.pdb.Namespace != q.Namespace || !b.selector.Matches(q.Labels) {
				continue
			}
			if _, already := b.pdb.Status.DisruptedPods[q.Name]; already {
				continue
			}
			allowed[b]--
			if allowed[b] < 0 {
				bad = true
			}
		}
		if bad {
			violating = append(violating, q)
		} else {
			safe = append(safe, q)
		}
	}
	return violating, safe
}

// pickCandidate applies upstream's order of preference.
func pickCandidate(cands []candidate) candidate {
	if len(cands) == 1 {
		return cands[0]
	}
	keep := func(score func(c *candidate) int64) {
		best := int64(math.MinInt64)
		var out []candidate
		for i := range cands {
			v := score(&cands[i])
			if v > best {
				best, out = v, out[:0]
			}
			if v == best {
				out = append(out, cands[i])
			}
		}
		cands = out
	}
	keep(func(c *candidate) int64 { return -int64(c.violations) })
	keep(func(c *candidate) int64 {
		if len(c.victims) == 0 {
			return math.MaxInt32 + 1
		}
		return -int64(c.victims[0].Priority)
	})
	keep(func(c *candidate) int64 {
		var sum int64
		for _, v := range c.victims {
			// Offset so that negative priorities still add up to more.
			sum += int64(v.Priority) + math.MaxInt32 + 1
		}
		return -sum
	})
	keep(func(c *candidate) int64 { return -int64(len(c.victims)) })
	keep(func(c *candidate) int64 {
		if len(c.victims) == 0 {
			return math.MaxInt64
		}
		top := c.victims[0].Priority
		earliest := time.Time{}
		for _, v := range c.victims {
			if v.Priority == top && (earliest.IsZero() || v.startTime.Before(earliest)) {
				earliest = v.startTime
			}
		}
		return earliest.UnixNano()
	})
	return cands[0]
}
