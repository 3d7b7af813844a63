package storage

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/registry"
)

func fieldsPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "u-1",
			Labels: map[string]string{"app": "web", "tier": "front"}, Annotations: map[string]string{"a": "b"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs-1", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "web", Image: "nginx:1", Args: []string{"-x"},
				Ports: []corev1.ContainerPort{{ContainerPort: 80, Protocol: corev1.ProtocolTCP}, {ContainerPort: 443, Protocol: corev1.ProtocolTCP, Name: "https"}},
				Env:   []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}},
				ReadinessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(80)}}, PeriodSeconds: 5},
				SecurityContext: &corev1.SecurityContext{RunAsNonRoot: ptr.To(true), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}, {Name: "side", Image: "busybox"}},
			Volumes:            []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Tolerations:        []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			RestartPolicy:      corev1.RestartPolicyAlways,
			DNSPolicy:          corev1.DNSClusterFirst,
			ServiceAccountName: "default",
			SecurityContext:    &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000), FSGroup: ptr.To[int64](2000)},
		},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse}}},
	}
}

// entry is a managedFields entry with the given fields.
func entry(manager, sub, apiVersion, fields string) metav1.ManagedFieldsEntry {
	now := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: apiVersion,
		Time: &now, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields), Subresource: sub}
}

// TestRecordUpdateMatchesFieldManager checks that recordUpdate, which
// prunes what live and new objects share and converts them without
// validation, records the managedFields the plain field manager records on
// the whole objects.
func TestRecordUpdateMatchesFieldManager(t *testing.T) {
	f := newFixture(t)
	pods := kind(t, "", "v1", "pods")
	deps := kind(t, "apps", "v1", "deployments")
	cms := kind(t, "", "v1", "configmaps")

	// created is pod as the create of manager "creator" stores it.
	created := func(pod *corev1.Pod) *corev1.Pod {
		empty, err := f.s.newObject(pods.GVK)
		if err != nil {
			t.Fatal(err)
		}
		out, err := f.s.recordUpdate(pods, "", empty, pod.DeepCopy(), "creator")
		if err != nil {
			t.Fatal(err)
		}
		return out.(*corev1.Pod)
	}
	basePod := created(fieldsPod())
	// A pod some of whose fields a second manager owns.
	shared := basePod.DeepCopy()
	shared.Spec.Containers[0].Image = "nginx:2"
	shared.Labels["extra"] = "x"
	sharedOut, err := f.s.recordUpdate(pods, "", basePod.DeepCopy(), shared, "editor")
	if err != nil {
		t.Fatal(err)
	}
	basePod2 := sharedOut.(*corev1.Pod)
	if len(basePod2.ManagedFields) != 2 {
		t.Fatalf("setup: managedFields %+v", basePod2.ManagedFields)
	}

	type tc struct {
		name    string
		k       *registry.Kind
		sub     string
		manager string
		live    runtime.Object
		edit    func(obj runtime.Object)
	}
	pod := func(edit func(p *corev1.Pod)) func(runtime.Object) {
		return func(o runtime.Object) { edit(o.(*corev1.Pod)) }
	}
	var cases []tc
	for _, live := range []*corev1.Pod{basePod, basePod2} {
		n := len(live.ManagedFields)
		add := func(name, sub, manager string, edit func(p *corev1.Pod)) {
			cases = append(cases, tc{fmt.Sprintf("%s/managers=%d", name, n), pods, sub, manager, live, pod(edit)})
		}
		add("bind", "", "scheduler", func(p *corev1.Pod) {
			p.Spec.NodeName = "n1"
			p.Status.Conditions[0].Status = corev1.ConditionTrue
		})
		add("status", "status", "kubelet", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.PodIP = "10.0.0.1"
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", Ready: true, Image: "nginx:1"}}
		})
		add("status-by-owner", "status", "creator", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed })
		add("image", "", "editor", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "nginx:3" })
		add("image-by-other", "", "third", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "nginx:3" })
		add("remove-env", "", "third", func(p *corev1.Pod) { p.Spec.Containers[0].Env = p.Spec.Containers[0].Env[:1] })
		add("remove-container-field", "", "third", func(p *corev1.Pod) { p.Spec.Containers[0].Args = nil })
		add("nested-pointer", "", "third", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
			p.Spec.SecurityContext.RunAsUser = ptr.To[int64](1)
		})
		add("pointer-to-nil", "", "third", func(p *corev1.Pod) { p.Spec.SecurityContext = nil })
		add("pointer-from-nil", "", "third", func(p *corev1.Pod) {
			p.Spec.Containers[1].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(false)}
		})
		add("labels", "", "third", func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web", "new": "1"} })
		add("noop", "", "third", func(p *corev1.Pod) {})
		add("noop-owner", "", "creator", func(p *corev1.Pod) {})
		add("quantity", "", "third", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("200m")
		})
		add("probe-port", "", "third", func(p *corev1.Pod) {
			p.Spec.Containers[0].ReadinessProbe.HTTPGet.Port = intstr.FromString("http")
		})
		add("duplicate-env", "", "third", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "A", Value: "3"})
		})
		add("missing-list-key", "", "third", func(p *corev1.Pod) {
			p.Spec.NodeName = "n2"
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Image: "nameless"})
		})
		add("reset-managed-fields", "", "third", func(p *corev1.Pod) {
			p.ManagedFields = []metav1.ManagedFieldsEntry{}
			p.Spec.NodeName = "n3"
		})
		add("client-managed-fields", "", "third", func(p *corev1.Pod) {
			p.ManagedFields = []metav1.ManagedFieldsEntry{entry("other", "", "v1", `{"f:spec":{"f:nodeName":{}}}`)}
			p.Spec.NodeName = "n4"
		})
		add("client-managed-fields-status", "status", "third", func(p *corev1.Pod) {
			p.ManagedFields = []metav1.ManagedFieldsEntry{entry("other", "", "v1", `{"f:spec":{"f:nodeName":{}}}`)}
			p.Status.Message = "m"
		})
	}
	// A live object whose managers are of another version, or own
	// fields under metadata.managedFields.
	odd := basePod.DeepCopy()
	odd.ManagedFields = append(odd.ManagedFields, entry("old", "", "v1beta1", `{"f:spec":{"f:nodeName":{}}}`))
	cases = append(cases, tc{"other-version", pods, "", "third", odd, pod(func(p *corev1.Pod) { p.Spec.NodeName = "n5" })})
	owner := basePod.DeepCopy()
	owner.ManagedFields = append(owner.ManagedFields, entry("meta", "", "v1", `{"f:metadata":{"f:managedFields":{}},"f:spec":{"f:nodeName":{}}}`))
	cases = append(cases, tc{"owns-managed-fields", pods, "", "third", owner, pod(func(p *corev1.Pod) { p.Spec.NodeName = "n6" })})

	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "default", UID: "d-1"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromString("25%"))}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}}, Spec: fieldsPod().Spec}},
	}
	emptyDep, _ := f.s.newObject(deps.GVK)
	depOut, err := f.s.recordUpdate(deps, "", emptyDep, dep, "creator")
	if err != nil {
		t.Fatal(err)
	}
	depLive := depOut.(*appsv1.Deployment)
	depCase := func(name, sub, manager string, edit func(d *appsv1.Deployment)) {
		cases = append(cases, tc{name, deps, sub, manager, depLive, func(o runtime.Object) { edit(o.(*appsv1.Deployment)) }})
	}
	depCase("scale", "", "hpa", func(d *appsv1.Deployment) { d.Spec.Replicas = ptr.To[int32](5) })
	depCase("template-image", "", "ci", func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = "nginx:9" })
	depCase("template-annotation", "", "ci", func(d *appsv1.Deployment) {
		d.Spec.Template.Annotations = map[string]string{"restartedAt": "now"}
	})
	depCase("max-surge", "", "ci", func(d *appsv1.Deployment) {
		d.Spec.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromString("50%"))
	})
	depCase("status", "status", "controller", func(d *appsv1.Deployment) {
		d.Status.Replicas, d.Status.ReadyReplicas, d.Status.ObservedGeneration = 3, 2, 1
	})

	cmLive := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default", UID: "c-1",
		ManagedFields: []metav1.ManagedFieldsEntry{entry("creator", "", "v1", `{"f:data":{".":{},"f:a":{},"f:b":{}}}`)}},
		Data: map[string]string{"a": "1", "b": "2"}}
	cases = append(cases, tc{"configmap-data", cms, "", "editor", cmLive, func(o runtime.Object) {
		o.(*corev1.ConfigMap).Data = map[string]string{"a": "1", "b": "3", "c": "4"}
	}})

	for _, c := range cases {
		ageEntries(c.live)
	}
	fast := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			withType(c.k, c.live)
			want := c.live.DeepCopyObject()
			c.edit(want)
			got := want.DeepCopyObject()

			fm, err := f.s.fieldManager(c.k, c.sub, false)
			if err != nil {
				t.Fatal(err)
			}
			withType(c.k, want)
			want = fm.UpdateNoErrors(withType(c.k, c.live.DeepCopyObject()), want, c.manager)

			liveCopy := c.live.DeepCopyObject()
			got, err = f.s.recordUpdate(c.k, c.sub, liveCopy, got, c.manager)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.live, liveCopy); diff != "" {
				t.Errorf("live object changed (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(normalizeTimes(t, want), normalizeTimes(t, got)); diff != "" {
				t.Errorf("recordUpdate differs from the field manager (-want +got):\n%s", diff)
			}

			// The same through updateEntries alone, where it applies.
			obj := c.live.DeepCopyObject()
			c.edit(obj)
			entries, ok := f.s.updateEntries(c.k, c.sub, withType(c.k, c.live.DeepCopyObject()), withType(c.k, obj), c.manager)
			if !ok {
				return
			}
			fast++
			m, _ := meta.Accessor(obj)
			m.SetManagedFields(entries)
			if diff := cmp.Diff(normalizeTimes(t, want), normalizeTimes(t, obj)); diff != "" {
				t.Errorf("updateEntries differs from the field manager (-want +got):\n%s", diff)
			}
		})
	}
	if fast < len(cases)/2 {
		t.Errorf("updateEntries handled %d of %d cases", fast, len(cases))
	}
}

// ageEntries moves the managedFields times of obj an hour back, so that
// the entries a test records sort after them whatever the clock does.
func ageEntries(obj runtime.Object) {
	m, _ := meta.Accessor(obj)
	mf := m.GetManagedFields()
	for i := range mf {
		if mf[i].Time != nil && time.Since(mf[i].Time.Time) < time.Minute {
			mf[i].Time = &metav1.Time{Time: mf[i].Time.Add(-time.Hour)}
		}
	}
}

// TestRecordCreateMatchesFieldManager is TestRecordUpdateMatchesFieldManager
// for creates, and for updates of objects without managedFields.
func TestRecordCreateMatchesFieldManager(t *testing.T) {
	f := newFixture(t)
	pods := kind(t, "", "v1", "pods")
	deps := kind(t, "apps", "v1", "deployments")
	cms := kind(t, "", "v1", "configmaps")
	withStatus := fieldsPod()
	withStatus.Status.PodIP = "10.0.0.9"
	sent := fieldsPod()
	sent.ManagedFields = []metav1.ManagedFieldsEntry{entry("other", "", "v1", `{"f:spec":{"f:nodeName":{}}}`)}
	reset := fieldsPod()
	reset.ManagedFields = []metav1.ManagedFieldsEntry{}
	untracked := fieldsPod()
	untracked.Spec.NodeName = "n1"
	cases := []struct {
		name     string
		k        *registry.Kind
		live     runtime.Object // nil: a create
		obj      runtime.Object
		fastPath bool
	}{
		{"pod", pods, nil, fieldsPod(), true},
		{"pod-with-status", pods, nil, withStatus, true},
		{"pod-with-managed-fields", pods, nil, sent, false},
		{"pod-reset", pods, nil, reset, false},
		{"deployment", deps, nil, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "default"},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Template: corev1.PodTemplateSpec{Spec: fieldsPod().Spec}}}, true},
		{"configmap", cms, nil, cm("c", map[string]string{"a": "1"}), true},
		{"empty-configmap", cms, nil, cm("c", nil), true},
		{"untracked-update", pods, fieldsPod(), untracked, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			live := c.live
			if live == nil {
				var err error
				if live, err = f.s.newObject(c.k.GVK); err != nil {
					t.Fatal(err)
				}
			}
			withType(c.k, live)
			want := withType(c.k, c.obj.DeepCopyObject())
			fm, err := f.s.fieldManager(c.k, "", false)
			if err != nil {
				t.Fatal(err)
			}
			want = fm.UpdateNoErrors(live.DeepCopyObject(), want, "creator")

			got, err := f.s.recordUpdate(c.k, "", live.DeepCopyObject(), withType(c.k, c.obj.DeepCopyObject()), "creator")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(normalizeTimes(t, want), normalizeTimes(t, got)); diff != "" {
				t.Errorf("recordUpdate differs from the field manager (-want +got):\n%s", diff)
			}
			_, ok := f.s.updateEntries(c.k, "", live.DeepCopyObject(), withType(c.k, c.obj.DeepCopyObject()), "creator")
			if ok != c.fastPath {
				t.Errorf("updateEntries handled the case: %v, want %v", ok, c.fastPath)
			}
		})
	}
}

// normalizeTimes replaces the managedFields timestamps of recent writes
// (the two field managers run a moment apart) with a marker.
func normalizeTimes(t *testing.T, obj runtime.Object) runtime.Object {
	t.Helper()
	obj = obj.DeepCopyObject()
	m, err := meta.Accessor(obj)
	if err != nil {
		t.Fatal(err)
	}
	mf := m.GetManagedFields()
	for i := range mf {
		if mf[i].Time != nil && time.Since(mf[i].Time.Time) < time.Minute {
			mf[i].Time = &metav1.Time{Time: time.Unix(1, 0)}
		}
	}
	m.SetManagedFields(mf)
	return obj
}
