package testbench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/internal/disconnect"
	"github.com/tether-edge/tether/internal/sitedigest"
	"github.com/tether-edge/tether/testbench/images"
)

// siteWorkloads are the workloads of the scenarios.
//
// Their image is the echo test image (a web server on 8080), which the
// containerd node alpha-n1 runs and the sim nodes pretend to.
//
//   - steady: one pod on each node of alpha, default disconnect policy,
//     behind the ClusterIP Service steady and the headless steady-hl.
//   - mover / stayer: two pods each preferring alpha (never alpha-n3 or
//     beta-n3, which the scenarios power off, nor the containerd node
//     alpha-n1, which runs the web and probe pods), mover with the policy
//     lost-after=60s, replace=true, reconcile=keepReplacement, stayer
//     with the default one.
//   - victim: two pods on beta preferring beta-n3.
//   - patient: a pod bound to beta-n2 that tolerates the unreachable
//     NoExecute taint for 5 s only.
const siteWorkloads = `apiVersion: apps/v1
kind: Deployment
metadata: {name: steady}
spec:
  replicas: 3
  selector: {matchLabels: {app: steady}}
  template:
    metadata: {labels: {app: steady}}
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms: [{matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [alpha]}]}]
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: steady}}}
      containers: [{name: c, image: %[1]s, imagePullPolicy: Never, ports: [{containerPort: 8080}]}]
---
apiVersion: v1
kind: Service
metadata: {name: steady}
spec:
  selector: {app: steady}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: steady-hl}
spec:
  clusterIP: None
  selector: {app: steady}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: mover}
spec:
  replicas: 2
  selector: {matchLabels: {app: mover}}
  template:
    metadata:
      labels: {app: mover}
      annotations:
        disconnect.tether.io/lost-after: 60s
        disconnect.tether.io/replace: "true"
        disconnect.tether.io/reconcile: keepReplacement
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - {key: topology.kubernetes.io/zone, operator: In, values: [alpha, beta]}
              - {key: kubernetes.io/hostname, operator: NotIn, values: [alpha-n1, alpha-n3, beta-n3]}
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            preference: {matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [alpha]}]}
      containers: [{name: c, image: %[1]s, imagePullPolicy: Never}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: stayer}
spec:
  replicas: 2
  selector: {matchLabels: {app: stayer}}
  template:
    metadata: {labels: {app: stayer}}
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - {key: topology.kubernetes.io/zone, operator: In, values: [alpha, beta]}
              - {key: kubernetes.io/hostname, operator: NotIn, values: [alpha-n1, alpha-n3, beta-n3]}
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            preference: {matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [alpha]}]}
      containers: [{name: c, image: %[1]s, imagePullPolicy: Never}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: victim}
spec:
  replicas: 2
  selector: {matchLabels: {app: victim}}
  template:
    metadata: {labels: {app: victim}}
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms: [{matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [beta]}]}]
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [beta-n3]}]}
      containers: [{name: c, image: %[1]s, imagePullPolicy: Never}]
---
apiVersion: v1
kind: Pod
metadata: {name: patient, labels: {app: patient}}
spec:
  nodeName: beta-n2
  tolerations:
  - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
  containers: [{name: c, image: %[1]s, imagePullPolicy: Never}]
`

// detection is one dead node's timeline from its power cut.
type detection struct {
	detected time.Duration // the hub tainted it dead or took its Ready away
	replaced time.Duration // its pods ran elsewhere (gossip samples only)
}

// TestSites runs the scenarios of sites with gossip in one lab of two
// gossiping sites and one heartbeat-only site, side by side:
//
//   - SiteDark: alpha's uplink is cut (2 min; 10 min with
//     TETHER_SITES_FULL=1): no pod of alpha evicted or restarted, the
//     Services answer from alpha's own DNS, alpha's nodes Ready=Unknown
//     with only the unreachable NoSchedule taint; after the heal all Ready
//     again and no agent listed again.
//   - ContainerdNode: alpha-n1 is a containerd node with the eBPF
//     dataplane and the agent's DNS; its probe pod reaches the web
//     Service by name and ClusterIP and the steady Service's backends.
//   - ContainerdNodeDark: while alpha is dark, every connection of the
//     probe pod to web, by name and by ClusterIP, is answered by a web
//     pod, and no container of alpha-n1 stops or starts again.
//   - LocalFailover: a node of the dark site powered off leaves the
//     other members' DNS answers within 10 s and the containerd node's
//     load balancing (the probe pod's connections) from 10 s on; after
//     the heal the hub marks it dead from the site's digest.
//   - DisconnectPolicy: the replace=true workload of the dark site runs
//     on beta after lost-after; its originals go on heal; the default
//     policy's pods stay.
//   - DeadNode: a node of connected beta powered off: dead taint, its
//     pods run elsewhere within 30 s.
//   - NodeUplinkCut: one node of beta loses its uplink, LAN up: Ready
//     Unknown, NoSchedule only, never evicted.
//   - GossipAuth: gossip with a wrong key or from a non-member is
//     dropped and counted.
//   - Detection: dead node detection with gossip against heartbeats only
//     (BENCH figures).
func TestSites(t *testing.T) {
	requireRoot(t)
	full := sitesFull()
	dark := 2 * time.Minute
	if full {
		dark = 10 * time.Minute
	}
	s := newSiteLab(t)
	s.h.applyManifest(t, fmt.Sprintf(siteWorkloads, images.Echo))
	s.applyCtrWorkloads(t)
	waitSite(t, "every workload Running", 90*time.Second, func() (bool, string) {
		ps := s.pods("")
		var run int
		var out []string
		for i := range ps {
			if podRunning(&ps[i]) {
				run++
			}
			out = append(out, ps[i].Name+"@"+ps[i].Spec.NodeName+"/"+string(ps[i].Status.Phase))
		}
		return run == 10+ctrPods, strings.Join(out, " ")
	})
	ok := t.Run("GossipForms", s.gossipForms)
	ctrOK := t.Run("ContainerdNode", s.ctrServes)

	var (
		cutStarted = make(chan time.Time, 4)
		policyDone = make(chan struct{})
		healed     = make(chan struct{})
		mu         sync.Mutex
		gossip     []detection
		heartbeat  []detection
		wg         sync.WaitGroup
	)
	goRun := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	goRun(func() {
		t.Run("SiteDark", func(t *testing.T) { s.siteDark(t, dark, cutStarted, policyDone, healed) })
	})
	goRun(func() {
		t.Run("ContainerdNodeDark", func(t *testing.T) {
			cut := <-cutStarted
			if s.ctr == nil || !ctrOK {
				t.Skipf("%s runs the sim runtime or does not serve (%s)", ctrNodeName, s.ctrWhy)
			}
			s.ctrDark(t, cut, healed)
		})
	})
	goRun(func() {
		t.Run("LocalFailover", func(t *testing.T) { s.localFailover(t, cutStarted, healed) })
	})
	goRun(func() {
		defer func() {
			select {
			case <-policyDone:
			default:
				close(policyDone)
			}
		}()
		t.Run("DisconnectPolicy", func(t *testing.T) { s.disconnectPolicy(t, dark, cutStarted, policyDone, healed) })
	})
	goRun(func() {
		t.Run("HeartbeatOnly", func(t *testing.T) {
			rounds := 1
			if full {
				rounds = 3
			}
			d := s.heartbeatOnly(t, rounds)
			mu.Lock()
			heartbeat = append(heartbeat, d...)
			mu.Unlock()
		})
	})
	goRun(func() {
		t.Run("DeadNode", func(t *testing.T) {
			defer s.powerOn(t, "beta-n3")
			d := s.deadNode(t, "beta-n3", "app=victim", 2)
			mu.Lock()
			gossip = append(gossip, d)
			mu.Unlock()
		})
		t.Run("DeadNodeBack", func(t *testing.T) { s.waitHealthy(t, "beta-n3", 90*time.Second) })
		t.Run("NodeUplinkCut", s.nodeUplinkCut)
		t.Run("GossipAuth", s.gossipAuth)
		samples := 2
		if full {
			samples = 9
		}
		t.Run("MoreDeadNodes", func(t *testing.T) {
			for i := 0; i < samples; i++ {
				s.victimsBackOn(t, "beta-n3", "app=victim", 2)
				func() {
					defer s.powerOn(t, "beta-n3")
					d := s.deadNode(t, "beta-n3", "app=victim", 2)
					mu.Lock()
					gossip = append(gossip, d)
					mu.Unlock()
				}()
				s.waitHealthy(t, "beta-n3", 90*time.Second)
			}
		})
	})
	wg.Wait()
	if !ok {
		t.Log("the site gossip did not form; the scenarios above could not pass")
	}
	t.Run("Detection", func(t *testing.T) { reportDetection(t, full, gossip, heartbeat) })
}

// gossipForms waits until both gossiping sites report their three
// members to the hub and every agent counts three members.
func (s *siteLab) gossipForms(t *testing.T) {
	took := waitSite(t, "both sites' digests accepted by the hub", 60*time.Second, func() (bool, string) {
		m, err := s.hubMetrics()
		if err != nil {
			return false, err.Error()
		}
		v, _ := sumMetric(m, "tether_site_digests_total", `result="accepted"`)
		return v >= 2, fmt.Sprintf("tether_site_digests_total{result=accepted} = %v", v)
	})
	t.Logf("site digests accepted %v after every node was Ready", took.Round(time.Millisecond))
	for _, site := range []string{siteA, siteB} {
		for _, n := range siteNodes(site) {
			waitSite(t, n+" sees three gossip members", 30*time.Second, func() (bool, string) {
				m, err := s.agentMetrics(n)
				if err != nil {
					return false, err.Error()
				}
				v, found := sumMetric(m, "tether_gossip_members")
				return v == 3, fmt.Sprintf("tether_gossip_members = %v (found %v)", v, found)
			})
		}
	}
	for _, n := range siteNodes(siteHB) {
		m, err := s.agentMetrics(n)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := sumMetric(m, "tether_gossip_members"); v > 1 {
			t.Errorf("%s runs without --site but counts %v gossip members", n, v)
		}
	}
}

// siteDark cuts alpha off for d and checks what the hub and the site do.
func (s *siteLab) siteDark(t *testing.T, d time.Duration, cutStarted chan<- time.Time, policyDone <-chan struct{}, healed chan<- struct{}) {
	nodes := siteNodes(siteA)
	kept := nodes[:2] // alpha-n3 is powered off by LocalFailover
	lists := map[string]float64{}
	for _, n := range kept {
		lists[n] = s.agentCounter(t, n, "tether_edge_api_requests_total", `kind="list"`)
	}
	type podState struct {
		uid      string
		node     string
		restarts int32
	}
	before := map[string]podState{}
	var steadyIPs []string
	podSets := []string{"app=steady", "app=stayer", "app=web", "app=probe"}
	for _, sel := range podSets {
		for _, p := range s.pods(sel) {
			if slices.Contains(kept, p.Spec.NodeName) {
				before[p.Name] = podState{string(p.UID), p.Spec.NodeName, restarts(&p)}
				if sel == "app=steady" {
					steadyIPs = append(steadyIPs, p.Status.PodIP)
				}
			}
		}
	}
	if len(steadyIPs) != 2 {
		t.Fatalf("want a steady pod on each of %v, have IPs %v", kept, steadyIPs)
	}
	clusterIP := ""
	{
		ctx, cancel := ctx10()
		svc, err := s.c.CoreV1().Services("default").Get(ctx, "steady", metav1.GetOptions{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		clusterIP = svc.Spec.ClusterIP
	}

	if err := s.l.Partition(siteA, Both); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	for i := 0; i < cap(cutStarted); i++ {
		cutStarted <- cut
	}
	heal := func() {
		if err := s.l.Heal(siteA); err != nil {
			t.Error(err)
		}
		close(healed)
	}
	healOnce := sync.OnceFunc(heal)
	defer healOnce()

	// While dark: the site's DNS answers, the hub marks alpha's nodes
	// Unknown and taints them NoSchedule only, and evicts nothing.
	unknown := map[string]time.Duration{}
	badTaints := map[string][]string{}
	dnsFailures, dnsChecks := 0, 0
	var lastDNS string
	for i := 0; time.Since(cut) < d; i++ {
		n := kept[i%2]
		got, err := s.lookup(n, "steady.default.svc.cluster.local")
		hl, err2 := s.lookup(n, "steady-hl.default.svc.cluster.local")
		dnsChecks++
		if err != nil || err2 != nil || !slices.Equal(got, []string{clusterIP}) || !containsAll(hl, steadyIPs) {
			dnsFailures++
			lastDNS = fmt.Sprintf("%s at %v: steady %v (%v), steady-hl %v (%v); want [%s] and %v among it",
				n, time.Since(cut).Round(time.Second), got, err, hl, err2, clusterIP, steadyIPs)
		}
		for _, name := range nodes {
			node := s.node(name)
			if node == nil {
				continue
			}
			if readyOf(node) == corev1.ConditionUnknown {
				if _, seen := unknown[name]; !seen {
					unknown[name] = time.Since(cut)
					t.Logf("%s Ready=Unknown %v after the cut: %s; taints %v", name, unknown[name].Round(time.Second), readyMessage(node), taintsOf(node))
				}
			}
			if ts := taintsOf(node); len(ts) > 0 && !onlyUnreachableNoSchedule(node) && badTaints[name] == nil {
				badTaints[name] = ts
				t.Errorf("%s of the dark site has taints %v %v after the cut; want only %s:NoSchedule", name, ts, time.Since(cut).Round(time.Second), taintUnreachable)
			}
		}
		for _, sel := range podSets {
			for _, p := range s.pods(sel) {
				if b, ok := before[p.Name]; ok && p.DeletionTimestamp != nil {
					t.Errorf("pod %s on %s of the dark site is being deleted (%v after the cut)", p.Name, b.node, time.Since(cut).Round(time.Second))
					delete(before, p.Name)
				}
			}
		}
		time.Sleep(time.Second)
	}
	// The disconnect policy's replacement comes at about lost-after
	// plus the grace period; give it until then before healing.
	select {
	case <-policyDone:
	case <-time.After(45 * time.Second):
	}
	for _, name := range nodes {
		if _, ok := unknown[name]; !ok {
			t.Errorf("%s was never Ready=Unknown during %v of darkness", name, time.Since(cut).Round(time.Second))
		}
	}
	if dnsFailures > 0 {
		t.Errorf("DNS of the dark site failed %d of %d checks; last: %s", dnsFailures, dnsChecks, lastDNS)
	} else {
		t.Logf("DNS answered from alpha's nodes in all %d checks while dark", dnsChecks)
	}
	t.Logf("healing alpha after %v of darkness", time.Since(cut).Round(time.Second))
	healOnce()
	healedAt := time.Now()

	for _, n := range kept {
		s.waitHealthy(t, n, 150*time.Second)
		t.Logf("%s Ready %v after the heal", n, time.Since(healedAt).Round(time.Millisecond))
	}
	// Give a relist, had there been one, time to show.
	time.Sleep(5 * time.Second)
	for _, n := range kept {
		if got := s.agentCounter(t, n, "tether_edge_api_requests_total", `kind="list"`); got != lists[n] {
			t.Errorf("%s listed again after the heal: %v LISTs before the cut, %v after", n, lists[n], got)
		}
	}
	now := map[string]corev1.Pod{}
	for _, sel := range podSets {
		for _, p := range s.pods(sel) {
			now[p.Name] = p
		}
	}
	for name, b := range before {
		p, ok := now[name]
		switch {
		case !ok || string(p.UID) != b.uid:
			t.Errorf("pod %s of %s is gone after the heal (evicted)", name, b.node)
		case p.DeletionTimestamp != nil:
			t.Errorf("pod %s of %s is being deleted after the heal", name, b.node)
		case restarts(&p) != b.restarts:
			t.Errorf("pod %s of %s restarted %d times during the darkness", name, b.node, restarts(&p)-b.restarts)
		case !podRunning(&p):
			t.Errorf("pod %s of %s is %s after the heal", name, b.node, p.Status.Phase)
		}
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// localFailover powers alpha-n3 off while alpha is dark: its pod leaves
// the DNS answers of alpha-n1 and alpha-n2 within 10 s; after the heal the
// hub marks it dead from the site's digest. It powers the node on again.
func (s *siteLab) localFailover(t *testing.T, cutStarted <-chan time.Time, healed <-chan struct{}) {
	const victim = "alpha-n3"
	cut := <-cutStarted
	var ip string
	for _, p := range s.pods("app=steady") {
		if p.Spec.NodeName == victim {
			ip = p.Status.PodIP
		}
	}
	if ip == "" {
		t.Fatalf("no steady pod with an IP on %s", victim)
	}
	// Let the hub lose the site first, so that it cannot learn anything.
	time.Sleep(time.Until(cut.Add(10 * time.Second)))
	for _, n := range []string{"alpha-n1", "alpha-n2"} {
		hl, err := s.lookup(n, "steady-hl.default.svc.cluster.local")
		if err != nil || !slices.Contains(hl, ip) {
			t.Fatalf("before the power cut %s answers steady-hl with %v (%v), want %s among it", n, hl, err, ip)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := s.l.PowerOff(ctx, victim); err != nil {
		t.Fatal(err)
	}
	defer s.waitHealthy(t, victim, 90*time.Second)
	defer s.powerOn(t, victim)
	off := time.Now()
	took := waitSite(t, victim+"'s pod out of alpha-n1's and alpha-n2's DNS answers", 10*time.Second, func() (bool, string) {
		var out []string
		gone := true
		for _, n := range []string{"alpha-n1", "alpha-n2"} {
			hl, err := s.lookup(n, "steady-hl.default.svc.cluster.local")
			gone = gone && err == nil && !slices.Contains(hl, ip)
			out = append(out, fmt.Sprintf("%s: %v %v", n, hl, err))
		}
		return gone, strings.Join(out, "; ")
	})
	t.Logf("%s's pod %s left the site's DNS answers %v after its power cut", victim, ip, took.Round(time.Millisecond))
	// The Service's load balancing follows the same view: the
	// containerd node's eBPF dataplane shows it.
	s.ctrLeavesLB(t, victim, off, cut)
	for _, n := range []string{"alpha-n1", "alpha-n2"} {
		if got, err := s.lookup(n, "steady.default.svc.cluster.local"); err != nil || len(got) != 1 {
			t.Errorf("%s stopped answering the steady Service after %s died: %v %v", n, victim, got, err)
		}
	}
	if node := s.node(victim); node != nil && hasTaint(node, taintDead) {
		t.Errorf("the hub tainted %s dead while its site was dark (%v after the power cut)", victim, time.Since(off))
	}

	<-healed
	m, _ := s.hubMetrics()
	digests, _ := sumMetric(m, "tether_site_digests_total", `result="accepted"`)
	// The digest goes over the tunnel of a member that is back. After a
	// long outage a tunnel's next attempt is drawn from its whole backoff
	// window (up to 60 s), so the wait for the hub starts there.
	back := waitSite(t, "a member of "+siteA+" back on its tunnel", 90*time.Second, func() (bool, string) {
		var out []string
		for _, n := range []string{"alpha-n1", "alpha-n2"} {
			m, err := s.agentMetrics(n)
			if err != nil {
				out = append(out, fmt.Sprintf("%s: %v", n, err))
				continue
			}
			if v, _ := sumMetric(m, "tether_edge_tunnel_connected"); v == 1 {
				return true, ""
			}
			out = append(out, n+" not connected")
		}
		return false, strings.Join(out, "; ")
	})
	t.Logf("a member of %s was back on its tunnel %v after the heal", siteA, back.Round(time.Millisecond))
	took = waitSite(t, "the hub to mark "+victim+" dead after a member of its site came back", 30*time.Second, func() (bool, string) {
		node := s.node(victim)
		if node == nil {
			return false, "no answer"
		}
		return hasTaint(node, taintDead), fmt.Sprintf("Ready=%s (%s) taints %v", readyOf(node), readyMessage(node), taintsOf(node))
	})
	m, _ = s.hubMetrics()
	after, _ := sumMetric(m, "tether_site_digests_total", `result="accepted"`)
	t.Logf("the hub marked %s dead %v after a member of its site came back; accepted site digests went from %v to %v", victim, took.Round(time.Millisecond), digests, after)
	if after-digests < 1 {
		t.Errorf("the hub accepted no new site digest after the heal (%v before, %v after)", digests, after)
	}
}

// disconnectPolicy watches mover and stayer while alpha is dark.
func (s *siteLab) disconnectPolicy(t *testing.T, d time.Duration, cutStarted <-chan time.Time, policyDone chan<- struct{}, healed <-chan struct{}) {
	originals := map[string]map[string]string{} // app -> pod name -> node
	for _, app := range []string{"mover", "stayer"} {
		originals[app] = map[string]string{}
		for _, p := range s.pods("app=" + app) {
			if !strings.HasPrefix(p.Spec.NodeName, siteA+"-") {
				t.Fatalf("%s pod %s runs on %s; want the preferred site %s", app, p.Name, p.Spec.NodeName, siteA)
			}
			originals[app][p.Name] = p.Spec.NodeName
			eff := p.Annotations[disconnect.EffectiveAnnotation]
			t.Logf("%s pod %s: %s=%q", app, p.Name, disconnect.EffectiveAnnotation, eff)
			if eff == "" {
				t.Errorf("%s pod %s has no %s annotation", app, p.Name, disconnect.EffectiveAnnotation)
			}
		}
	}
	cut := <-cutStarted
	func() {
		defer close(policyDone)
		waitSite(t, "mover's pods running on beta", d+40*time.Second, func() (bool, string) {
			var on []string
			n := 0
			for _, p := range s.pods("app=mover") {
				if podRunning(&p) && strings.HasPrefix(p.Spec.NodeName, siteB+"-") {
					n++
				}
				on = append(on, p.Name+"@"+p.Spec.NodeName+"/"+string(p.Status.Phase))
			}
			return n == 2, strings.Join(on, " ")
		})
	}()
	since := time.Since(cut)
	t.Logf("mover's pods replaced on beta %v after the cut (lost-after 60s)", since.Round(time.Second))
	if since < 60*time.Second {
		t.Errorf("mover's pods replaced %v after the cut, before their lost-after of 60s", since)
	}
	check := func(when string) {
		for _, p := range s.pods("app=stayer") {
			if _, orig := originals["stayer"][p.Name]; !orig {
				t.Errorf("%s: stayer (default policy) has a new pod %s on %s", when, p.Name, p.Spec.NodeName)
			} else if p.DeletionTimestamp != nil {
				t.Errorf("%s: stayer's pod %s is being deleted", when, p.Name)
			}
		}
	}
	check("while dark")
	<-healed
	// Their agents confirm the deletion once back on their tunnels, which
	// may take a whole backoff window (up to 60 s) after a long outage.
	waitSite(t, "mover's originals removed after the heal", 120*time.Second, func() (bool, string) {
		var left []string
		for _, p := range s.pods("app=mover") {
			if _, orig := originals["mover"][p.Name]; orig {
				left = append(left, p.Name)
			}
		}
		return len(left) == 0, fmt.Sprintf("originals left: %v", left)
	})
	check("after the heal")
}

// deadNode powers node off and measures until the hub marks it dead and
// until want pods of selector run elsewhere; the node stays off.
func (s *siteLab) deadNode(t *testing.T, node, selector string, want int) detection {
	var on int
	for _, p := range s.pods(selector) {
		if p.Spec.NodeName == node && podRunning(&p) {
			on++
		}
	}
	if on == 0 {
		t.Fatalf("no %s pod runs on %s", selector, node)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := s.l.PowerOff(ctx, node); err != nil {
		t.Fatal(err)
	}
	off := time.Now()
	var d detection
	waitSite(t, node+" marked dead and its pods replaced", 60*time.Second, func() (bool, string) {
		n := s.node(node)
		if n == nil {
			return false, "no answer"
		}
		if d.detected == 0 && (hasTaint(n, taintDead) || readyOf(n) != corev1.ConditionTrue) {
			d.detected = time.Since(off)
		}
		elsewhere := 0
		var out []string
		for _, p := range s.pods(selector) {
			if p.Spec.NodeName != node && podRunning(&p) {
				elsewhere++
			}
			out = append(out, p.Name+"@"+p.Spec.NodeName+"/"+string(p.Status.Phase))
		}
		if d.replaced == 0 && elsewhere >= want {
			d.replaced = time.Since(off)
		}
		return d.replaced != 0 && hasTaint(n, taintDead), fmt.Sprintf("Ready=%s (%s) taints %v; pods %s", readyOf(n), readyMessage(n), taintsOf(n), strings.Join(out, " "))
	})
	t.Logf("%s powered off: the hub noticed after %v, its pods ran elsewhere after %v", node, d.detected.Round(time.Millisecond), d.replaced.Round(time.Millisecond))
	if d.replaced > 30*time.Second {
		t.Errorf("%s's pods replaced %v after its power cut; want at most 30s", node, d.replaced)
	}
	return d
}

// waitHealthy waits until a node is Ready without taints. A node back
// from a cut reconnects on its tunnel's back-off, which grows to 60 s
// while the hub is out of reach.
func (s *siteLab) waitHealthy(t *testing.T, node string, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	last := ""
	for {
		n := s.node(node)
		if n != nil {
			if readyOf(n) == corev1.ConditionTrue && len(taintsOf(n)) == 0 {
				t.Logf("%s Ready without taints after %v", node, time.Since(start).Round(time.Millisecond))
				return
			}
			last = fmt.Sprintf("Ready=%s (%s) taints %v", readyOf(n), readyMessage(n), taintsOf(n))
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s not Ready without taints within %v: %s; its agent's log ends:\n%s", node, timeout, last, s.logTail(node, 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// victimsBackOn deletes selector's pods that run elsewhere than node,
// so that their replacements go back to the node they prefer.
func (s *siteLab) victimsBackOn(t *testing.T, node, selector string, want int) {
	ctx, cancel := ctx10()
	defer cancel()
	for _, p := range s.pods(selector) {
		if p.Spec.NodeName != node {
			if err := s.c.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitSite(t, fmt.Sprintf("%d %s pods back on %s", want, selector, node), 60*time.Second, func() (bool, string) {
		on := 0
		var out []string
		for _, p := range s.pods(selector) {
			if p.Spec.NodeName == node && podRunning(&p) {
				on++
			}
			out = append(out, p.Name+"@"+p.Spec.NodeName+"/"+string(p.Status.Phase))
		}
		return on >= want, strings.Join(out, " ")
	})
}

// nodeUplinkCut cuts beta-n2's own uplink while its LAN stays up.
func (s *siteLab) nodeUplinkCut(t *testing.T) {
	const node = "beta-n2"
	ps := s.pods("app=patient")
	if len(ps) != 1 || !podRunning(&ps[0]) {
		t.Fatalf("the patient pod is not running on %s", node)
	}
	uid := ps[0].UID
	ctx := context.Background()
	if err := s.l.CutNodeUplink(ctx, node); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	defer s.l.RestoreNodeUplink(ctx, node)
	took := waitSite(t, node+" Ready=Unknown", 90*time.Second, func() (bool, string) {
		n := s.node(node)
		if n == nil {
			return false, "no answer"
		}
		return readyOf(n) == corev1.ConditionUnknown, fmt.Sprintf("Ready=%s taints %v", readyOf(n), taintsOf(n))
	})
	t.Logf("%s Ready=Unknown %v after its uplink was cut: %s", node, took.Round(time.Second), readyMessage(s.node(node)))
	// Watch long enough for a NoExecute taint to evict the patient pod
	// (it tolerates one for 5 s only).
	watch := 20 * time.Second
	if sitesFull() {
		watch = 2 * time.Minute
	}
	for end := time.Now().Add(watch); time.Now().Before(end); time.Sleep(time.Second) {
		n := s.node(node)
		if n != nil && !onlyUnreachableNoSchedule(n) {
			t.Fatalf("%s (uplink cut, LAN up) has taints %v %v after the cut; want only %s:NoSchedule", node, taintsOf(n), time.Since(cut).Round(time.Second), taintUnreachable)
		}
		ps := s.pods("app=patient")
		if len(ps) != 1 || ps[0].UID != uid || ps[0].DeletionTimestamp != nil {
			t.Fatalf("the patient pod on %s was evicted %v after the cut", node, time.Since(cut).Round(time.Second))
		}
	}
	if err := s.l.RestoreNodeUplink(ctx, node); err != nil {
		t.Fatal(err)
	}
	s.waitHealthy(t, node, 150*time.Second)
}

// gossipAuth sends beta-n1 gossip sealed with a wrong key from beta-n2's
// namespace and gossip sealed with the site's key from beta's router,
// which is no member: both are dropped and counted.
func (s *siteLab) gossipAuth(t *testing.T) {
	const node = "beta-n1"
	key := s.agentCounter(t, node, "tether_gossip_dropped_total", `reason="key"`)
	nonMember := s.agentCounter(t, node, "tether_gossip_dropped_total", `reason="non_member"`)
	target := fmt.Sprintf("%s:%d", s.l.Host(node).Addr, gossipPort)

	// A member's address with a key that is not the site's.
	wrong := []byte("not the site's key, not at all!!")
	if err := s.joinAs("beta-n2", s.l.Host("beta-n2").Addr, "beta-n2", wrong, target); err != nil {
		t.Fatal(err)
	}
	// The site's key from an address that is no member's: the router's.
	ctx, cancel := ctx10()
	sec, err := s.c.CoreV1().Secrets(sitedigest.KeySecretNamespace).Get(ctx, sitedigest.KeySecretName(siteB), metav1.GetOptions{})
	cancel()
	if err != nil {
		t.Fatalf("get beta's gossip key: %v", err)
	}
	keys := sec.Data[sitedigest.KeySecretKey]
	if len(keys) < 32 || len(keys)%32 != 0 {
		t.Fatalf("beta's gossip key Secret holds %d bytes of keys", len(keys))
	}
	if err := s.joinAs(siteB+"-router", "10.213.102.1", "intruder", keys[:32], target); err != nil {
		t.Fatal(err)
	}
	waitSite(t, node+" counts both dropped messages", 10*time.Second, func() (bool, string) {
		m, err := s.agentMetrics(node)
		if err != nil {
			return false, err.Error()
		}
		k, _ := sumMetric(m, "tether_gossip_dropped_total", `reason="key"`)
		nm, _ := sumMetric(m, "tether_gossip_dropped_total", `reason="non_member"`)
		return k > key && nm > nonMember, fmt.Sprintf("dropped key %v (was %v), non_member %v (was %v)", k, key, nm, nonMember)
	})
	if v := s.agentCounter(t, node, "tether_gossip_members"); v != 3 {
		t.Errorf("%s counts %v gossip members after the intrusion, want 3", node, v)
	}
}

// heartbeatOnly powers off two nodes of the heartbeat-only site per
// round and measures until the hub notices each.
func (s *siteLab) heartbeatOnly(t *testing.T, rounds int) []detection {
	var out []detection
	victims := []string{"hb-n2", "hb-n3"}
	for r := 0; r < rounds; r++ {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		for _, v := range victims {
			if _, err := s.l.PowerOff(ctx, v); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		off := time.Now()
		seen := map[string]time.Duration{}
		waitSite(t, "the hub to notice both heartbeat-only nodes", 3*time.Minute, func() (bool, string) {
			var st []string
			for _, v := range victims {
				n := s.node(v)
				if n == nil {
					continue
				}
				if _, ok := seen[v]; !ok && (readyOf(n) != corev1.ConditionTrue || hasTaint(n, taintDead)) {
					seen[v] = time.Since(off)
				}
				st = append(st, fmt.Sprintf("%s Ready=%s taints %v", v, readyOf(n), taintsOf(n)))
			}
			return len(seen) == len(victims), strings.Join(st, "; ")
		})
		for _, v := range victims {
			t.Logf("heartbeat-only %s noticed %v after its power cut", v, seen[v].Round(time.Millisecond))
			out = append(out, detection{detected: seen[v]})
			if n := s.node(v); n != nil && hasTaint(n, taintDead) {
				t.Errorf("heartbeat-only node %s got the dead taint: no site evidence exists for it", v)
			}
		}
		for _, v := range victims {
			s.powerOn(t, v)
		}
		for _, v := range victims {
			s.waitHealthy(t, v, 90*time.Second)
		}
	}
	return out
}

// reportDetection prints the BENCH figures of dead node detection and
// replacement.
func reportDetection(t *testing.T, full bool, gossip, heartbeat []detection) {
	if len(gossip) == 0 {
		t.Fatal("no gossip sample was measured")
	}
	var det, repl, hb []time.Duration
	for _, d := range gossip {
		det = append(det, d.detected)
		repl = append(repl, d.replaced)
	}
	for _, d := range heartbeat {
		hb = append(hb, d.detected)
	}
	mode := benchfmt.Mode(full)
	sec := func(d time.Duration) float64 { return d.Seconds() }
	// Upstream: 40 s of node monitor grace, then the default 300 s
	// toleration of the unreachable taint before eviction.
	const upstream = 340.0
	for _, p := range []struct {
		name string
		q    float64
	}{{"p50", 0.5}, {"p99", 0.99}} {
		f := benchfmt.Figure{Name: "dead_node_detection_" + p.name, Value: sec(percentile(det, p.q)), Unit: "s",
			Target: "<=30", Mode: mode, Extra: []string{fmt.Sprintf("samples=%d", len(det)), fmt.Sprintf("heartbeat_samples=%d", len(hb))}}
		if len(hb) > 0 {
			f.Peer, f.PeerValue = "heartbeat_only", sec(percentile(hb, p.q))
		}
		benchfmt.Report(t, f)
		r := benchfmt.Figure{Name: "dead_node_replacement_" + p.name, Value: sec(percentile(repl, p.q)), Unit: "s",
			Target: "<=30", Peer: "upstream_40s_300s", PeerValue: upstream, Mode: mode,
			Extra: []string{fmt.Sprintf("samples=%d", len(repl))}}
		if len(hb) > 0 {
			r.Extra = append(r.Extra, "heartbeat_only_s="+benchfmt.FormatValue(sec(percentile(hb, p.q))+300))
		}
		benchfmt.Report(t, r)
	}
}
