package scheduler

import (
	"k8s.io/apimachinery/pkg/labels"
)

// termCounts counts, per topology domain, the existing pods that match a
// term.
type termCounts struct {
	key    string
	topo   *topoIndex
	counts []int32
}

func newTermCounts(s *Snapshot, key string) termCounts {
	t := s.topology(key)
	return termCounts{key: key, topo: t, counts: make([]int32, len(t.names))}
}

func (tc *termCounts) add(n *NodeInfo, delta int32) {
	if d := tc.topo.domain(n); d >= 0 {
		tc.counts[d] += delta
	}
}

// affinityState is InterPodAffinity's precomputation for one pod.
type affinityState struct {
	s   *Snapshot
	pod *PodInfo
	// aff[i]: pods matching all required affinity terms, by the domains
	// of term i's key.
	aff        []termCounts
	affMatches int32
	selfMatch  bool
	// anti[i]: pods matching required anti-affinity term i.
	anti []termCounts
	// existing: pods whose own required anti-affinity terms match the
	// incoming pod, by the domains of each term's key.
	existing []termCounts
	nsLabels labels.Set
	// matched caches, by term id, whether an existing pod's anti-affinity
	// term matches the incoming pod: 0 unknown, 1 yes, 2 no.
	matched []int8
	// The incoming pod's terms with namespace selectors resolved.
	affTerms, antiTerms []affinityTerm
}

// resolveNamespaces turns a namespace selector of the incoming pod's term
// into an explicit list, as upstream does before matching: the namespaces
// that exist now are the ones that count.
func resolveNamespaces(s *Snapshot, terms []affinityTerm) []affinityTerm {
	out := terms
	for i := range terms {
		if terms[i].nsSelector == nil {
			continue
		}
		if &out[0] == &terms[0] {
			out = append([]affinityTerm(nil), terms...)
		}
		t := &out[i]
		nss := make(map[string]struct{}, len(t.namespaces))
		for ns := range t.namespaces {
			nss[ns] = struct{}{}
		}
		for ns, l := range s.namespaces {
			if t.nsSelector.Matches(l) {
				nss[ns] = struct{}{}
			}
		}
		// Namespaces that only exist through their pods count too.
		for ns := range s.groups {
			if t.nsSelector.Matches(s.nsLabels(ns)) {
				nss[ns] = struct{}{}
			}
		}
		t.namespaces = nss
		t.nsSelector = nil
	}
	return out
}

// forEachGroup calls fn for every label group in the namespaces of t.
func forEachGroup(s *Snapshot, t *affinityTerm, fn func(g *labelGroup)) {
	for ns := range t.namespaces {
		for _, g := range s.groups[ns] {
			fn(g)
		}
	}
}

func newAffinityState(s *Snapshot, p *PodInfo) *affinityState {
	if len(p.requiredAffinity) == 0 && len(p.requiredAntiAffinity) == 0 && len(s.antiByTerm) == 0 {
		return nil
	}
	st := &affinityState{s: s, pod: p, nsLabels: s.nsLabels(p.Namespace), matched: make([]int8, numTermIDs())}
	if len(p.requiredAffinity) > 0 {
		terms := resolveNamespaces(s, p.requiredAffinity)
		for i := range terms {
			st.aff = append(st.aff, newTermCounts(s, terms[i].topologyKey))
		}
		st.selfMatch = true
		for i := range terms {
			if !terms[i].matches(p.Namespace, p.Labels, nil) {
				st.selfMatch = false
			}
		}
		forEachGroup(s, &terms[0], func(g *labelGroup) {
			for i := range terms {
				if !terms[i].matches(g.ns, g.labels, nil) {
					return
				}
			}
			for n, c := range g.nodes {
				for i := range st.aff {
					if st.aff[i].topo.domain(n) >= 0 {
						st.aff[i].add(n, c.all)
						st.affMatches += c.all
					}
				}
			}
		})
		st.affTerms = terms
	}
	if len(p.requiredAntiAffinity) > 0 {
		terms := resolveNamespaces(s, p.requiredAntiAffinity)
		for i := range terms {
			tc := newTermCounts(s, terms[i].topologyKey)
			t := &terms[i]
			forEachGroup(s, t, func(g *labelGroup) {
				if !t.selector.Matches(g.labels) {
					return
				}
				for n, c := range g.nodes {
					tc.add(n, c.all)
				}
			})
			st.anti = append(st.anti, tc)
		}
		st.antiTerms = terms
	}
	for _, a := range s.antiByTerm {
		t := a.term
		if !t.matches(p.Namespace, p.Labels, st.nsLabels) {
			continue
		}
		tc := st.existingFor(t.topologyKey)
		for n, c := range a.nodes {
			tc.add(n, c)
		}
	}
	if len(st.aff) == 0 && len(st.anti) == 0 && len(st.existing) == 0 {
		return nil
	}
	return st
}

// addExisting counts existing pod e's anti-affinity terms that match the
// incoming pod.
func (st *affinityState) addExisting(e *PodInfo, n *NodeInfo, delta int32) {
	p := st.pod
	for i := range e.requiredAntiAffinity {
		t := &e.requiredAntiAffinity[i]
		var m int8
		if int(t.id) < len(st.matched) {
			m = st.matched[t.id]
		}
		if m == 0 {
			m = 2
			if t.matches(p.Namespace, p.Labels, st.nsLabels) {
				m = 1
			}
			if int(t.id) < len(st.matched) {
				st.matched[t.id] = m
			}
		}
		if m != 1 {
			continue
		}
		st.existingFor(t.topologyKey).add(n, delta)
	}
}

// existingFor returns the counts of existing pods' anti-affinity by the
// domains of key.
func (st *affinityState) existingFor(key string) *termCounts {
	for j := range st.existing {
		if st.existing[j].key == key {
			return &st.existing[j]
		}
	}
	st.existing = append(st.existing, newTermCounts(st.s, key))
	return &st.existing[len(st.existing)-1]
}

// update adjusts the counts for pod e appearing on (delta 1) or leaving
// (delta -1) node n; preemption uses it to try node states without e.
func (st *affinityState) update(e *PodInfo, n *NodeInfo, delta int32) {
	if len(st.aff) > 0 {
		all := true
		for i := range st.affTerms {
			if !st.affTerms[i].matches(e.Namespace, e.Labels, nil) {
				all = false
				break
			}
		}
		if all {
			for i := range st.aff {
				if st.aff[i].topo.domain(n) >= 0 {
					st.aff[i].add(n, delta)
					st.affMatches += delta
				}
			}
		}
	}
	for i := range st.anti {
		if st.antiTerms[i].matches(e.Namespace, e.Labels, nil) {
			st.anti[i].add(n, delta)
		}
	}
	if len(e.requiredAntiAffinity) > 0 {
		st.addExisting(e, n, delta)
	}
}

func (st *affinityState) filter(n *NodeInfo) (uint8, string) {
	if len(st.aff) > 0 {
		exist := true
		for i := range st.aff {
			d := st.aff[i].topo.domain(n)
			if d < 0 {
				return codeUnresolvable, reasonAffinity
			}
			if st.aff[i].counts[d] <= 0 {
				exist = false
			}
		}
		// The first pod of a group that is affine to itself may go
		// anywhere that has the topology labels.
		if !exist && !(st.affMatches == 0 && st.selfMatch) {
			return codeUnresolvable, reasonAffinity
		}
	}
	for i := range st.anti {
		if d := st.anti[i].topo.domain(n); d >= 0 && st.anti[i].counts[d] > 0 {
			return codeUnschedulable, reasonAntiAffinity
		}
	}
	for i := range st.existing {
		if d := st.existing[i].topo.domain(n); d >= 0 && st.existing[i].counts[d] > 0 {
			return codeUnschedulable, reasonExistingAntiAffinity
		}
	}
	return codeFeasible, ""
}
