package testbench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/testbench/images"
)

// The site lab's containerd node: alpha-n1 runs `tether edge --runtime
// containerd` with the eBPF dataplane (attached to the cgroup of the
// machine's tether containers, pinned in a bpffs directory of its own) and
// the agent's DNS server, as a machine of the site would. It runs a steady
// pod, the two pods of the web Service and the probe pod, a client that
// fetches the web Service by name and by ClusterIP and the steady Service by
// name over a new connection every 200 ms and prints what answered.
//
// The sim pods of alpha-n2 and alpha-n3 have no network. So that the
// steady Service's connections to them can be seen, the test answers for
// each at its pod IP in alpha-n1's network namespace ("stand-in for
// NODE"): a connection the dataplane sends to a sim pod of the steady
// Service reaches its stand-in, and one that it no longer sends there does
// not.

// ctrNodeName is the site lab's containerd node.
const ctrNodeName = siteA + "-n1"

// ctrWorkloads are the web Service and its two pods on the containerd
// node; the probe pod comes once the Service has its ClusterIP.
const ctrWorkloads = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {kubernetes.io/hostname: %[2]s}
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: %[1]s
        imagePullPolicy: Never
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`

// ctrProbePod fetches the web Service by name (%[3]s) and by ClusterIP
// (%[4]s) and the steady Service by name (%[5]s).
const ctrProbePod = `apiVersion: v1
kind: Pod
metadata: {name: probe, labels: {app: probe}}
spec:
  nodeSelector: {kubernetes.io/hostname: %[2]s}
  terminationGracePeriodSeconds: 1
  containers:
  - name: probe
    image: %[1]s
    imagePullPolicy: Never
    command: [/testapp, probe, 200ms, "%[3]s", "%[4]s", "%[5]s"]
`

// The probe pod's URLs.
const (
	webByName    = "http://web.default.svc.cluster.local/"
	steadyByName = "http://steady.default.svc.cluster.local/"
)

// containerdNodeMissing says why the site lab cannot run a containerd
// node here, or "" when it can: what requireContainerdNode checks, and a
// cgroup v2 hierarchy for the dataplane.
func containerdNodeMissing() string {
	if os.Geteuid() != 0 {
		return "needs root"
	}
	for _, bin := range []string{"containerd", "runc", "ctr", "nsenter", "unshare", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Sprintf("needs %s: %v", bin, err)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		if _, err2 := os.Stat("/opt/cni/bin/bridge"); err2 != nil {
			return "needs the CNI plugins (containernetworking-plugins)"
		}
	}
	if cgroup2Root() == "" {
		return "no cgroup v2 hierarchy is mounted; the eBPF dataplane needs one"
	}
	return ""
}

// startSiteCtrNode starts the containerd node's agent with the images of
// archive, the eBPF dataplane and cluster DNS on labDNSAddr.
func (s *siteLab) startSiteCtrNode(t *testing.T, archive string) {
	pins := fmt.Sprintf("/sys/fs/bpf/tether-sites-%d", os.Getpid())
	t.Cleanup(func() { _ = os.RemoveAll(pins) }) // unpinning detaches the programs
	n := startCtrNode(t, s.l, s.h, ctrNodeName, siteA, []string{archive},
		"--dataplane", "ebpf", "--dataplane-cgroup", containersCgroup(t), "--bpf-pin-dir", pins, "--uplinks", "none",
		"--dns-addr", labDNSAddr, "--dns-upstream", s.l.Hub().Addr+":53")
	s.ctr = n
	s.mu.Lock()
	s.edges[ctrNodeName] = n.agent
	s.mu.Unlock()
}

// applyCtrWorkloads creates the web Service, its pods and the probe pod.
// They are pinned to alpha-n1, which runs the sim runtime when no
// containerd node can run here.
func (s *siteLab) applyCtrWorkloads(t *testing.T) {
	s.h.applyManifest(t, fmt.Sprintf(ctrWorkloads, images.Echo, ctrNodeName))
	ctx, cancel := ctx10()
	svc, err := s.c.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	s.webIP = svc.Spec.ClusterIP
	s.h.applyManifest(t, fmt.Sprintf(ctrProbePod, images.Sleeper, ctrNodeName, webByName, s.webByIP(), steadyByName))
}

func (s *siteLab) webByIP() string { return "http://" + s.webIP + "/" }

// ctrPods are the number of pods applyCtrWorkloads creates.
const ctrPods = 3

// ctrServes checks that the containerd node runs its pods, then puts up
// the sim pods' stand-ins and waits until the probe pod's connections
// reach every backend: the web pods by name and by ClusterIP, and the
// steady Service's three (the containerd node's own pod and the two
// stand-ins).
func (s *siteLab) ctrServes(t *testing.T) {
	if s.ctr == nil {
		t.Skipf("%s runs the sim runtime: %s", ctrNodeName, s.ctrWhy)
	}
	for _, sel := range []string{"app=web", "app=probe", "app=steady"} {
		for _, p := range s.pods(sel) {
			s.ctr.track(&p)
		}
	}
	s.standins = map[string]string{}
	var ips []string
	for _, p := range s.pods("app=steady") {
		if p.Spec.NodeName != ctrNodeName {
			s.standins[p.Status.PodIP] = p.Spec.NodeName
			ips = append(ips, p.Status.PodIP)
		}
	}
	if len(ips) != 2 {
		t.Fatalf("want a steady pod with an IP on each sim node of %s, have %v", siteA, s.standins)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A bridge without ports: dummy links need a module the machine may
	// lack. Its addresses are local to the namespace all the same.
	cmds := [][]string{{"ip", "link", "add", "standin0", "type", "bridge"}, {"ip", "link", "set", "standin0", "up"}}
	for _, ip := range ips {
		cmds = append(cmds, []string{"ip", "addr", "add", ip + "/32", "dev", "standin0"})
	}
	for _, c := range cmds {
		if out, err := s.l.Exec(ctx, ctrNodeName, c...); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	// The stand-ins serve until the whole test ends, not this subtest.
	for _, ip := range ips {
		ln, _ := listenIn(s.t, s.l, ctrNodeName, "tcp", ip+":8080")
		body := fmt.Sprintf("stand-in for %s\n", s.standins[ip])
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, body)
		}), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		s.t.Cleanup(func() { _ = srv.Close() })
	}
	start := time.Now()
	took := waitSite(t, "the probe pod reaches web by name and ClusterIP and all three steady backends", 60*time.Second, func() (bool, string) {
		ps, err := s.probes(start)
		if err != nil {
			return false, err.Error()
		}
		seen := map[string]bool{}
		for _, p := range ps {
			if p.ok {
				seen[p.url+" "+p.answerer()] = true
			}
		}
		ok := seen[webByName+" web"] && seen[s.webByIP()+" web"] && seen[steadyByName+" steady"]
		for _, n := range s.standins {
			ok = ok && seen[steadyByName+" "+n]
		}
		var got []string
		for k := range seen {
			got = append(got, k)
		}
		slices.Sort(got)
		return ok, fmt.Sprintf("%d probes; reached %v", len(ps), got)
	})
	t.Logf("the probe pod on %s reached web and steady's three backends %v after the stand-ins came up", ctrNodeName, took.Round(time.Millisecond))
}

// probe is one attempt of the probe pod.
type probe struct {
	at   time.Time
	url  string
	ok   bool
	text string // the answer's first line, or the error
}

// answerer names who answered a probe: "web" or "steady" for a pod of
// that name, the node of a stand-in, or "" after an error.
func (p probe) answerer() string {
	if !p.ok {
		return ""
	}
	if n, found := strings.CutPrefix(p.text, "stand-in for "); found {
		return n
	}
	if pod, found := strings.CutPrefix(p.text, "hello from "); found {
		app, _, _ := strings.Cut(pod, "-")
		return app
	}
	return p.text
}

// probes reads the probe pod's attempts since from its container log on
// the node's disk, which the test reads as the machine would: the hub
// cannot reach the node while its site is dark.
func (s *siteLab) probes(since time.Time) ([]probe, error) {
	logs, err := filepath.Glob(filepath.Join(s.ctr.data, "logs", "default_probe_*", "probe", "*.log"))
	if err != nil || len(logs) == 0 {
		return nil, fmt.Errorf("no log of the probe pod on %s (%v)", ctrNodeName, err)
	}
	var out []probe
	for _, f := range logs {
		file, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(file)
		for sc.Scan() {
			// TIME STREAM TAG probe UNIXMS URL ok|err TEXT
			f := strings.SplitN(sc.Text(), " ", 8)
			if len(f) < 7 || f[2] != "F" || f[3] != "probe" {
				continue
			}
			ms, err := strconv.ParseInt(f[4], 10, 64)
			if err != nil {
				continue
			}
			p := probe{at: time.UnixMilli(ms), url: f[5], ok: f[6] == "ok"}
			if len(f) == 8 {
				p.text = f[7]
			}
			if !p.at.Before(since) {
				out = append(out, p)
			}
		}
		file.Close()
	}
	slices.SortFunc(out, func(a, b probe) int { return a.at.Compare(b.at) })
	return out, nil
}

// ctrContainers lists the containerd node's running containers by ID
// with their PIDs.
func (s *siteLab) ctrContainers(t *testing.T) map[string]int {
	cs, err := s.ctr.containers()
	if err != nil {
		t.Fatalf("containers of %s: %v", ctrNodeName, err)
	}
	out := map[string]int{}
	for id, c := range cs {
		if c.Status == "RUNNING" {
			out[id] = c.PID
		}
	}
	return out
}

// ctrDark checks, from the containerd node, that while alpha is cut off
// every connection of the probe pod to the web Service, by name (the
// agent's DNS) and by ClusterIP (the eBPF dataplane), was answered by a
// web pod, without a gap, and that no container of the node stopped or was
// started again.
func (s *siteLab) ctrDark(t *testing.T, cut time.Time, healed <-chan struct{}) {
	before := s.ctrContainers(t)
	if len(before) < 4 {
		t.Errorf("%s runs %d containers at the cut, want at least 4 (steady, two web, probe): %v", ctrNodeName, len(before), before)
	}
	<-healed
	end := time.Now()
	after := s.ctrContainers(t)
	for id, pid := range before {
		if after[id] != pid {
			t.Errorf("container %s of %s ran as PID %d at the cut and as %d at the heal (0: stopped)", id, ctrNodeName, pid, after[id])
		}
	}
	for id := range after {
		if _, ok := before[id]; !ok {
			t.Errorf("container %s of %s started while the site was dark", id, ctrNodeName)
		}
	}
	ps, err := s.probes(cut)
	if err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{webByName, s.webByIP()} {
		var n, bad int
		var lastBad string
		gap, last := time.Duration(0), cut
		for _, p := range ps {
			if p.url != url || !p.at.Before(end) {
				continue
			}
			n++
			if p.answerer() != "web" {
				bad++
				lastBad = fmt.Sprintf("%v after the cut: %s", p.at.Sub(cut).Round(time.Millisecond), p.text)
				continue
			}
			gap, last = max(gap, p.at.Sub(last)), p.at
		}
		gap = max(gap, end.Sub(last))
		dark := end.Sub(cut)
		t.Logf("%s from the probe pod on %s: %d connections in %v of darkness, %d not answered by a web pod, longest time without an answer %v",
			url, ctrNodeName, n, dark.Round(time.Second), bad, gap.Round(time.Millisecond))
		if bad > 0 {
			t.Errorf("%s: %d of %d connections from %s not answered by a web pod while dark; last %s", url, bad, n, ctrNodeName, lastBad)
		}
		if want := int(dark / time.Second); n < want {
			t.Errorf("%s: only %d probes in %v of darkness, want at least %d", url, n, dark.Round(time.Second), want)
		}
		if gap > 3*time.Second {
			t.Errorf("%s: %v without an answer while dark", url, gap.Round(time.Millisecond))
		}
	}
}

// ctrLeavesLB checks, from the containerd node, that the connections of
// the probe pod to the steady Service reached victim's pod (its stand-in)
// before victim lost its power and never from 10 s after it on.
func (s *siteLab) ctrLeavesLB(t *testing.T, victim string, off, cut time.Time) {
	if s.ctr == nil {
		t.Logf("%s runs the sim runtime (%s): its load balancing is not checked", ctrNodeName, s.ctrWhy)
		return
	}
	time.Sleep(time.Until(off.Add(14 * time.Second)))
	ps, err := s.probes(cut)
	if err != nil {
		t.Fatal(err)
	}
	var reachedBefore, lateReach, late, lateBad int
	var lastReach time.Duration
	for _, p := range ps {
		if p.url != steadyByName {
			continue
		}
		since := p.at.Sub(off)
		if since >= 10*time.Second {
			late++
			if p.answerer() == "" {
				lateBad++
			}
		}
		if p.answerer() != victim {
			continue
		}
		switch {
		case since < 0:
			reachedBefore++
		case since >= 10*time.Second:
			lateReach++
		default:
			lastReach = since
		}
	}
	if reachedBefore == 0 {
		t.Errorf("no connection of the probe pod on %s to steady reached %s's pod while the site was dark and %s up: the check means nothing", ctrNodeName, victim, victim)
	}
	if lateReach > 0 {
		t.Errorf("%d connections of the probe pod on %s to steady reached %s's pod 10 s or more after its power cut", lateReach, ctrNodeName, victim)
	}
	if late < 5 || lateBad > 0 {
		t.Errorf("%d connections to steady from %s between 10 s and 14 s after %s's power cut, %d of them unanswered; want at least 5, all answered", late, ctrNodeName, victim, lateBad)
	}
	t.Logf("%s's pod left %s's load balancing of steady: %d connections reached it while dark before its power cut, the last one %v after the cut, none of %d from 10 s on",
		victim, ctrNodeName, reachedBefore, lastReach.Round(time.Millisecond), late)
}
