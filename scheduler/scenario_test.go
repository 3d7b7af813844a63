package scheduler

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// A scenario file describes a cluster and the pods to schedule on it, one
// case after another on the same snapshot. See testdata/README.md.
type scenario struct {
	Description              string            `json:"description"`
	PercentageOfNodesToScore int               `json:"percentageOfNodesToScore"`
	Nodes                    []scenarioNode    `json:"nodes"`
	Pods                     []scenarioPod     `json:"pods"`
	Objects                  []json.RawMessage `json:"objects"`
	Cases                    []scenarioCase    `json:"cases"`
}

// scenarioNode is a Node with shorthands: cpu, memory, pods and
// ephemeral-storage set allocatable; ready is the Ready condition (True
// unless given).
type scenarioNode struct {
	corev1.Node `json:",inline"`
	Name        string                  `json:"name"`
	Labels      map[string]string       `json:"labels"`
	CPU         string                  `json:"cpu"`
	Memory      string                  `json:"memory"`
	MaxPods     string                  `json:"pods"`
	Ephemeral   string                  `json:"ephemeral-storage"`
	Extended    map[string]string       `json:"extended"`
	Ready       string                  `json:"ready"`
	Taints      []corev1.Taint          `json:"taints"`
	Unsched     bool                    `json:"unschedulable"`
	Images      []corev1.ContainerImage `json:"images"`
}

// scenarioPod is a Pod with shorthands: name, namespace, labels, node,
// cpu and memory (one container requesting them), priority.
type scenarioPod struct {
	corev1.Pod `json:",inline"`
	Name       string            `json:"name"`
	Namespace  string            `json:"namespace"`
	Labels     map[string]string `json:"labels"`
	Node       string            `json:"node"`
	CPU        string            `json:"cpu"`
	Memory     string            `json:"memory"`
	Priority   *int32            `json:"priority"`
	Age        string            `json:"age"`
}

type scenarioCase struct {
	Name string      `json:"name"`
	Pod  scenarioPod `json:"pod"`
	// Repeat schedules that many copies (named NAME-0, NAME-1, ...), each
	// kept on its node.
	Repeat int `json:"repeat"`
	// Keep adds the scheduled pod to the snapshot for later cases.
	Keep   bool           `json:"keep"`
	Expect scenarioExpect `json:"expect"`
}

type scenarioExpect struct {
	Node  string   `json:"node"`
	Nodes []string `json:"nodes"`
	Error string   `json:"error"`
	// Preempt: the node preemption picks and its victims (namespace/name).
	Preempt *struct {
		Node    string   `json:"node"`
		Victims []string `json:"victims"`
	} `json:"preempt"`
	// Scores: exact total scores of feasible nodes.
	Scores map[string]int64 `json:"scores"`
	// CountByLabel: after Repeat, pods placed per value of node label Key.
	CountByLabel *struct {
		Key    string         `json:"key"`
		Counts map[string]int `json:"counts"`
	} `json:"countByLabel"`
}

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func (sn *scenarioNode) build() *corev1.Node {
	n := sn.Node.DeepCopy()
	if sn.Name != "" {
		n.Name = sn.Name
	}
	if sn.Labels != nil {
		n.Labels = sn.Labels
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	if _, ok := n.Labels[corev1.LabelHostname]; !ok {
		n.Labels[corev1.LabelHostname] = n.Name
	}
	if n.Status.Allocatable == nil {
		n.Status.Allocatable = corev1.ResourceList{}
	}
	set := func(name corev1.ResourceName, v, def string) {
		if v == "" {
			v = def
		}
		if v != "" {
			n.Status.Allocatable[name] = resource.MustParse(v)
		}
	}
	set(corev1.ResourceCPU, sn.CPU, "4")
	set(corev1.ResourceMemory, sn.Memory, "8Gi")
	set(corev1.ResourcePods, sn.MaxPods, "110")
	set(corev1.ResourceEphemeralStorage, sn.Ephemeral, "100Gi")
	for k, v := range sn.Extended {
		n.Status.Allocatable[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	n.Status.Capacity = n.Status.Allocatable
	ready := corev1.ConditionTrue
	if sn.Ready != "" {
		ready = corev1.ConditionStatus(sn.Ready)
	}
	if ready != "None" {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: ready})
	}
	n.Spec.Taints = append(n.Spec.Taints, sn.Taints...)
	n.Spec.Unschedulable = n.Spec.Unschedulable || sn.Unsched
	n.Status.Images = append(n.Status.Images, sn.Images...)
	return n
}

func (sp *scenarioPod) build(suffix string) *corev1.Pod {
	p := sp.Pod.DeepCopy()
	if sp.Name != "" {
		p.Name = sp.Name
	}
	p.Name += suffix
	if sp.Namespace != "" {
		p.Namespace = sp.Namespace
	}
	if p.Namespace == "" {
		p.Namespace = "default"
	}
	if sp.Labels != nil {
		p.Labels = sp.Labels
	}
	p.UID = types.UID(p.Namespace + "/" + p.Name)
	if sp.Node != "" {
		p.Spec.NodeName = sp.Node
	}
	if sp.Priority != nil {
		p.Spec.Priority = sp.Priority
	}
	if len(p.Spec.Containers) == 0 {
		p.Spec.Containers = []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}
	}
	if sp.CPU != "" || sp.Memory != "" {
		c := &p.Spec.Containers[0]
		if c.Resources.Requests == nil {
			c.Resources.Requests = corev1.ResourceList{}
		}
		if sp.CPU != "" {
			c.Resources.Requests[corev1.ResourceCPU] = resource.MustParse(sp.CPU)
		}
		if sp.Memory != "" {
			c.Resources.Requests[corev1.ResourceMemory] = resource.MustParse(sp.Memory)
		}
	}
	start := epoch
	if sp.Age != "" {
		d, err := time.ParseDuration(sp.Age)
		if err != nil {
			panic(err)
		}
		start = epoch.Add(-d)
	}
	p.CreationTimestamp = metav1.NewTime(start)
	if p.Spec.NodeName != "" && p.Status.StartTime == nil {
		p.Status.StartTime = &p.CreationTimestamp
	}
	return p
}

// scenarioEnv is a snapshot built from a scenario.
type scenarioEnv struct {
	snap *Snapshot
	prio *PriorityClasses
	d    *Decider
	// slim: every pod is dressed as a running pod and then given to the
	// scheduler as the pod informer keeps it, slimPod(dressPod(pod)).
	slim bool
	// trace records every outcome, for comparing runs.
	trace []string
}

// pod builds a scenario pod as the scheduler gets it.
func (env *scenarioEnv) pod(sp *scenarioPod, suffix string) *corev1.Pod {
	p := sp.build(suffix)
	if env.slim {
		p = slimPod(dressPod(p))
	}
	return p
}

func loadScenario(t *testing.T, sc *scenario, slim bool) *scenarioEnv {
	t.Helper()
	env := &scenarioEnv{snap: NewSnapshot(), prio: NewPriorityClasses(), d: NewDecider(1), slim: slim}
	env.d.PercentageOfNodesToScore = sc.PercentageOfNodesToScore
	for i := range sc.Nodes {
		env.snap.SetNode(sc.Nodes[i].build())
	}
	for _, raw := range sc.Objects {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
		if err != nil {
			t.Fatalf("decode object %s: %v", raw, err)
		}
		switch o := obj.(type) {
		case *corev1.PersistentVolumeClaim:
			if o.Namespace == "" {
				o.Namespace = "default"
			}
			if o.UID == "" {
				o.UID = types.UID(o.Namespace + "/" + o.Name)
			}
			env.snap.SetPVC(o)
		case *corev1.PersistentVolume:
			env.snap.SetPV(o)
		case *storagev1.StorageClass:
			env.snap.SetStorageClass(o)
		case *schedulingv1.PriorityClass:
			env.prio.Set(o)
		case *policyv1.PodDisruptionBudget:
			if o.Namespace == "" {
				o.Namespace = "default"
			}
			env.snap.SetPDB(o)
		case *corev1.Namespace:
			env.snap.SetNamespace(o)
		default:
			t.Fatalf("scenario object of unsupported kind %T", obj)
		}
	}
	for i := range sc.Pods {
		p := env.pod(&sc.Pods[i], "")
		if p.Spec.NodeName == "" {
			t.Fatalf("existing pod %s has no node", p.Name)
		}
		pi, err := NewPodInfo(p, env.prio.Resolve)
		if err != nil {
			t.Fatal(err)
		}
		env.snap.AddPod(pi, p.Spec.NodeName, false)
	}
	return env
}

func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var sc scenario
			if err := yaml.UnmarshalStrict(b, &sc); err != nil {
				t.Fatalf("parse %s: %v", f, err)
			}
			// Each scenario runs on the pods as written and again on
			// their slim copies, and must come out the same to the last
			// tie broken at random: the pod informer keeps only the slim
			// copy.
			var traces [2][]string
			for i, mode := range []string{"whole", "slim"} {
				env := loadScenario(t, &sc, mode == "slim")
				ok := t.Run(mode, func(t *testing.T) {
					for _, c := range sc.Cases {
						if !t.Run(c.Name, func(t *testing.T) { env.run(t, &c) }) {
							return
						}
					}
				})
				if !ok {
					return
				}
				traces[i] = env.trace
			}
			for i := range max(len(traces[0]), len(traces[1])) {
				if i >= len(traces[0]) || i >= len(traces[1]) || traces[0][i] != traces[1][i] {
					t.Errorf("slim pods decided otherwise: outcome %d of %d\nwhole: %s\n slim: %s", i+1, len(traces[0]),
						strings.Join(traces[0][i:], "\n       "), strings.Join(traces[1][i:], "\n       "))
					break
				}
			}
		})
	}
}

func (env *scenarioEnv) run(t *testing.T, c *scenarioCase) {
	n := max(c.Repeat, 1)
	placed := map[string]int{}
	for i := 0; i < n; i++ {
		suffix := ""
		if c.Repeat > 0 {
			suffix = fmt.Sprintf("-%d", i)
		}
		pod := env.pod(&c.Pod, suffix)
		pi, err := NewPodInfo(pod, env.prio.Resolve)
		if err != nil {
			t.Fatal(err)
		}
		if c.Expect.Scores != nil {
			got := env.d.Scores(env.snap, pi)
			env.trace = append(env.trace, fmt.Sprintf("%s scores %v", pod.Name, got))
			if !mapsEqual(got, c.Expect.Scores) {
				t.Errorf("scores = %v, want %v", got, c.Expect.Scores)
			}
		}
		dec := env.d.Decide(env.snap, pi)
		env.trace = append(env.trace, pod.Name+" decided "+decisionString(&dec))
		if dec.Err != nil {
			msg := dec.Err.Error()
			if c.Expect.Preempt != nil || strings.Contains(c.Expect.Error, "preemption:") {
				pr := env.d.Preempt(env.snap, pi, dec.Err)
				env.trace = append(env.trace, fmt.Sprintf("%s preempt %s %v %d %v %s", pod.Name, pr.Node, podKeys(pr.Victims),
					pr.PDBViolations, podKeys(pr.LosingNomination), pr.Msg))
				if pr.Node == "" {
					dec.Err.PostFilterMsg = pr.Msg
					msg = dec.Err.Error()
				}
				if c.Expect.Preempt != nil {
					var victims []string
					for _, v := range pr.Victims {
						victims = append(victims, v.Key())
					}
					sort.Strings(victims)
					want := slices.Clone(c.Expect.Preempt.Victims)
					sort.Strings(want)
					if pr.Node != c.Expect.Preempt.Node || !slices.Equal(victims, want) {
						t.Errorf("preemption = node %q victims %v, want node %q victims %v (msg %q)", pr.Node, victims, c.Expect.Preempt.Node, want, pr.Msg)
					}
				}
			}
			if c.Expect.Error == "" && c.Expect.Preempt == nil {
				t.Fatalf("pod %s: unschedulable: %s", pod.Name, msg)
			}
			if c.Expect.Error != "" && msg != c.Expect.Error {
				t.Errorf("pod %s: message\n got: %s\nwant: %s", pod.Name, msg, c.Expect.Error)
			}
			continue
		}
		if c.Expect.Error != "" || c.Expect.Preempt != nil {
			t.Fatalf("pod %s: scheduled on %s, want failure %q", pod.Name, dec.Node, c.Expect.Error)
		}
		if c.Expect.Node != "" && dec.Node != c.Expect.Node {
			t.Errorf("pod %s: node %s, want %s", pod.Name, dec.Node, c.Expect.Node)
		}
		if len(c.Expect.Nodes) > 0 && !slices.Contains(c.Expect.Nodes, dec.Node) {
			t.Errorf("pod %s: node %s, want one of %v", pod.Name, dec.Node, c.Expect.Nodes)
		}
		if c.Repeat > 0 || c.Keep {
			env.snap.AddPod(pi, dec.Node, true)
		}
		if cl := c.Expect.CountByLabel; cl != nil {
			placed[env.snap.Node(dec.Node).Labels[cl.Key]]++
		}
	}
	if cl := c.Expect.CountByLabel; cl != nil && !mapsEqual(placed, cl.Counts) {
		t.Errorf("placements by %s = %v, want %v", cl.Key, placed, cl.Counts)
	}
}

// decisionString renders everything a decision says.
func decisionString(dec *Decision) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node %q feasible %d/%d", dec.Node, dec.Feasible, dec.Evaluated)
	if dec.Err != nil {
		fmt.Fprintf(&b, " error %q helps %b", dec.Err.Error(), dec.Err.Helps)
	}
	for _, v := range dec.Volumes {
		fmt.Fprintf(&b, " volume %s/%s:%s", v.PVC.Namespace, v.PVC.Name, v.PV)
	}
	return b.String()
}

func podKeys(pods []*PodInfo) []string {
	keys := make([]string, len(pods))
	for i, p := range pods {
		keys[i] = p.Key()
	}
	return keys
}

func mapsEqual[V comparable](a, b map[string]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
