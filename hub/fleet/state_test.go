package fleet

import (
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/controllers/nodelifecycle"
	"github.com/tether-edge/tether/internal/fleetapi"
)

func node(name, zone string, ready corev1.ConditionStatus, msg string, taints ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if zone != "" {
		n.Labels[corev1.LabelTopologyZone] = zone
	}
	if ready != "" {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Message: msg}}
	}
	for _, k := range taints {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Effect: corev1.TaintEffectNoExecute})
	}
	return n
}

func pod(name, node string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
}

func TestSummarize(t *testing.T) {
	now := time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)
	nodes := []*corev1.Node{
		node("a1", "alpha", corev1.ConditionTrue, ""),
		node("a2", "alpha", corev1.ConditionUnknown, nodelifecycle.MessagePartitioned),
		node("a3", "alpha", corev1.ConditionUnknown, nodelifecycle.MessageDead, nodelifecycle.TaintDead),
		node("b1", "beta", corev1.ConditionUnknown, nodelifecycle.MessageSiteDark),
		node("b2", "beta", corev1.ConditionUnknown, nodelifecycle.MessageSiteDark),
		node("c1", "gamma", corev1.ConditionTrue, ""),
		node("c2", "gamma", corev1.ConditionFalse, "container runtime is down"),
		node("lone", "", corev1.ConditionUnknown, nodelifecycle.MessageStatusUnknown),
		node("new", "", "", ""),
	}
	pods := []*corev1.Pod{
		pod("p1", "a1", corev1.PodRunning), pod("p2", "a1", corev1.PodPending), pod("p3", "a1", corev1.PodSucceeded),
		pod("p4", "b1", corev1.PodRunning), pod("p5", "", corev1.PodPending), pod("p6", "c2", corev1.PodFailed),
	}
	renew := metav1.NewMicroTime(now.Add(-75 * time.Second))
	leases := []*coordinationv1.Lease{{ObjectMeta: metav1.ObjectMeta{Name: "a1"}, Spec: coordinationv1.LeaseSpec{RenewTime: &renew}}}
	v := Summarize(now, nodes, pods, leases)
	if v.Nodes != 9 || v.Pods != 3 {
		t.Errorf("%d nodes, %d pods; want 9 and 3", v.Nodes, v.Pods)
	}
	var order []string
	links := map[string]Link{}
	for _, s := range v.Sites {
		order = append(order, s.Name)
		links[s.Name] = s.Link
	}
	// Worst first: beta is dark, the nodes without a site unreachable,
	// alpha partitioned (its dead node says nothing of its link), gamma
	// has a node that is not ready.
	if got := strings.Join(order, ","); got != "beta,(no site),alpha,gamma" {
		t.Errorf("sites in order %s", got)
	}
	want := map[string]Link{"alpha": Partitioned, "beta": Dark, "gamma": NotReady, NoSite: Unreachable}
	for s, l := range want {
		if links[s] != l {
			t.Errorf("site %s is %s, want %s", s, links[s], l)
		}
	}
	for _, s := range v.Sites {
		if s.Name != "alpha" {
			continue
		}
		if s.Pods != 2 || s.Counts[Connected] != 1 || s.Counts[Partitioned] != 1 || s.Counts[Dead] != 1 {
			t.Errorf("alpha: %d pods, counts %v", s.Pods, s.Counts)
		}
		if n := s.Nodes[0]; n.Name != "a1" || !n.LastHeard.Equal(renew.Time) || n.Pods != 2 || n.Link != Connected {
			t.Errorf("a1: %+v", n)
		}
		if n := s.Nodes[2]; n.Name != "a3" || n.Link != Dead {
			t.Errorf("a3: %+v", n)
		}
	}
	if got := ago(now, renew.Time); got != "1m15s ago" {
		t.Errorf("ago: %q", got)
	}
	if got := ago(now, time.Time{}); got != "never" {
		t.Errorf("ago of nothing: %q", got)
	}
	// A site whose every node is dead is dead.
	if v := Summarize(now, []*corev1.Node{node("d1", "delta", corev1.ConditionUnknown, nodelifecycle.MessageDead, nodelifecycle.TaintDead)}, nil, nil); v.Sites[0].Link != Dead {
		t.Errorf("a site of dead nodes is %s", v.Sites[0].Link)
	}
}

// TestRenderEscapes checks that what nodes report reaches the page as
// text, never as markup.
func TestRenderEscapes(t *testing.T) {
	p := New(t.Context(), nil)
	v := Summarize(time.Now(), []*corev1.Node{node("n1", "<script>alert(1)</script>", corev1.ConditionFalse, `<img src=x onerror="alert(2)">`)}, nil, nil)
	var b strings.Builder
	if err := p.renderPage(&b, v); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "<script>alert") || strings.Contains(out, "<img src=x") {
		t.Errorf("unescaped node text in the page:\n%s", out)
	}
	if !strings.Contains(out, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the site's name is not on the page:\n%s", out)
	}
}

// TestAgentVersions checks that the page shows each node's agent version
// and, for a site whose nodes run several, how many run each.
func TestAgentVersions(t *testing.T) {
	withVersion := func(n *corev1.Node, kubelet string) *corev1.Node {
		n.Status.NodeInfo.KubeletVersion = kubelet
		return n
	}
	nodes := []*corev1.Node{
		withVersion(node("a1", "alpha", corev1.ConditionTrue, ""), "v1.37.2-tether+v0.5.0"),
		withVersion(node("a2", "alpha", corev1.ConditionTrue, ""), "v1.37.2-tether+v0.5.0"),
		withVersion(node("a3", "alpha", corev1.ConditionTrue, ""), "v1.37.2-tether+v0.4.1"),
		withVersion(node("b1", "beta", corev1.ConditionTrue, ""), "v1.37.2-tether+v0.5.0"),
		withVersion(node("b2", "beta", corev1.ConditionTrue, ""), "v1.37.2-tether"),
		node("c1", "gamma", corev1.ConditionTrue, ""),
	}
	v := Summarize(time.Now(), nodes, nil, nil)
	agents := map[string]map[string]int{}
	agent := map[string]string{}
	for _, s := range v.Sites {
		agents[s.Name] = s.Agents
		for _, n := range s.Nodes {
			agent[n.Name] = n.Agent
		}
	}
	for name, want := range map[string]string{"a1": "v0.5.0", "a3": "v0.4.1", "b2": "v1.37.2-tether", "c1": ""} {
		if agent[name] != want {
			t.Errorf("node %s: agent %q, want %q", name, agent[name], want)
		}
	}
	if a := agents["alpha"]; a["v0.5.0"] != 2 || a["v0.4.1"] != 1 || len(a) != 2 {
		t.Errorf("alpha's agents: %v", a)
	}
	if a := agents["gamma"]; len(a) != 0 {
		t.Errorf("gamma's agents: %v", a)
	}
	p := New(t.Context(), nil)
	var b strings.Builder
	if err := p.renderPage(&b, v); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "agents v0.4.1 ×1 v0.5.0 ×2") {
		t.Errorf("alpha's two versions are not on the page:\n%s", out)
	}
	if !strings.Contains(out, "<td>v0.4.1</td>") {
		t.Errorf("a3's version is not on the page:\n%s", out)
	}
}

func TestRolloutsOrder(t *testing.T) {
	at := time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)
	up := func(name, phase string, failed int32, age time.Duration) *fleetapi.EdgeUpgrade {
		u := &fleetapi.EdgeUpgrade{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(at.Add(-age))}}
		u.Status.Phase, u.Status.Failed = phase, failed
		return u
	}
	ups := []*fleetapi.EdgeUpgrade{up("old-done", fleetapi.PhaseComplete, 0, 9*time.Hour), up("running", fleetapi.PhaseProgressing, 0, time.Hour),
		up("stuck", fleetapi.PhasePaused, 2, 2*time.Hour), up("done-with-failures", fleetapi.PhaseComplete, 1, 3*time.Hour)}
	for i := range 7 {
		ups = append(ups, up(fmt.Sprintf("done-%d", i), fleetapi.PhaseComplete, 0, time.Duration(i)*time.Minute))
	}
	var names []string
	for _, r := range Rollouts(ups) {
		names = append(names, r.Name)
	}
	want := "stuck running done-with-failures done-0 done-1 done-2 done-3 done-4"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("rollouts shown: %s\nwant %s", got, want)
	}
}

func TestStagingsOrder(t *testing.T) {
	at := time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)
	st := func(name, phase string, age time.Duration) *fleetapi.ImageStaging {
		s := &fleetapi.ImageStaging{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(at.Add(-age))}}
		s.Spec.Images = []string{"a:1", "b:2"}
		s.Status.Phase = phase
		return s
	}
	ss := []*fleetapi.ImageStaging{st("staged-old", fleetapi.StagingStaged, 5*time.Hour), st("pending", fleetapi.StagingPending, time.Hour),
		st("waiting", fleetapi.StagingWaiting, 3*time.Hour), st("staged-new", fleetapi.StagingStaged, time.Minute), st("unread", "", 2*time.Hour)}
	var names []string
	for _, s := range Stagings(ss) {
		names = append(names, s.Name+"="+s.Phase)
	}
	want := "pending=Pending unread=Pending waiting=Waiting staged-new=Staged staged-old=Staged"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("stagings shown: %s\nwant %s", got, want)
	}
	if got := Stagings(ss)[0].Images; got != "a:1, b:2" {
		t.Errorf("images shown as %q", got)
	}
}
