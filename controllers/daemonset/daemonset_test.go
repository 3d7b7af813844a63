package daemonset_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/controllers/daemonset"
	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-daemonset"}

func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("unexpected error: %v", err))
	}
	return v
}

func agent() *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "kube-system"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"name": "agent"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"name": "agent"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "fluentd:1"}}},
			},
		},
	}
}

// podsOnNodes returns the image of the live daemon pod on each node.
func podsOnNodes(t *testing.T, e *kittest.Env) map[string]string {
	t.Helper()
	list := must(e.Client.CoreV1().Pods("kube-system").List(context.Background(), metav1.ListOptions{LabelSelector: "name=agent"}))
	out := map[string]string{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Spec.NodeName != "" && kit.IsPodReady(&p) {
			out[p.Spec.NodeName] = p.Spec.Containers[0].Image
		}
	}
	return out
}

// TestDaemonSet runs a daemon on every node, keeps it off a tainted node
// until tolerated, adds one to a node that joins, and rolls out a new
// image with kubectl.
func TestDaemonSet(t *testing.T) {
	e := kittest.Start(t, hubArgs, 3)
	f := e.Factory()
	c, err := daemonset.New(daemonset.Config{Client: e.ControllerClient(t, "daemonset"), Informers: f, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, c)
	ctx := context.Background()
	nodes := must(e.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}))
	tainted := nodes.Items[0].Name
	e.Kubectl(t, "taint", "nodes", tainted, "dedicated=infra:NoSchedule")

	e.ApplyObject(t, agent())
	ds := must(e.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "agent", metav1.GetOptions{}))
	e.Kubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/agent", "--timeout=60s")
	got := podsOnNodes(t, e)
	if len(got) != 2 || got[tainted] != "" {
		t.Errorf("daemon pods on %v, want the 2 untainted nodes", got)
	}
	pods := must(e.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "name=agent"}))
	for _, p := range pods.Items {
		terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if len(terms) != 1 || len(terms[0].MatchFields) != 1 || terms[0].MatchFields[0].Values[0] != p.Spec.NodeName {
			t.Errorf("pod %s on %s: node affinity %+v", p.Name, p.Spec.NodeName, terms)
		}
		if len(p.Spec.Tolerations) < 6 || p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] == "" {
			t.Errorf("pod %s: tolerations %v labels %v", p.Name, p.Spec.Tolerations, p.Labels)
		}
	}

	// Tolerating the taint brings the daemon to that node too.
	e.Kubectl(t, "-n", "kube-system", "patch", "daemonset/agent", "--type=json", "-p",
		`[{"op":"add","path":"/spec/template/spec/tolerations","value":[{"key":"dedicated","operator":"Equal","value":"infra","effect":"NoSchedule"}]}]`)
	e.Kubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/agent", "--timeout=60s")
	kittest.WaitFor(t, "daemon on all 3 nodes", 60*time.Second, func() (bool, error) {
		return len(podsOnNodes(t, e)) == 3, nil
	})

	// A node that joins gets one.
	e.AddNodes(t, "late-", 1)
	kittest.WaitFor(t, "daemon on the new node", 60*time.Second, func() (bool, error) {
		return len(podsOnNodes(t, e)) == 4, fmt.Errorf("pods on %v", podsOnNodes(t, e))
	})

	// A rolling update with kubectl.
	e.Kubectl(t, "-n", "kube-system", "set", "image", "daemonset/agent", "agent=fluentd:2")
	e.Kubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/agent", "--timeout=90s")
	kittest.WaitFor(t, "all updated", 60*time.Second, func() (bool, error) {
		got := podsOnNodes(t, e)
		for _, im := range got {
			if im != "fluentd:2" {
				return false, fmt.Errorf("pods %v", got)
			}
		}
		return len(got) == 4, fmt.Errorf("pods %v", got)
	})
	cur := must(e.Client.AppsV1().DaemonSets("kube-system").Get(ctx, ds.Name, metav1.GetOptions{}))
	st := cur.Status
	if st.DesiredNumberScheduled != 4 || st.CurrentNumberScheduled != 4 || st.NumberReady != 4 || st.UpdatedNumberScheduled != 4 ||
		st.NumberAvailable != 4 || st.NumberUnavailable != 0 || st.NumberMisscheduled != 0 || st.ObservedGeneration != cur.Generation {
		t.Errorf("status %+v", st)
	}
	out := e.Kubectl(t, "-n", "kube-system", "rollout", "history", "daemonset/agent")
	if !strings.Contains(out, "3 ") {
		t.Errorf("rollout history:\n%s", out)
	}
	e.Kubectl(t, "-n", "kube-system", "rollout", "undo", "daemonset/agent")
	e.Kubectl(t, "-n", "kube-system", "rollout", "status", "daemonset/agent", "--timeout=90s")
	kittest.WaitFor(t, "undone to fluentd:1", 60*time.Second, func() (bool, error) {
		got := podsOnNodes(t, e)
		for _, im := range got {
			if im != "fluentd:1" {
				return false, fmt.Errorf("pods %v", got)
			}
		}
		return len(got) == 4, fmt.Errorf("pods %v", got)
	})

	// A NoExecute taint it does not tolerate removes it from the node.
	e.Kubectl(t, "taint", "nodes", tainted, "evict=now:NoExecute")
	kittest.WaitFor(t, "daemon gone from the NoExecute node", 60*time.Second, func() (bool, error) {
		got := podsOnNodes(t, e)
		return len(got) == 3 && got[tainted] == "", fmt.Errorf("pods %v", got)
	})
}
