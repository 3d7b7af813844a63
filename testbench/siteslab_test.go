package testbench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/testbench/images"
)

// The site lab: two gossiping sites of three nodes each and a third site
// whose agents run without --site (heartbeats only), all behind NAT, with
// a real hub. Every node runs the sim runtime but alpha-n1, a containerd
// node (sitesctr_test.go). The scenarios of sites_test.go run in it side
// by side.

const (
	siteA, siteB, siteHB = "alpha", "beta", "hb"
	// labDNSAddr is where every node's agent serves cluster DNS.
	labDNSAddr = "169.254.20.10"
	// The taints the hub's node lifecycle sets.
	taintDead        = "node.tether.io/dead"
	taintUnreachable = "node.kubernetes.io/unreachable"
	// gossipPort is the agents' default memberlist port.
	gossipPort = 7946
)

// sitesFull selects the acceptance lengths (a 10 minute dark site, more
// detection samples) instead of the CI ones.
func sitesFull() bool { return os.Getenv("TETHER_SITES_FULL") != "" }

type siteLab struct {
	t     *testing.T
	l     *Lab
	h     *labHub
	c     kubernetes.Interface
	token string

	// ctr is alpha-n1 when it runs containerd (see sitesctr_test.go);
	// nil with ctrWhy saying why it runs the sim runtime instead.
	ctr      *ctrNode
	ctrWhy   string
	webIP    string            // the web Service's ClusterIP
	standins map[string]string // sim pod IP -> its node, answered on ctr

	mu    sync.Mutex
	edges map[string]*Process
}

func siteNodes(site string) []string {
	return []string{site + "-n1", site + "-n2", site + "-n3"}
}

// newSiteLab builds the lab, starts the hub and the nine agents, alpha-n1
// a containerd one when the machine can run it, and waits until every node
// is Ready.
func newSiteLab(t *testing.T) *siteLab {
	requireRoot(t)
	link := LinkParams{Rate: 4_000_000, Delay: Duration(20 * time.Millisecond)}
	cfg := Config{Spec: Spec{Sites: []SiteSpec{
		{Name: siteA, Nodes: 3, Link: link},
		{Name: siteB, Nodes: 3, Link: link},
		{Name: siteHB, Nodes: 3, Link: link},
	}}, Output: t.Output(), Log: slog.New(slog.NewTextHandler(t.Output(), nil))}
	why := containerdNodeMissing()
	archive := ""
	if why == "" {
		// containerd's overlayfs snapshots cannot have their upper
		// directories on the FUSE delay layer; no scenario slows a disk.
		cfg.PlainDisks = true
		cfg.Spec.DiskSize = 512
		archive = filepath.Join(t.TempDir(), "test-images.tar")
		start := time.Now()
		if err := images.Build(archive); err != nil {
			t.Fatalf("build test images: %v", err)
		}
		t.Logf("built the test images for %s in %v", ctrNodeName, time.Since(start).Round(time.Millisecond))
	} else {
		t.Logf("%s runs the sim runtime: %s", ctrNodeName, why)
	}
	l, err := Up(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	h := startLabHub(t, l)
	s := &siteLab{t: t, l: l, h: h, token: h.token(time.Hour), edges: map[string]*Process{}, ctrWhy: why}
	s.c = s.client()
	start := time.Now()
	for _, site := range []string{siteA, siteB, siteHB} {
		for _, n := range siteNodes(site) {
			if n == ctrNodeName && why == "" {
				s.startSiteCtrNode(t, archive)
				continue
			}
			s.startAgent(n, site, site != siteHB)
		}
	}
	var all []string
	for _, site := range []string{siteA, siteB, siteHB} {
		all = append(all, siteNodes(site)...)
	}
	h.waitReady(120*time.Second, all...)
	t.Logf("every node Ready %v after the agents started", time.Since(start).Round(time.Millisecond))
	return s
}

// client is a client-go clientset for the admin that dials the hub from
// the hub's namespace.
func (s *siteLab) client() kubernetes.Interface {
	cfg, err := clientcmd.BuildConfigFromFlags("", s.h.kubeconfig())
	if err != nil {
		s.t.Fatal(err)
	}
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialIn(s.l, "hub", network, addr, 10*time.Second)
	}
	cfg.QPS, cfg.Burst = 200, 400
	cfg.Timeout = 20 * time.Second
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// startAgent runs `tether edge` with the sim runtime and cluster DNS on a
// node: with --site when gossip is on, else with --zone and no gossip
// port (heartbeats only).
func (s *siteLab) startAgent(node, site string, gossip bool) *Process {
	host := s.l.Host(node)
	args := []string{s.h.tether, "edge", "--hub", "https://" + s.h.api, "--token", s.token,
		"--data-dir", filepath.Join(host.DataDir, "edge"), "--name", node, "--runtime", "sim",
		"--sim-start-delay", "200ms", "--dns-addr", labDNSAddr, "--dns-upstream", s.l.Hub().Addr + ":53"}
	if gossip {
		args = append(args, "--site", site)
	} else {
		args = append(args, "--zone", site, "--gossip-port", "-1")
	}
	p, err := s.l.Start(node, "edge-"+node, args...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	s.mu.Lock()
	s.edges[node] = p
	s.mu.Unlock()
	return p
}

// powerOn starts a powered-off node's agent again.
func (s *siteLab) powerOn(t *testing.T, node string) {
	t.Helper()
	s.mu.Lock()
	p := s.edges[node]
	s.mu.Unlock()
	if err := p.Restart(); err != nil {
		t.Fatalf("power on %s: %v", node, err)
	}
}

// logTail returns the last n lines of a node agent's log.
func (s *siteLab) logTail(node string, n int) string {
	s.mu.Lock()
	p := s.edges[node]
	s.mu.Unlock()
	if p == nil {
		return ""
	}
	b, err := os.ReadFile(p.LogPath())
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func ctx10() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// node gets a Node; nil when the hub does not answer.
func (s *siteLab) node(name string) *corev1.Node {
	ctx, cancel := ctx10()
	defer cancel()
	n, err := s.c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return n
}

func readyOf(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

func readyMessage(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// taintsOf returns a node's taints as key:effect, sorted.
func taintsOf(n *corev1.Node) []string {
	var ts []string
	for _, t := range n.Spec.Taints {
		ts = append(ts, t.Key+":"+string(t.Effect))
	}
	sort.Strings(ts)
	return ts
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// onlyUnreachableNoSchedule tells whether a node's taints are exactly the
// unreachable NoSchedule one.
func onlyUnreachableNoSchedule(n *corev1.Node) bool {
	return slices.Equal(taintsOf(n), []string{taintUnreachable + ":NoSchedule"})
}

// pods lists the default namespace's pods matching selector; nil when
// the hub does not answer.
func (s *siteLab) pods(selector string) []corev1.Pod {
	ctx, cancel := ctx10()
	defer cancel()
	l, err := s.c.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil
	}
	return l.Items
}

func podRunning(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, c := range p.Status.ContainerStatuses {
		n += c.RestartCount
	}
	return n
}

// agentMetrics reads a node agent's /metrics through the hub's node
// proxy.
func (s *siteLab) agentMetrics(node string) (string, error) {
	ctx, cancel := ctx10()
	defer cancel()
	b, err := s.c.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node + "/proxy/metrics").DoRaw(ctx)
	return string(b), err
}

// hubMetrics reads the hub's /metrics.
func (s *siteLab) hubMetrics() (string, error) {
	ctx, cancel := ctx10()
	defer cancel()
	b, err := s.c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	return string(b), err
}

// sumMetric adds up the series of a metric whose labels contain every
// fragment of match; found is false when no series matched.
func sumMetric(text, name string, match ...string) (sum float64, found bool) {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || rest[0] != '{' && rest[0] != ' ' {
			continue
		}
		ok := true
		for _, m := range match {
			ok = ok && strings.Contains(rest, m)
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if ok && err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}

// agentCounter reads one counter of a node's agent; it fails t when the
// agent does not answer or does not have the metric.
func (s *siteLab) agentCounter(t *testing.T, node, name string, match ...string) float64 {
	t.Helper()
	text, err := s.agentMetrics(node)
	if err != nil {
		t.Fatalf("metrics of %s: %v", node, err)
	}
	v, ok := sumMetric(text, name, match...)
	if !ok {
		t.Fatalf("agent of %s has no metric %s%v", node, name, match)
	}
	return v
}

// lookup asks a node's agent DNS server for the A records of name.
func (s *siteLab) lookup(node, name string) ([]string, error) {
	var ips []string
	err := s.l.InHost(node, func() error {
		c := &mdns.Client{Timeout: time.Second}
		m := new(mdns.Msg)
		m.SetQuestion(mdns.Fqdn(name), mdns.TypeA)
		r, _, err := c.Exchange(m, labDNSAddr+":53")
		if err != nil {
			return err
		}
		if r.Rcode != mdns.RcodeSuccess {
			return fmt.Errorf("rcode %s", mdns.RcodeToString[r.Rcode])
		}
		for _, rr := range r.Answer {
			if a, ok := rr.(*mdns.A); ok {
				ips = append(ips, a.A.String())
			}
		}
		return nil
	})
	sort.Strings(ips)
	return ips, err
}

// waitSite polls ok every 200ms until it holds and returns how long that
// took, or fails t after timeout with what last said.
func waitSite(t *testing.T, what string, timeout time.Duration, ok func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	for {
		var done bool
		if done, last = ok(); done {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v; last: %s", what, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// joinAs runs a memberlist member named name in host, bound to bindIP
// with the gossip key key, and has it join target: what a stranger on the
// site's LAN would do. Creating and joining on the host's thread puts the
// member's sockets and its join in the host's namespace.
func (s *siteLab) joinAs(host, bindIP, name string, key []byte, target string) error {
	return s.l.InHost(host, func() error {
		c := memberlist.DefaultLANConfig()
		c.Name = name
		c.BindAddr = bindIP
		c.BindPort = 0
		c.SecretKey = key
		c.TCPTimeout = 2 * time.Second
		c.LogOutput = io.Discard
		ml, err := memberlist.Create(c)
		if err != nil {
			return fmt.Errorf("create member %s: %w", name, err)
		}
		defer ml.Shutdown()
		// The join is expected to fail; what counts is that target saw it.
		_, _ = ml.Join([]string{target})
		time.Sleep(500 * time.Millisecond)
		return nil
	})
}

// percentile returns the p-th percentile (0..1) of ds by the nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}
