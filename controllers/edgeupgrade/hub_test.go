package edgeupgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
	"github.com/tether-edge/tether/hub/rbac/bootstrap"
	"github.com/tether-edge/tether/internal/fleetapi"
	"github.com/tether-edge/tether/internal/fleetapi/crds"
)

// hubArgs turn off the hub's own copy of the controller, which runs in
// the test process instead, and its node lifecycle, which would find the
// test's nodes silent (no agent renews their Leases).
var hubArgs = []string{"--controllers=*,-" + Name + ",-nodelifecycle"}

// hubEnv is a hub with the fleet kinds served and the controller running
// under its own ServiceAccount.
type hubEnv struct {
	*kittest.Env
	dyn dynamic.Interface
}

func startHub(t *testing.T) *hubEnv {
	t.Helper()
	e := kittest.Start(t, hubArgs, 0)
	// The controller starts before the kinds are served, as it may in a
	// hub: it waits for them.
	user, groups := bootstrap.ControllerUser(bootstrap.AccountFor(Name))
	rc, err := clientcmd.BuildConfigFromFlags("", e.Hub.UserKubeconfig(user, groups...))
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 500, 1000
	factory := e.Factory()
	c, err := New(Config{Client: kubernetes.NewForConfigOrDie(rc), Informers: factory, RestConfig: rc, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, factory, c)
	ctx := context.Background()
	ext := apiextensionsclient.NewForConfigOrDie(e.Rest)
	defs, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range defs {
		if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, d, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		kittest.WaitFor(t, d.Name+" established", 20*time.Second, func() (bool, error) {
			got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, d.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
	}
	return &hubEnv{Env: e, dyn: dynamic.NewForConfigOrDie(e.Rest)}
}

// release creates the Release of version for amd64 edge agents, labelled
// as the hub labels the releases it imports (the hub refuses an
// EdgeUpgrade of a version no Release is labelled with).
func (e *hubEnv) release(t *testing.T, version string) {
	t.Helper()
	spec := fleetapi.ReleaseSpec{Version: version, Arch: "amd64", Build: fleetapi.BuildEdge,
		Digest: "sha256:" + strings.Repeat("ab", 32), Size: 1 << 20, Signature: "not checked here", Signer: "not checked here"}
	e.create(t, fleetapi.ReleasesResource, &fleetapi.Release{
		TypeMeta: metav1.TypeMeta{APIVersion: fleetapi.ReleaseKind.GroupVersion().String(), Kind: fleetapi.ReleaseKind.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: fleetapi.ReleaseName(version, spec.Build, spec.Arch), Labels: map[string]string{
			fleetapi.LabelVersion: version, fleetapi.LabelArch: spec.Arch, fleetapi.LabelBuild: spec.Build}},
		Spec: spec,
	})
}

// create creates obj, a fleetapi object, as the admin.
func (e *hubEnv) create(t *testing.T, res schema.GroupVersionResource, obj any) {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.dyn.Resource(res).Create(context.Background(), &unstructured.Unstructured{Object: m}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// rollout creates an EdgeUpgrade of spec named name.
func (e *hubEnv) rollout(t *testing.T, name string, spec fleetapi.EdgeUpgradeSpec) {
	t.Helper()
	e.create(t, fleetapi.EdgeUpgradesResource, &fleetapi.EdgeUpgrade{
		TypeMeta:   metav1.TypeMeta{APIVersion: fleetapi.EdgeUpgradeKind.GroupVersion().String(), Kind: fleetapi.EdgeUpgradeKind.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       spec,
	})
}

// patchRollout merge-patches EdgeUpgrade name's spec.
func (e *hubEnv) patchRollout(t *testing.T, name, spec string) {
	t.Helper()
	if _, err := e.dyn.Resource(fleetapi.EdgeUpgradesResource).Patch(context.Background(), name, types.MergePatchType,
		[]byte(`{"spec":`+spec+`}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (e *hubEnv) deleteRollout(t *testing.T, name string) {
	t.Helper()
	if err := e.dyn.Resource(fleetapi.EdgeUpgradesResource).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (e *hubEnv) get(t *testing.T, name string) *fleetapi.EdgeUpgrade {
	t.Helper()
	u, err := e.dyn.Resource(fleetapi.EdgeUpgradesResource).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	up, _, err := toUpgrade(u)
	if err != nil {
		t.Fatal(err)
	}
	return up
}

// waitPhase waits until rollout name reports phase for its current
// generation, and returns it.
func (e *hubEnv) waitPhase(t *testing.T, name, phase string, timeout time.Duration) *fleetapi.EdgeUpgrade {
	t.Helper()
	var up *fleetapi.EdgeUpgrade
	kittest.WaitFor(t, name+" "+phase, timeout, func() (bool, error) {
		up = e.get(t, name)
		return up.Status.ObservedGeneration == up.Generation && up.Status.Phase == phase, nil
	})
	return up
}

// node creates a Node as its agent would register it: Ready, amd64,
// running v1.
func (e *hubEnv) node(t *testing.T, name, arch string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	n, err := e.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	n.Status.NodeInfo = corev1.NodeSystemInfo{Architecture: arch, KubeletVersion: "v1.37.2-tether+v1", OperatingSystem: "linux"}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := e.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// behaviour is what a fake agent does when asked for a release.
type behaviour int

const (
	upgrade  behaviour = iota // runs it after a moment
	rollBack                  // reports RolledBack
	silent                    // never answers
)

// agents plays the agents of the test's nodes: when a node carries a
// request it has not answered, it answers as its behaviour says.
type agents struct {
	e        *hubEnv
	versions map[string]string // release → version
	mu       sync.Mutex
	act      map[string]behaviour
	answered map[string]string // node → the asked-at answered
	asked    []string          // nodes in the order they were first seen asked, per request
}

func (a *agents) set(node string, b behaviour) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.act[node] = b
}

// takeAsked returns and forgets the nodes seen asked so far.
func (a *agents) takeAsked() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.asked
	a.asked = nil
	return out
}

// run answers requests every 50ms until ctx ends. An upgrade answers
// 300ms after the request was seen, so that a batch is seen upgrading.
func (a *agents) run(ctx context.Context, t *testing.T) {
	seen := map[string]time.Time{}
	for ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		nl, err := a.e.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		var fresh []string
		for i := range nl.Items {
			n := &nl.Items[i]
			rel, at := n.Annotations[fleetapi.AnnotationRelease], n.Annotations[fleetapi.AnnotationAskedAt]
			a.mu.Lock()
			b, done := a.act[n.Name], a.answered[n.Name] == rel+"@"+at
			a.mu.Unlock()
			if rel == "" || done {
				continue
			}
			first, ok := seen[n.Name+rel+at]
			if !ok {
				seen[n.Name+rel+at] = time.Now()
				if b != silent {
					fresh = append(fresh, n.Name)
				}
				continue
			}
			if b == silent || time.Since(first) < 300*time.Millisecond {
				continue
			}
			c := corev1.NodeCondition{Type: fleetapi.ConditionAgentUpgrade, LastTransitionTime: metav1.Now()}
			switch b {
			case upgrade:
				n.Status.NodeInfo.KubeletVersion = "v1.37.2-tether+" + a.versions[rel]
				c.Status, c.Reason, c.Message = corev1.ConditionTrue, fleetapi.ReasonUpgraded, fleetapi.UpgradeMessage(rel, "committed")
			case rollBack:
				c.Status, c.Reason, c.Message = corev1.ConditionFalse, fleetapi.ReasonRolledBack, fleetapi.UpgradeMessage(rel, "the new agent did not become healthy")
			}
			n.Status.Conditions = slices.DeleteFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == fleetapi.ConditionAgentUpgrade })
			n.Status.Conditions = append(n.Status.Conditions, c)
			if _, err := a.e.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
				continue // conflict: again at the next round
			}
			a.mu.Lock()
			a.answered[n.Name] = rel + "@" + at
			a.mu.Unlock()
		}
		slices.Sort(fresh)
		a.mu.Lock()
		a.asked = append(a.asked, fresh...)
		a.mu.Unlock()
	}
}

// inProgress counts the nodes carrying a request of rollout name they
// have not answered yet.
func (e *hubEnv) inProgress(t *testing.T, name string) int {
	nl, err := e.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, node := range nl.Items {
		rel := node.Annotations[fleetapi.AnnotationRelease]
		if node.Annotations[fleetapi.AnnotationEdgeUpgrade] != name || rel == "" {
			continue
		}
		c := upgradeCondition(&node)
		if c == nil || fleetapi.UpgradeRelease(c.Message) != rel {
			n++
		}
	}
	return n
}

func condition(up *fleetapi.EdgeUpgrade, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(up.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// events returns the reasons of the events about rollout name.
func (e *hubEnv) events(t *testing.T, name string) []string {
	t.Helper()
	el, err := e.Client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range el.Items {
		out = append(out, ev.Reason)
	}
	return out
}

func (e *hubEnv) nodeObj(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := e.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestRolloutAgainstHub runs the controller under its ServiceAccount
// against a hub, with the test playing the agents of six nodes on two
// sites (and two more for a timeout and a missing release): batches in
// name order, a closed window, spec.paused, a node selector, a rollback
// pausing the rollout and a new generation retrying it. The nudges reach
// no node server (no agent holds a tunnel) and are ignored.
func TestRolloutAgainstHub(t *testing.T) {
	e := startHub(t)
	for _, v := range []string{"v2", "v3", "v4", "v5"} {
		e.release(t, v)
	}
	var main []string
	for _, site := range []string{"a", "b"} {
		for i := range 3 {
			name := fmt.Sprintf("%s-%d", site, i)
			main = append(main, name)
			e.node(t, name, "amd64", map[string]string{"tier": "main", corev1.LabelTopologyZone: "site-" + site})
		}
	}
	e.node(t, "quiet", "amd64", map[string]string{"tier": "quiet"})
	e.node(t, "risc", "riscv64", map[string]string{"tier": "risc"})
	a := &agents{e: e, act: map[string]behaviour{"quiet": silent}, answered: map[string]string{}, versions: map[string]string{}}
	for _, v := range []string{"v2", "v3", "v4", "v5"} {
		a.versions[fleetapi.ReleaseName(v, fleetapi.BuildEdge, "amd64")] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	agentsDone := make(chan struct{})
	go func() { defer close(agentsDone); a.run(ctx, t) }()
	t.Cleanup(func() { cancel(); <-agentsDone })

	tier := func(v string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"tier": v}}
	}
	// Beside the rest: a node that never answers times out, a node
	// without a release fails at once.
	e.rollout(t, "quiet", fleetapi.EdgeUpgradeSpec{Version: "v2", NodeSelector: tier("quiet"), NodeTimeout: &metav1.Duration{Duration: 30 * time.Second}})
	e.rollout(t, "risc", fleetapi.EdgeUpgradeSpec{Version: "v2", NodeSelector: tier("risc")})
	quietStart := time.Now()

	t.Run("NoRelease", func(t *testing.T) {
		up := e.waitPhase(t, "risc", fleetapi.PhasePaused, 20*time.Second)
		if len(up.Status.Failures) != 1 || up.Status.Failures[0].Reason != fleetapi.ReasonNoRelease || up.Status.Failures[0].Node != "risc" ||
			up.Status.Failed != 1 || condition(up, ConditionPaused).Reason != ReasonFailureThreshold {
			t.Fatalf("status %s", dump(up.Status))
		}
		if n := e.nodeObj(t, "risc"); n.Annotations[fleetapi.AnnotationRelease] != "" || n.Annotations[AnnotationFailed] == "" {
			t.Fatalf("node annotations %v", n.Annotations)
		}
	})

	t.Run("Batches", func(t *testing.T) {
		two := intstr.FromInt32(2)
		e.rollout(t, "batches", fleetapi.EdgeUpgradeSpec{Version: "v2", NodeSelector: tier("main"), BatchSize: &two})
		most := 0
		kittest.WaitFor(t, "batches Complete", 30*time.Second, func() (bool, error) {
			most = max(most, e.inProgress(t, "batches"))
			up := e.get(t, "batches")
			return up.Status.Phase == fleetapi.PhaseComplete, nil
		})
		if most > 2 {
			t.Errorf("%d nodes upgrading at once, batch size 2", most)
		}
		if most < 2 {
			t.Errorf("never saw 2 nodes upgrading at once (most %d)", most)
		}
		if got := a.takeAsked(); !slices.Equal(got, main) {
			t.Errorf("nodes asked in order %v, want %v", got, main)
		}
		up := e.get(t, "batches")
		if up.Status.Nodes != 6 || up.Status.Upgraded != 6 || up.Status.Failed != 0 || condition(up, ConditionComplete).Reason != ReasonAllUpgraded {
			t.Fatalf("status %s", dump(up.Status))
		}
		kittest.WaitFor(t, "events", 10*time.Second, func() (bool, error) {
			ev := e.events(t, "batches")
			return slices.Contains(ev, EventNodeStarted) && slices.Contains(ev, EventNodeUpgraded) && slices.Contains(ev, EventComplete), nil
		})
		e.deleteRollout(t, "batches")
	})

	t.Run("WindowClosed", func(t *testing.T) {
		start := time.Now().UTC().Add(2 * time.Hour).Format("15:04")
		e.rollout(t, "later", fleetapi.EdgeUpgradeSpec{Version: "v3", NodeSelector: tier("main"),
			Window: &fleetapi.MaintenanceWindow{Start: start, Duration: metav1.Duration{Duration: time.Hour}}})
		up := e.waitPhase(t, "later", fleetapi.PhaseWaiting, 20*time.Second)
		if c := condition(up, ConditionProgressing); c.Status != metav1.ConditionFalse || c.Reason != ReasonWindowClosed {
			t.Fatalf("Progressing %+v", c)
		}
		time.Sleep(time.Second)
		if n := e.inProgress(t, "later"); n != 0 || len(a.takeAsked()) != 0 {
			t.Fatalf("%d nodes asked while the window is closed", n)
		}
		e.deleteRollout(t, "later")
	})

	t.Run("Paused", func(t *testing.T) {
		three := intstr.FromInt32(3)
		e.rollout(t, "held", fleetapi.EdgeUpgradeSpec{Version: "v3", NodeSelector: tier("main"), BatchSize: &three, Paused: true})
		up := e.waitPhase(t, "held", fleetapi.PhasePaused, 20*time.Second)
		if c := condition(up, ConditionPaused); c.Status != metav1.ConditionTrue || c.Reason != ReasonSpecPaused {
			t.Fatalf("Paused %+v", c)
		}
		time.Sleep(time.Second)
		if len(a.takeAsked()) != 0 {
			t.Fatal("nodes asked while paused")
		}
		e.patchRollout(t, "held", `{"paused":false}`)
		up = e.waitPhase(t, "held", fleetapi.PhaseComplete, 30*time.Second)
		if up.Status.Upgraded != 6 || condition(up, ConditionPaused).Status != metav1.ConditionFalse {
			t.Fatalf("status %s", dump(up.Status))
		}
		if got := a.takeAsked(); len(got) != 6 {
			t.Fatalf("asked %v", got)
		}
		e.deleteRollout(t, "held")
	})

	t.Run("NodeSelector", func(t *testing.T) {
		three := intstr.FromString("100%")
		limit := resource.MustParse("128Ki")
		e.rollout(t, "site-b", fleetapi.EdgeUpgradeSpec{Version: "v4", BatchSize: &three, BandwidthLimit: &limit,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelTopologyZone: "site-b"}}})
		up := e.waitPhase(t, "site-b", fleetapi.PhaseComplete, 30*time.Second)
		if up.Status.Nodes != 3 || up.Status.Upgraded != 3 {
			t.Fatalf("status %s", dump(up.Status))
		}
		if got := a.takeAsked(); !slices.Equal(got, []string{"b-0", "b-1", "b-2"}) {
			t.Fatalf("asked %v", got)
		}
		if l := e.nodeObj(t, "b-0").Annotations[fleetapi.AnnotationBandwidthLimit]; l != "131072" {
			t.Errorf("bandwidth limit annotation %q, want 131072", l)
		}
		for _, n := range main {
			want := "+v4"
			if strings.HasPrefix(n, "a-") {
				want = "+v3"
			}
			if v := e.nodeObj(t, n).Status.NodeInfo.KubeletVersion; !strings.HasSuffix(v, want) {
				t.Errorf("node %s runs %s, want %s", n, v, want)
			}
		}
		e.deleteRollout(t, "site-b")
	})

	t.Run("RolledBack", func(t *testing.T) {
		a.set("a-0", rollBack)
		e.rollout(t, "bad", fleetapi.EdgeUpgradeSpec{Version: "v5", NodeSelector: tier("main")})
		up := e.waitPhase(t, "bad", fleetapi.PhasePaused, 20*time.Second)
		f := up.Status.Failures
		if len(f) != 1 || f[0].Node != "a-0" || f[0].Reason != fleetapi.ReasonRolledBack || f[0].Release != "v5-edge-amd64" ||
			!strings.Contains(f[0].Message, "did not become healthy") || condition(up, ConditionPaused).Reason != ReasonFailureThreshold {
			t.Fatalf("status %s", dump(up.Status))
		}
		n := e.nodeObj(t, "a-0")
		if n.Annotations[fleetapi.AnnotationRelease] != "" || n.Annotations[fleetapi.AnnotationAskedAt] != "" || n.Annotations[AnnotationFailed] == "" {
			t.Fatalf("a-0 annotations %v", n.Annotations)
		}
		time.Sleep(time.Second)
		if got := a.takeAsked(); !slices.Equal(got, []string{"a-0"}) {
			t.Fatalf("asked %v, want only a-0 before the pause", got)
		}
		kittest.WaitFor(t, "failed and paused events", 10*time.Second, func() (bool, error) {
			ev := e.events(t, "bad")
			return slices.Contains(ev, EventNodeFailed) && slices.Contains(ev, EventPaused), nil
		})
		// A new generation tolerating one failure tries a-0 again (it
		// rolls back again) and goes on with the others.
		e.patchRollout(t, "bad", `{"failureThreshold":1}`)
		up = e.waitPhase(t, "bad", fleetapi.PhaseComplete, 30*time.Second)
		if up.Status.Upgraded != 5 || up.Status.Failed != 1 || len(up.Status.Failures) != 2 || condition(up, ConditionComplete).Reason != ReasonSomeFailed {
			t.Fatalf("status %s", dump(up.Status))
		}
		if got := a.takeAsked(); len(got) != 6 || got[0] != "a-0" {
			t.Fatalf("asked %v after the edit", got)
		}
	})

	t.Run("TimedOut", func(t *testing.T) {
		up := e.waitPhase(t, "quiet", fleetapi.PhasePaused, 30*time.Second+time.Until(quietStart.Add(20*time.Second)))
		f := up.Status.Failures
		if len(f) != 1 || f[0].Node != "quiet" || f[0].Reason != fleetapi.ReasonTimedOut || time.Since(quietStart) < 29*time.Second {
			t.Fatalf("after %v: status %s", time.Since(quietStart), dump(up.Status))
		}
		if n := e.nodeObj(t, "quiet"); n.Annotations[fleetapi.AnnotationRelease] != "" {
			t.Fatalf("quiet still asked: %v", n.Annotations)
		}
	})
}
