// Package kittest runs workload controllers against a real hub in tests: it
// starts a `tether hub` process, joins hollow nodes (real edge agents with
// the sim runtime) so pods are scheduled, started and reported Ready, and
// runs the controllers under test in-process on a shared typed informer
// factory.
package kittest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/edge/sim"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/hub/rbac/bootstrap"
	"github.com/tether-edge/tether/testbench/hollow"
)

// Env is a hub with hollow nodes.
type Env struct {
	Hub    *hubtest.Hub
	Rest   *rest.Config
	Client kubernetes.Interface
	Log    *slog.Logger
	token  string
	fleets []*hollow.Fleet
}

// Runner is a controller: New registered its informers, Run blocks.
type Runner interface {
	Run(ctx context.Context) error
}

// Start runs a hub with hubArgs and joins nodes hollow nodes named
// node-00000, node-00001, …; it waits until they are registered and Ready.
func Start(t testing.TB, hubArgs []string, nodes int) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a hub process and hollow nodes")
	}
	h := hubtest.Start(t, hubArgs...)
	out, err := exec.Command(h.Bin, "token", "create", "--kubeconfig", h.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("tether token create: %v\n%s", err, h.Logs())
	}
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 500, 1000
	level := slog.LevelInfo
	if os.Getenv("TETHER_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	var w io.Writer = testWriter{t}
	e := &Env{
		Hub: h, Rest: rc, Client: kubernetes.NewForConfigOrDie(rc),
		Log:   slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})),
		token: strings.TrimSpace(string(out)),
	}
	if nodes > 0 {
		e.AddNodes(t, "node-", nodes)
	}
	return e
}

// AddNodes joins n more hollow nodes named prefix00000, prefix00001, …
// and waits until they are registered.
func (e *Env) AddNodes(t testing.TB, prefix string, n int) *hollow.Fleet {
	t.Helper()
	return e.JoinNodes(t, Nodes{Prefix: prefix, N: n}).Fleet
}

// Nodes describes hollow nodes to join.
type Nodes struct {
	// Prefix starts the node names; N nodes are named Prefix00000, ….
	Prefix string
	N      int
	// Sim configures their runtimes; a zero StartDelay means 50ms.
	Sim sim.Config
	// HeartbeatInterval is their tunnels' heartbeat period, which the hub
	// turns into Lease renewals; zero means the tunnel's default.
	HeartbeatInterval time.Duration
	// StatusCheckInterval is how often they compute their node status;
	// zero means the agent's default.
	StatusCheckInterval time.Duration
}

// Fleet is a set of joined hollow nodes.
type Fleet struct {
	*hollow.Fleet
	e    *Env
	cfg  hollow.Config
	stop func()
}

// Stop stops the fleet's agents, as if their machines went off: their
// tunnels close and nothing of theirs is deleted. Safe to call twice.
func (f *Fleet) Stop() { f.stop() }

// Restart stops the fleet's agents if they run and starts new ones on the
// same data directories, as if their machines came back: they reconnect
// with the certificates they have, and their runtimes start empty. It
// waits until they are registered.
func (f *Fleet) Restart(t testing.TB) {
	t.Helper()
	f.stop()
	f.run(t)
}

// JoinNodes joins the hollow nodes nodes describes and waits until they
// are registered. They stop at the end of the test, if not before.
func (e *Env) JoinNodes(t testing.TB, nodes Nodes) *Fleet {
	t.Helper()
	n := nodes.N
	sc := nodes.Sim
	if sc.StartDelay == 0 {
		sc.StartDelay = 50 * time.Millisecond
	}
	f := &Fleet{e: e, cfg: hollow.Config{
		HubURL: "https://" + e.Hub.Addr, Token: e.token, N: n, DataDir: t.TempDir(),
		NamePrefix: nodes.Prefix, Sim: sc,
		StartWindow:       time.Duration(n) * 10 * time.Millisecond,
		HeartbeatInterval: nodes.HeartbeatInterval, StatusCheckInterval: nodes.StatusCheckInterval,
	}}
	f.run(t)
	return f
}

// run starts new agents for the fleet and waits until they are
// registered.
func (f *Fleet) run(t testing.TB) {
	t.Helper()
	n := f.cfg.N
	hf, err := hollow.New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hf.Run(ctx) }()
	var once sync.Once
	f.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Errorf("hollow nodes did not stop within 30s")
			}
		})
	}
	t.Cleanup(f.stop)
	f.Fleet = hf
	deadline := time.Now().Add(2*time.Minute + time.Duration(n)*50*time.Millisecond)
	for {
		s := hf.Stats()
		if s.Registered == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hollow nodes: %d of %d registered: %s", s.Registered, n, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.e.fleets = append(f.e.fleets, hf)
}

// AgentWrites are the API writes of every hollow node so far.
type AgentWrites struct {
	// All counts every create, update, patch and delete the agents sent.
	All int64
	// PodStatus and NodeStatus count status patches of pods and nodes;
	// the rest of All is the agents' other writes (registration, pod
	// deletions once stopped).
	PodStatus, NodeStatus int64
}

// AgentWrites sums the writes of the hollow nodes' agents.
func (e *Env) AgentWrites() AgentWrites {
	var w AgentWrites
	for _, f := range e.fleets {
		for _, a := range f.Agents() {
			s := a.Stats()
			w.All += s.Writes
			w.PodStatus += s.PodStatusWrites
			w.NodeStatus += s.NodeStatusWrites
		}
	}
	return w
}

// AgentPods is the number of pods the hollow nodes' agents run.
func (e *Env) AgentPods() int {
	n := 0
	for _, f := range e.fleets {
		n += f.Stats().Pods
	}
	return n
}

// ControllerClient returns a client acting as controller (its name in
// --controllers) does in the hub: its kube-system ServiceAccount, with a
// client certificate the hub's CA signs, so the controller under test is
// held to its system:controller: role.
func (e *Env) ControllerClient(t testing.TB, controller string) kubernetes.Interface {
	t.Helper()
	account := bootstrap.AccountFor(controller)
	if account == "" {
		t.Fatalf("no account for controller %s", controller)
	}
	user, groups := bootstrap.ControllerUser(account)
	rc, err := clientcmd.BuildConfigFromFlags("", e.Hub.UserKubeconfig(user, groups...))
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 500, 1000
	return kubernetes.NewForConfigOrDie(rc)
}

// Factory returns a new informer factory on the hub.
func (e *Env) Factory() informers.SharedInformerFactory {
	return informers.NewSharedInformerFactory(e.Client, 0)
}

// Run starts factory and runs the controllers until the test ends.
func (e *Env) Run(t testing.TB, factory informers.SharedInformerFactory, ctrls ...Runner) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	done := make(chan error, len(ctrls))
	for _, c := range ctrls {
		go func() { done <- c.Run(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		for range ctrls {
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("controller: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("controller did not stop within 20s")
				return
			}
		}
		factory.Shutdown()
	})
}

// Kubectl runs kubectl and fails the test on error.
func (e *Env) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	return e.Hub.MustRun(args...)
}

// Apply runs `kubectl apply -f -` with manifest on its standard input and
// fails the test on error.
func (e *Env) Apply(t testing.TB, manifest string) string {
	t.Helper()
	out, err := e.Hub.RunInput(context.Background(), manifest, nil, "apply", "-f", "-")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ApplyObject applies obj with `kubectl apply`, as its JSON manifest: a
// test builds the object in Go and creates it as a user would.
func (e *Env) ApplyObject(t testing.TB, obj runtime.Object) string {
	t.Helper()
	gvks, _, err := scheme.Scheme.ObjectKinds(obj)
	if err != nil {
		t.Fatal(err)
	}
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(gvks[0])
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return e.Apply(t, string(b))
}

// WaitFor polls cond every 100ms until it holds or timeout passes.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var writeLine = regexp.MustCompile(`^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$`)
var labelRe = regexp.MustCompile(`(\w+)="([^"]*)"`)

// WritesBy returns the hub's count of create, update, patch and delete
// requests so far, from apiserver_request_total on its /metrics, by
// "verb resource[/subresource]".
func (e *Env) WritesBy(t testing.TB) map[string]float64 {
	t.Helper()
	body, err := e.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("read hub metrics: %v", err)
	}
	out := map[string]float64{}
	for line := range strings.SplitSeq(string(body), "\n") {
		m := writeLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		l := map[string]string{}
		for _, kv := range labelRe.FindAllStringSubmatch(m[1], -1) {
			l[kv[1]] = kv[2]
		}
		switch l["verb"] {
		case "create", "update", "patch", "delete", "deletecollection":
		default:
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		out[l["verb"]+" "+l["resource"]] += v
	}
	return out
}

// Writes sums WritesBy over the resources named (with or without a
// subresource: "pods" counts pods, pods/status and pods/binding).
func (e *Env) Writes(t testing.TB, resources ...string) float64 {
	t.Helper()
	var total float64
	for k, v := range e.WritesBy(t) {
		_, res, _ := strings.Cut(k, " ")
		base, _, _ := strings.Cut(res, "/")
		for _, r := range resources {
			if r == base {
				total += v
			}
		}
	}
	return total
}

// testWriter sends log lines to the test log while the test runs.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // a log line after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Name returns a name unique within the test binary run, for namespaces.
func Name(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1_000_000)
}

// Hub starts a hub process with hubArgs and returns it with an admin
// client config and client, allowed enough requests a second that a
// controller under test is never throttled.
func Hub(t testing.TB, hubArgs []string) (*hubtest.Hub, *rest.Config, kubernetes.Interface) {
	t.Helper()
	h := hubtest.Start(t, hubArgs...)
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 500, 1000
	return h, rc, kubernetes.NewForConfigOrDie(rc)
}
