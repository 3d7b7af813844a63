package registry

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

func TestPodCells(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	created := metav1.NewTime(now.Add(-10 * time.Minute))
	fiveAgo := metav1.NewTime(now.Add(-5 * time.Minute))
	deleted := metav1.NewTime(now)
	base := func() *corev1.Pod {
		p := validPod()
		p.CreationTimestamp = created
		p.Spec.NodeName = "n1"
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = "10.0.0.5"
		p.Status.PodIPs = []corev1.PodIP{{IP: "10.0.0.5"}}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
		return p
	}
	tests := []struct {
		name   string
		mutate func(p *corev1.Pod)
		want   []any
	}{
		{"running", func(p *corev1.Pod) {}, []any{"web", "1/1", "Running", "0", "10m", "10.0.0.5", "n1", "<none>", "<none>"}},
		{"pending unscheduled", func(p *corev1.Pod) {
			p.Spec.NodeName = ""
			p.Status = corev1.PodStatus{Phase: corev1.PodPending}
		}, []any{"web", "0/1", "Pending", "0", "10m", "<none>", "<none>", "<none>", "<none>"}},
		{"init running", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i1"}, {Name: "i2"}}
			p.Status.Phase = corev1.PodPending
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{
				{Name: "i1", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}},
				{Name: "i2", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
			}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}}
		}, []any{"web", "0/1", "Init:1/2", "0", "10m", "10.0.0.5", "n1", "<none>", "<none>"}},
		{"init crashloop", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i1"}}
			p.Status.Phase = corev1.PodPending
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "i1", RestartCount: 3,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, FinishedAt: fiveAgo}}}}
			p.Status.ContainerStatuses = nil
		}, []any{"web", "0/1", "Init:CrashLoopBackOff", "3 (5m ago)", "10m", "10.0.0.5", "n1", "<none>", "<none>"}},
		{"init failed exit code", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "i1"}}
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "i1",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2}}}}
			p.Status.ContainerStatuses = nil
		}, []any{"web", "0/1", "Init:ExitCode:2", "0", "10m", "10.0.0.5", "n1", "<none>", "<none>"}},
		{"crashloop", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", RestartCount: 2,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, FinishedAt: fiveAgo}}}}
		}, []any{"web", "0/1", "CrashLoopBackOff", "2 (5m ago)", "10m", "10.0.0.5", "n1", "<none>", "<none>"}},
		{"completed", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodSucceeded
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}}}
		}, []any{"web", "0/1", "Completed", "0", "10m", "10.0.0.5", "n1", "<none>", "<none>"}},
		{"signal", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Signal: 9}}}}
		}, []any{"web", "0/1", "Signal:9", "0", "10m", "10.0.0.5", "n1", "<none>", "<none>"}},
		{"terminating", func(p *corev1.Pod) { p.DeletionTimestamp = &deleted },
			[]any{"web", "1/1", "Terminating", "0", "10m", "10.0.0.5", "n1", "<none>", "<none>"}},
		{"node lost", func(p *corev1.Pod) {
			p.DeletionTimestamp = &deleted
			p.Status.Reason = "NodeLost"
		}, []any{"web", "1/1", "Unknown", "0", "10m", "10.0.0.5", "n1", "<none>", "<none>"}},
		{"scheduling gated", func(p *corev1.Pod) {
			p.Spec.NodeName = ""
			p.Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonSchedulingGated}}}
		}, []any{"web", "0/1", "SchedulingGated", "0", "10m", "<none>", "<none>", "<none>", "<none>"}},
		{"readiness gates and nominated node", func(p *corev1.Pod) {
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: "a"}, {ConditionType: "b"}}
			p.Status.Conditions = []corev1.PodCondition{{Type: "a", Status: corev1.ConditionTrue}}
			p.Status.NominatedNodeName = "n2"
		}, []any{"web", "1/1", "Running", "0", "10m", "10.0.0.5", "n1", "n2", "1/2"}},
		{"sidecar counts", func(p *corev1.Pod) {
			always := corev1.ContainerRestartPolicyAlways
			started := true
			p.Spec.InitContainers = []corev1.Container{{Name: "side", RestartPolicy: &always}}
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "side", Ready: true, Started: &started,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodInitialized, Status: corev1.ConditionTrue}}
		}, []any{"web", "2/2", "Running", "0", "10m", "10.0.0.5", "n1", "<none>", "<none>"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := base()
			tt.mutate(p)
			got := podKind.Cells(p, now)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("cells = %#v\nwant    %#v", got, tt.want)
			}
			if len(got) != len(podKind.Columns) {
				t.Errorf("%d cells for %d columns", len(got), len(podKind.Columns))
			}
		})
	}
}

func TestPodGracefulDelete(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	tests := []struct {
		name      string
		node      string
		phase     corev1.PodPhase
		specGrace *int64
		requested *int64
		want      int64
		graceful  bool
	}{
		{"default", "n1", corev1.PodRunning, i64(30), nil, 30, true},
		{"requested", "n1", corev1.PodRunning, i64(30), i64(5), 5, true},
		{"zero requested", "n1", corev1.PodRunning, i64(30), i64(0), 0, false},
		{"unscheduled", "", corev1.PodPending, i64(30), nil, 0, false},
		{"succeeded", "n1", corev1.PodSucceeded, i64(30), nil, 0, false},
		{"failed", "n1", corev1.PodFailed, i64(30), i64(10), 0, false},
		{"negative", "n1", corev1.PodRunning, i64(-5), nil, 1, true},
		{"no spec grace", "n1", corev1.PodRunning, nil, nil, 30, true},
	}
	for _, tt := range tests {
		p := validPod()
		p.Spec.NodeName = tt.node
		p.Status.Phase = tt.phase
		p.Spec.TerminationGracePeriodSeconds = tt.specGrace
		g, ok := podKind.GracefulDelete(p, tt.requested)
		if g != tt.want || ok != tt.graceful {
			t.Errorf("%s: got (%d, %v), want (%d, %v)", tt.name, g, ok, tt.want, tt.graceful)
		}
	}
}

func TestPodUpdate(t *testing.T) {
	old := validPod()
	tests := []struct {
		name   string
		mutate func(p *corev1.Pod)
		ok     bool
	}{
		{"image", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "nginx:1.28" }, true},
		{"add toleration", func(p *corev1.Pod) {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: "k", Operator: corev1.TolerationOpExists})
		}, true},
		{"active deadline", func(p *corev1.Pod) { v := int64(60); p.Spec.ActiveDeadlineSeconds = &v }, true},
		{"env", func(p *corev1.Pod) { p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "A", Value: "b"}} }, false},
		{"restart policy", func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyNever }, false},
		{"remove toleration", func(p *corev1.Pod) { p.Spec.Tolerations = nil }, false},
		{"add container", func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "b", Image: "b", ImagePullPolicy: "Always", TerminationMessagePolicy: "File"})
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := old.DeepCopy()
			tt.mutate(p)
			errs := podKind.ValidateUpdate(p, old)
			if tt.ok && len(errs) > 0 {
				t.Fatalf("unexpected errors: %v", errs)
			}
			if !tt.ok {
				if len(errs) == 0 {
					t.Fatal("update accepted")
				}
				found := false
				for _, e := range errs {
					if e.Type == field.ErrorTypeForbidden && strings.HasPrefix(e.Detail, "pod updates may not change fields other than") ||
						e.Field == "spec.tolerations" {
						found = true
					}
				}
				if !found {
					t.Errorf("errors %v lack the forbidden update message", errs)
				}
			}
		})
	}
}

func TestPodFields(t *testing.T) {
	p := validPod()
	p.Spec.NodeName = "n1"
	p.Spec.ServiceAccountName = "sa"
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIPs = []corev1.PodIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}}
	p.Status.NominatedNodeName = "n2"
	got := podKind.Fields(p)
	want := map[string]string{
		"spec.nodeName": "n1", "spec.restartPolicy": "Always", "spec.schedulerName": "default-scheduler",
		"spec.serviceAccountName": "sa", "spec.hostNetwork": "false", "status.phase": "Running",
		"status.podIP": "10.0.0.1", "status.podIPs": "10.0.0.1,fd00::1", "status.nominatedNodeName": "n2",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(podKind.FieldLabels) {
		t.Errorf("Fields returns %d keys, FieldLabels lists %d", len(got), len(podKind.FieldLabels))
	}
	for _, l := range podKind.FieldLabels {
		if _, ok := got[l]; !ok {
			t.Errorf("label %s not in Fields", l)
		}
	}
	if podKind.FieldAliases["spec.host"] != "spec.nodeName" {
		t.Error("spec.host alias missing")
	}
}

func TestPodQOSClass(t *testing.T) {
	p := validPod()
	podKind.PrepareForCreate(p)
	if p.Status.Phase != corev1.PodPending || p.Status.QOSClass != corev1.PodQOSBestEffort {
		t.Errorf("status = %+v", p.Status)
	}
}

// classLister serves stored priority classes, and every namespace's
// default service account.
type classLister []runtime.Object

func (l classLister) List(_ context.Context, resource, ns string) ([]runtime.Object, error) {
	switch resource {
	case "priorityclasses.scheduling.k8s.io":
		return l, nil
	case "serviceaccounts":
		return []runtime.Object{&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}}, nil
	}
	return nil, fmt.Errorf("unexpected resource %q", resource)
}

func TestAdmitPodPriority(t *testing.T) {
	never := corev1.PreemptNever
	high := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 1000, PreemptionPolicy: &never}
	def := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "normal"}, Value: 10, GlobalDefault: true}
	i32 := func(v int32) *int32 { return &v }
	tests := []struct {
		name      string
		classes   classLister
		className string
		priority  *int32
		want      int32
		wantClass string
		forbidden bool
	}{
		{"none", nil, "", nil, 0, "", false},
		{"global default", classLister{high, def}, "", nil, 10, "normal", false},
		{"named", classLister{high, def}, "high", nil, 1000, "high", false},
		{"system", nil, "system-node-critical", nil, 2000001000, "system-node-critical", false},
		{"missing", classLister{def}, "nope", nil, 0, "", true},
		{"mismatched priority", classLister{high}, "high", i32(5), 0, "", true},
		{"matching priority", nil, "", i32(0), 0, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := validPod()
			p.Spec.PriorityClassName = tt.className
			p.Spec.Priority = tt.priority
			p.Spec.PreemptionPolicy = nil
			err := podKind.Mutate(context.Background(), tt.classes, p, nil)
			if tt.forbidden {
				if !apierrors.IsForbidden(err) {
					t.Fatalf("err = %v, want Forbidden", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *p.Spec.Priority != tt.want || p.Spec.PriorityClassName != tt.wantClass || p.Spec.PreemptionPolicy == nil {
				t.Errorf("priority %d class %q policy %v", *p.Spec.Priority, p.Spec.PriorityClassName, p.Spec.PreemptionPolicy)
			}
		})
	}
	p := validPod()
	p.Spec.PriorityClassName = "high"
	p.Spec.Priority, p.Spec.PreemptionPolicy = nil, nil
	if err := podKind.Mutate(context.Background(), classLister{high}, p, nil); err != nil || *p.Spec.PreemptionPolicy != corev1.PreemptNever {
		t.Errorf("preemption policy from class: %v %v", err, p.Spec.PreemptionPolicy)
	}
}

// TestMutatePod: admission gives a new pod the default service account,
// the not-ready/unreachable tolerations and its priority; an update that
// lacks them gets the tolerations and the stored priority back, but not
// the service account, which upstream's ServiceAccount admission names on
// create only.
func TestMutatePod(t *testing.T) {
	p := &corev1.Pod{}
	p.Name, p.Namespace = "web", "default"
	p.Spec.Containers = []corev1.Container{{Name: "app", Image: "nginx"}}
	if err := podKind.Mutate(context.Background(), classLister(nil), p, nil); err != nil {
		t.Fatal(err)
	}
	spec := p.Spec
	if spec.ServiceAccountName != "default" || spec.DeprecatedServiceAccount != "default" {
		t.Errorf("service account %q/%q, want default", spec.ServiceAccountName, spec.DeprecatedServiceAccount)
	}
	// The unreachable toleration carries the default disconnect policy,
	// replace=false: no tolerationSeconds.
	if len(spec.Tolerations) != 2 || spec.Tolerations[0].Key != corev1.TaintNodeNotReady || spec.Tolerations[1].Key != corev1.TaintNodeUnreachable ||
		*spec.Tolerations[0].TolerationSeconds != DefaultTolerationSeconds || spec.Tolerations[1].TolerationSeconds != nil ||
		spec.Tolerations[0].Effect != corev1.TaintEffectNoExecute || spec.Tolerations[1].Effect != corev1.TaintEffectNoExecute {
		t.Errorf("tolerations %+v", spec.Tolerations)
	}
	if spec.Priority == nil || *spec.Priority != 0 || spec.PreemptionPolicy == nil {
		t.Errorf("priority %v policy %v", spec.Priority, spec.PreemptionPolicy)
	}
	// Admitting again adds nothing.
	again := p.DeepCopy()
	if err := podKind.Mutate(context.Background(), classLister(nil), again, p); err != nil || !apiequality.Semantic.DeepEqual(again, p) {
		t.Errorf("second admission changed the pod (%v): %+v", err, again.Spec)
	}

	up := &corev1.Pod{}
	up.Name, up.Namespace = "web", "default"
	up.Spec.Containers = []corev1.Container{{Name: "app", Image: "nginx"}}
	if err := podKind.Mutate(context.Background(), classLister(nil), up, p); err != nil {
		t.Fatal(err)
	}
	if len(up.Spec.Tolerations) != 2 || up.Spec.Priority == nil || *up.Spec.Priority != 0 || up.Spec.PreemptionPolicy == nil {
		t.Errorf("update: tolerations %+v priority %v policy %v", up.Spec.Tolerations, up.Spec.Priority, up.Spec.PreemptionPolicy)
	}
	if up.Spec.ServiceAccountName != "" {
		t.Errorf("update got service account %q", up.Spec.ServiceAccountName)
	}
	// A priority the update names is left for validation to judge.
	up.Spec.Priority = ptr.To(int32(7))
	if err := podKind.Mutate(context.Background(), classLister(nil), up, p); err != nil || *up.Spec.Priority != 7 {
		t.Errorf("update's own priority: %v %v", err, *up.Spec.Priority)
	}
}
