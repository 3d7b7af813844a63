package edge

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
)

func testNodeInput() nodeInput {
	return nodeInput{
		name: "shop-12", ip: netip.MustParseAddr("192.0.2.7"), zone: "paris-3",
		labels: map[string]string{"example.com/role": "till"},
		info: RuntimeInfo{Name: "sim", Version: "0.1.0", Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
		}},
		capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
		host:     hostFacts{KernelVersion: "6.8.0", OSImage: "Debian GNU/Linux 13"},
		now:      t0,
	}
}

func TestNodeLabels(t *testing.T) {
	l := nodeLabels(testNodeInput())
	for k, v := range map[string]string{LabelHostname: "shop-12", LabelZone: "paris-3", "example.com/role": "till"} {
		if l[k] != v {
			t.Errorf("label %s = %q, want %q", k, l[k], v)
		}
	}
	if l[LabelOS] == "" || l[LabelArch] == "" {
		t.Errorf("no os/arch labels: %v", l)
	}
}

func TestBuildNodeStatus(t *testing.T) {
	st := buildNodeStatus(testNodeInput(), nil)
	if q := st.Capacity[corev1.ResourceCPU]; q.String() != "2" {
		t.Errorf("cpu capacity %s, want the override 2", q.String())
	}
	if q := st.Capacity[corev1.ResourcePods]; q.String() != "110" {
		t.Errorf("pods capacity %s, want 110", q.String())
	}
	if q := st.Allocatable[corev1.ResourceMemory]; q.String() != "8Gi" {
		t.Errorf("allocatable memory %s", q.String())
	}
	if len(st.Addresses) != 2 || st.Addresses[0] != (corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.0.2.7"}) ||
		st.Addresses[1] != (corev1.NodeAddress{Type: corev1.NodeHostName, Address: "shop-12"}) {
		t.Errorf("addresses %v", st.Addresses)
	}
	ni := st.NodeInfo
	if ni.ContainerRuntimeVersion != "sim://0.1.0" || ni.KubeletVersion != "v1.37.2-tether" || ni.KernelVersion != "6.8.0" || ni.OperatingSystem == "" {
		t.Errorf("nodeInfo %+v", ni)
	}
	types := map[corev1.NodeConditionType]corev1.ConditionStatus{}
	for _, c := range st.Conditions {
		types[c.Type] = c.Status
	}
	want := map[corev1.NodeConditionType]corev1.ConditionStatus{
		corev1.NodeReady: "True", corev1.NodeMemoryPressure: "False", corev1.NodeDiskPressure: "False", corev1.NodePIDPressure: "False",
	}
	for k, v := range want {
		if types[k] != v {
			t.Errorf("condition %s = %q, want %q", k, types[k], v)
		}
	}
	if _, ok := types[corev1.NodeNetworkUnavailable]; ok {
		t.Errorf("NetworkUnavailable set; upstream leaves it to the network plugin")
	}

	// A runtime that does not answer makes the node not ready.
	in := testNodeInput()
	in.infoErr = errors.New("socket gone")
	for _, c := range buildNodeStatus(in, nil).Conditions {
		if c.Type == corev1.NodeReady && (c.Status != "False" || !strings.Contains(c.Message, "socket gone")) {
			t.Errorf("Ready with a dead runtime: %+v", c)
		}
	}
}

func TestNodeStatusPatchIsCompact(t *testing.T) {
	in := testNodeInput()
	first := buildNodeStatus(in, nil)
	in.now = t0.Add(5 * time.Minute)
	second := buildNodeStatus(in, &first)
	if !sameNodeStatus(first, second) {
		t.Fatal("heartbeat times alone count as a change")
	}
	for _, c := range second.Conditions {
		if !c.LastTransitionTime.Time.Equal(t0) {
			t.Fatalf("transition time of unchanged %s moved", c.Type)
		}
	}
	patch, err := statusPatch(corev1.Node{Status: first}, corev1.Node{Status: second}, corev1.Node{})
	if err != nil {
		t.Fatal(err)
	}
	// Only the four heartbeat times, keyed by condition type.
	var p struct {
		Status struct {
			Conditions []map[string]any `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Status.Conditions) != 4 || len(patch) > 400 {
		t.Fatalf("periodic patch is %d bytes: %s", len(patch), patch)
	}
	for _, c := range p.Status.Conditions {
		if len(c) != 2 || c["type"] == nil || c["lastHeartbeatTime"] == nil {
			t.Fatalf("condition patch carries more than the heartbeat: %v", c)
		}
	}
	t.Logf("periodic node status patch: %d bytes", len(patch))
}

func TestIsCollection(t *testing.T) {
	for path, want := range map[string]bool{
		"/api/v1/pods":                                            true,
		"/api/v1/namespaces/default/configmaps":                   true,
		"/api/v1/namespaces":                                      true,
		"/api/v1/namespaces/default":                              false,
		"/api/v1/nodes/shop-12":                                   false,
		"/api/v1/namespaces/default/pods/p/status":                false,
		"/apis/discovery.k8s.io/v1/endpointslices":                true,
		"/apis/discovery.k8s.io/v1/namespaces/a/endpointslices/b": false,
	} {
		if got := isCollection(path); got != want {
			t.Errorf("isCollection(%s) = %v, want %v", path, got, want)
		}
	}
}

type chanWatch struct{ ch chan watch.Event }

func (c *chanWatch) Stop()                          {}
func (c *chanWatch) ResultChan() <-chan watch.Event { return c.ch }

func TestWatchFailuresResume(t *testing.T) {
	// A watch that never reached the hub reads as "connection refused",
	// which reflectors retry from the same resourceVersion.
	lw := &listWatch{watch: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
		return nil, errors.New("stream reset by the hub")
	}}
	_, err := lw.WatchWithContext(context.Background(), metav1.ListOptions{})
	if !utilnet.IsConnectionRefused(err) {
		t.Fatalf("transport error %v does not read as connection refused", err)
	}
	// A watch cut at once without events lasts at least the minimum.
	in := &chanWatch{ch: make(chan watch.Event)}
	close(in.ch)
	start := time.Now()
	w := holdWatch(in, 200*time.Millisecond)
	for range w.ResultChan() {
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("empty watch closed after %v", d)
	}
	// Events pass through and a watch with events closes at once.
	in = &chanWatch{ch: make(chan watch.Event, 1)}
	in.ch <- watch.Event{Type: watch.Bookmark}
	close(in.ch)
	start = time.Now()
	n := 0
	for range holdWatch(in, time.Hour).ResultChan() {
		n++
	}
	if n != 1 || time.Since(start) > time.Second {
		t.Fatalf("%d events, closed after %v", n, time.Since(start))
	}
}

func TestBrokenWatchStreamEndsQuietly(t *testing.T) {
	// client-go turns a broken connection into an InternalError event;
	// passed on, it would make the reflector re-list.
	in := &chanWatch{ch: make(chan watch.Event, 2)}
	in.ch <- watch.Event{Type: watch.Added, Object: &corev1.Pod{}}
	in.ch <- watch.Event{Type: watch.Error, Object: &metav1.Status{Code: 500, Reason: metav1.StatusReasonInternalError,
		Message: `an error on the server ("unable to decode an event from the watch stream: stream reset") has prevented the request from succeeding`}}
	close(in.ch)
	var got []watch.EventType
	for ev := range holdWatch(in, time.Hour).ResultChan() {
		got = append(got, ev.Type)
	}
	if len(got) != 1 || got[0] != watch.Added {
		t.Fatalf("events %v, want only the ADDED one", got)
	}
}

func TestKubeletVersion(t *testing.T) {
	for agent, want := range map[string]string{
		"":                    "v1.37.2-tether",
		"v0.4.1":              "v1.37.2-tether+v0.4.1",
		"v0.4.1-3-gabc1234":   "v1.37.2-tether+v0.4.1-3-gabc1234",
		"devel":               "v1.37.2-tether+devel",
		"v0.5.0+dirty/fix me": "v1.37.2-tether+v0.5.0-dirty-fix-me",
	} {
		if got := KubeletVersion(agent); got != want {
			t.Errorf("KubeletVersion(%q) = %q, want %q", agent, got, want)
		}
	}
}

// TestExtraNodeCondition checks the condition set with SetNodeCondition:
// reported beside the kubelet's, its transition time kept while it stays
// the same and moved when its status, reason or message changes.
func TestExtraNodeCondition(t *testing.T) {
	in := testNodeInput()
	in.now = time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	in.extra = &corev1.NodeCondition{Type: "AgentUpgrade", Status: corev1.ConditionFalse, Reason: "Downloading", Message: "r1: 0 of 9 MB"}
	find := func(st corev1.NodeStatus) corev1.NodeCondition {
		for _, c := range st.Conditions {
			if c.Type == "AgentUpgrade" {
				return c
			}
		}
		t.Fatal("no AgentUpgrade condition")
		return corev1.NodeCondition{}
	}
	st := buildNodeStatus(in, nil)
	if len(st.Conditions) != 5 || find(st).Reason != "Downloading" {
		t.Fatalf("conditions: %+v", st.Conditions)
	}
	later := in
	later.now = in.now.Add(time.Minute)
	if c := find(buildNodeStatus(later, &st)); !c.LastTransitionTime.Time.Equal(in.now) || !c.LastHeartbeatTime.Time.Equal(later.now) {
		t.Errorf("unchanged condition: transition %v heartbeat %v", c.LastTransitionTime, c.LastHeartbeatTime)
	}
	later.extra = &corev1.NodeCondition{Type: "AgentUpgrade", Status: corev1.ConditionFalse, Reason: "RolledBack", Message: "r1: not healthy"}
	if c := find(buildNodeStatus(later, &st)); !c.LastTransitionTime.Time.Equal(later.now) {
		t.Errorf("a new reason kept the transition time %v", c.LastTransitionTime)
	}
}
