package fleet

import (
	"cmp"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/controllers/nodelifecycle"
)

// NoSite names the group of nodes without a topology.kubernetes.io/zone
// label.
const NoSite = "(no site)"

// Link is how the hub hears a node, or a site.
type Link string

// The links, from best to worst. A site's link is its worst node's,
// except that a site is dark only when the hub hears none of its nodes.
const (
	Connected   Link = "connected"   // Ready
	NotReady    Link = "not-ready"   // heard, but the node reports NotReady
	Partitioned Link = "partitioned" // not heard; its site peers see it alive
	Unreachable Link = "unreachable" // not heard, and nothing says why
	Dark        Link = "dark"        // no node of its site is heard
	Dead        Link = "dead"        // its site peers agree it is gone
)

// rank orders links from best (0) to worst.
func rank(l Link) int {
	switch l {
	case Connected:
		return 0
	case NotReady:
		return 1
	case Partitioned:
		return 2
	case Unreachable:
		return 3
	case Dark:
		return 4
	}
	return 5
}

// Node is one node as the page shows it.
type Node struct {
	Name          string
	Link          Link
	Message       string // the Ready condition's message when not connected
	Unschedulable bool
	// LastHeard is the node's last heartbeat (its Lease's renewTime), or
	// zero when it has none.
	LastHeard time.Time
	Pods      int // pods bound to the node and not finished
	// Agent is the version of the node's agent.
	Agent string
	// Upgrade is the agent's upgrade under way or failed, from its
	// AgentUpgrade condition ("" when none).
	Upgrade string
}

// Site is a site (a zone) and its nodes.
type Site struct {
	Name  string
	Link  Link
	Nodes []Node
	Pods  int
	// Counts of the site's nodes by link.
	Counts map[Link]int
	// Agents counts the site's nodes by agent version; more than one
	// version is an upgrade under way (or stuck).
	Agents map[string]int
}

// View is the fleet at one moment.
type View struct {
	At    time.Time
	Sites []Site
	Nodes int
	Pods  int
	// Rollouts are the agent upgrades rolling out (see Rollouts).
	Rollouts []Rollout
	// Stagings are the images staged to sites (see Stagings).
	Stagings []Staging
}

// Summarize builds the view of nodes, the pods bound to them and their
// Leases. It reads the node lifecycle's conditions and taints: the hub's
// judgement, not a second one.
func Summarize(now time.Time, nodes []*corev1.Node, pods []*corev1.Pod, leases []*coordinationv1.Lease) View {
	heard := make(map[string]time.Time, len(leases))
	for _, l := range leases {
		if l.Spec.RenewTime != nil {
			heard[l.Name] = l.Spec.RenewTime.Time
		}
	}
	podsOn := map[string]int{}
	for _, p := range pods {
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		podsOn[p.Spec.NodeName]++
	}
	bySite := map[string]*Site{}
	v := View{At: now}
	for _, n := range nodes {
		name := n.Labels[corev1.LabelTopologyZone]
		if name == "" {
			name = NoSite
		}
		s := bySite[name]
		if s == nil {
			s = &Site{Name: name, Counts: map[Link]int{}, Agents: map[string]int{}}
			bySite[name] = s
		}
		link, msg := linkOf(n)
		agent := agentVersion(n.Status.NodeInfo.KubeletVersion)
		s.Nodes = append(s.Nodes, Node{Name: n.Name, Link: link, Message: msg, Unschedulable: n.Spec.Unschedulable,
			LastHeard: heard[n.Name], Pods: podsOn[n.Name], Agent: agent, Upgrade: upgradeOf(n)})
		s.Counts[link]++
		if agent != "" {
			s.Agents[agent]++
		}
		s.Pods += podsOn[n.Name]
		v.Nodes++
		v.Pods += podsOn[n.Name]
	}
	for _, s := range bySite {
		s.Link = siteLink(s)
		slices.SortFunc(s.Nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
		v.Sites = append(v.Sites, *s)
	}
	// Worst first, then by name: what needs a look comes first.
	slices.SortFunc(v.Sites, func(a, b Site) int {
		return cmp.Or(cmp.Compare(rank(b.Link), rank(a.Link)), cmp.Compare(a.Name, b.Name))
	})
	return v
}

// agentVersion is the agent's version a node reports: the build
// metadata of its kubeletVersion (v1.37.2-tether+v0.4.1), or the whole
// kubeletVersion when it carries none.
func agentVersion(kubelet string) string {
	if _, v, ok := strings.Cut(kubelet, "+"); ok {
		return v
	}
	return kubelet
}

// linkOf classifies a node from its Ready condition and taints.
func linkOf(n *corev1.Node) (Link, string) {
	for _, t := range n.Spec.Taints {
		if t.Key == nodelifecycle.TaintDead {
			return Dead, readyMessage(n)
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		switch c.Status {
		case corev1.ConditionTrue:
			return Connected, ""
		case corev1.ConditionFalse:
			return NotReady, c.Message
		}
		switch c.Message {
		case nodelifecycle.MessagePartitioned:
			return Partitioned, c.Message
		case nodelifecycle.MessageSiteDark:
			return Dark, c.Message
		case nodelifecycle.MessageDead:
			return Dead, c.Message
		}
		return Unreachable, c.Message
	}
	return Unreachable, "The node has not reported its status yet."
}

func readyMessage(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Message
		}
	}
	return ""
}

// siteLink is the worst link of a site's nodes; a site is dark when none
// of its nodes is heard and the hub took its link as down.
func siteLink(s *Site) Link {
	worst := Connected
	for _, n := range s.Nodes {
		if n.Link == Dead {
			continue // a dead node says nothing of the site's link
		}
		if rank(n.Link) > rank(worst) {
			worst = n.Link
		}
	}
	if s.Counts[Dead] == len(s.Nodes) {
		return Dead
	}
	return worst
}
