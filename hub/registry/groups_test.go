package registry

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func grpTemplate() corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx:1.27"}}},
	}
}

func grpSelector() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
}

func grpMeta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: "default", UID: "0d2c5a7e-1111-2222-3333-444455556666"}
}

func grpDeployment() *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: grpMeta("web"), Spec: appsv1.DeploymentSpec{Selector: grpSelector(), Template: grpTemplate()}}
}

func grpStatefulSet() *appsv1.StatefulSet {
	return &appsv1.StatefulSet{ObjectMeta: grpMeta("db"), Spec: appsv1.StatefulSetSpec{Selector: grpSelector(), Template: grpTemplate(), ServiceName: "db"}}
}

func grpJob() *batchv1.Job {
	t := grpTemplate()
	t.Spec.RestartPolicy = corev1.RestartPolicyNever
	return &batchv1.Job{ObjectMeta: grpMeta("pi"), Spec: batchv1.JobSpec{Template: t}}
}

func grpCronJob(schedule string) *batchv1.CronJob {
	return &batchv1.CronJob{ObjectMeta: grpMeta("tick"), Spec: batchv1.CronJobSpec{
		Schedule:    schedule,
		JobTemplate: batchv1.JobTemplateSpec{Spec: grpJob().Spec},
	}}
}

// grpCreate defaults, prepares and validates obj as a create would.
func grpCreate(k *Kind, obj runtime.Object) field.ErrorList {
	if k.Default != nil {
		k.Default(obj)
	}
	if k.PrepareForCreate != nil {
		k.PrepareForCreate(obj)
	}
	if k.Validate == nil {
		return nil
	}
	return k.Validate(obj)
}

func TestGroupKindsOrderAndNames(t *testing.T) {
	var groups []string
	for _, k := range groupKinds(nil) {
		if len(groups) == 0 || groups[len(groups)-1] != k.GVK.Group {
			groups = append(groups, k.GVK.Group)
		}
		if k.Columns == nil || k.Cells == nil || k.Resource == "" || k.Singular == "" {
			t.Errorf("%s: incomplete kind", k.GVK)
		}
		if k.StoredAs.Empty() && k.Columns[0].Name != "Name" {
			t.Errorf("%s: first column %q", k.GVK, k.Columns[0].Name)
		}
	}
	want := []string{"apps", "autoscaling", "batch", "certificates.k8s.io", "discovery.k8s.io", "coordination.k8s.io", "events.k8s.io", "policy",
		"networking.k8s.io", "rbac.authorization.k8s.io", "scheduling.k8s.io", "storage.k8s.io", "node.k8s.io"}
	if !reflect.DeepEqual(groups, want) {
		t.Errorf("group order %v, want %v", groups, want)
	}
	tests := []struct {
		gvr        schema.GroupVersionResource
		short      []string
		categories []string
		namespaced bool
		status     bool
		scale      bool
	}{
		{appsv1.SchemeGroupVersion.WithResource("deployments"), []string{"deploy"}, []string{"all"}, true, true, true},
		{appsv1.SchemeGroupVersion.WithResource("replicasets"), []string{"rs"}, []string{"all"}, true, true, true},
		{appsv1.SchemeGroupVersion.WithResource("statefulsets"), []string{"sts"}, []string{"all"}, true, true, true},
		{appsv1.SchemeGroupVersion.WithResource("daemonsets"), []string{"ds"}, []string{"all"}, true, true, false},
		{appsv1.SchemeGroupVersion.WithResource("controllerrevisions"), nil, nil, true, false, false},
		{batchv1.SchemeGroupVersion.WithResource("jobs"), nil, []string{"all"}, true, true, false},
		{batchv1.SchemeGroupVersion.WithResource("cronjobs"), []string{"cj"}, []string{"all"}, true, true, false},
		{eventsv1.SchemeGroupVersion.WithResource("events"), []string{"ev"}, nil, true, false, false},
		{policyv1.SchemeGroupVersion.WithResource("poddisruptionbudgets"), []string{"pdb"}, nil, true, true, false},
		{networkingv1.SchemeGroupVersion.WithResource("networkpolicies"), []string{"netpol"}, nil, true, false, false},
		{rbacv1.SchemeGroupVersion.WithResource("clusterroles"), nil, nil, false, false, false},
		{rbacv1.SchemeGroupVersion.WithResource("rolebindings"), nil, nil, true, false, false},
		{schedulingv1.SchemeGroupVersion.WithResource("priorityclasses"), []string{"pc"}, nil, false, false, false},
	}
	for _, tt := range tests {
		k := Lookup(tt.gvr)
		if k == nil {
			t.Errorf("%v not served", tt.gvr)
			continue
		}
		if !reflect.DeepEqual(k.ShortNames, tt.short) || !reflect.DeepEqual(k.Categories, tt.categories) ||
			k.Namespaced != tt.namespaced || k.HasStatus != tt.status || (k.Scale != nil) != tt.scale {
			t.Errorf("%v: got short %v categories %v namespaced %v status %v scale %v", tt.gvr, k.ShortNames, k.Categories,
				k.Namespaced, k.HasStatus, k.Scale != nil)
		}
	}
	if jobKind.DefaultGC != metav1.DeletePropagationOrphan {
		t.Errorf("job default GC %q", jobKind.DefaultGC)
	}
}

func TestGroupDefaults(t *testing.T) {
	d := grpDeployment()
	deploymentKind.Default(d)
	ru := d.Spec.Strategy.RollingUpdate
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil ||
		ru.MaxUnavailable.String() != "25%" || ru.MaxSurge.String() != "25%" {
		t.Errorf("deployment strategy %+v", d.Spec.Strategy)
	}
	if *d.Spec.Replicas != 1 || *d.Spec.RevisionHistoryLimit != 10 || *d.Spec.ProgressDeadlineSeconds != 600 {
		t.Errorf("deployment defaults %v %v %v", *d.Spec.Replicas, *d.Spec.RevisionHistoryLimit, *d.Spec.ProgressDeadlineSeconds)
	}
	if d.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		t.Errorf("template not defaulted: restartPolicy %q", d.Spec.Template.Spec.RestartPolicy)
	}

	r := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}}}
	deploymentKind.Default(r)
	if r.Spec.Strategy.RollingUpdate != nil {
		t.Errorf("recreate strategy got rollingUpdate")
	}

	s := grpStatefulSet()
	s.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}}}
	statefulSetKind.Default(s)
	if s.Spec.UpdateStrategy.Type != appsv1.RollingUpdateStatefulSetStrategyType || s.Spec.UpdateStrategy.RollingUpdate == nil ||
		*s.Spec.UpdateStrategy.RollingUpdate.Partition != 0 {
		t.Errorf("statefulset update strategy %+v", s.Spec.UpdateStrategy)
	}
	if s.Spec.PodManagementPolicy != appsv1.OrderedReadyPodManagement || *s.Spec.Replicas != 1 || *s.Spec.RevisionHistoryLimit != 10 {
		t.Errorf("statefulset defaults %+v", s.Spec)
	}
	if p := s.Spec.PersistentVolumeClaimRetentionPolicy; p == nil || p.WhenDeleted != appsv1.RetainPersistentVolumeClaimRetentionPolicyType ||
		p.WhenScaled != appsv1.RetainPersistentVolumeClaimRetentionPolicyType {
		t.Errorf("retention policy %+v", p)
	}
	if m := s.Spec.VolumeClaimTemplates[0].Spec.VolumeMode; m == nil || *m != corev1.PersistentVolumeFilesystem {
		t.Errorf("volume mode %v", m)
	}

	ds := &appsv1.DaemonSet{Spec: appsv1.DaemonSetSpec{Template: grpTemplate()}}
	daemonSetKind.Default(ds)
	if u := ds.Spec.UpdateStrategy.RollingUpdate; u == nil || u.MaxUnavailable.String() != "1" || u.MaxSurge.String() != "0" {
		t.Errorf("daemonset update strategy %+v", ds.Spec.UpdateStrategy)
	}

	j := grpJob()
	jobKind.Default(j)
	if *j.Spec.Completions != 1 || *j.Spec.Parallelism != 1 || *j.Spec.BackoffLimit != 6 ||
		*j.Spec.CompletionMode != batchv1.NonIndexedCompletion || *j.Spec.Suspend ||
		*j.Spec.PodReplacementPolicy != batchv1.TerminatingOrFailed {
		t.Errorf("job defaults %+v", j.Spec)
	}

	cj := grpCronJob("@hourly")
	cronJobKind.Default(cj)
	if cj.Spec.ConcurrencyPolicy != batchv1.AllowConcurrent || *cj.Spec.Suspend || *cj.Spec.SuccessfulJobsHistoryLimit != 3 ||
		*cj.Spec.FailedJobsHistoryLimit != 1 {
		t.Errorf("cronjob defaults %+v", cj.Spec)
	}

	np := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{Egress: []networkingv1.NetworkPolicyEgressRule{{}}}}
	networkPolicyKind.Default(np)
	if !reflect.DeepEqual(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("policy types %v", np.Spec.PolicyTypes)
	}

	pc := &schedulingv1.PriorityClass{}
	priorityClassKind.Default(pc)
	if pc.PreemptionPolicy == nil || *pc.PreemptionPolicy != corev1.PreemptLowerPriority {
		t.Errorf("preemption policy %v", pc.PreemptionPolicy)
	}

	es := &discoveryv1.EndpointSlice{Ports: []discoveryv1.EndpointPort{{Port: ptrTo[int32](80)}}}
	endpointSliceKind.Default(es)
	if es.Ports[0].Protocol == nil || *es.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("endpoint port protocol %v", es.Ports[0].Protocol)
	}
}

func TestJobGeneratedSelector(t *testing.T) {
	j := grpJob()
	if errs := grpCreate(jobKind, j); len(errs) != 0 {
		t.Fatalf("valid job rejected: %v", errs)
	}
	uid := string(j.UID)
	for _, k := range []string{"batch.kubernetes.io/controller-uid", "controller-uid"} {
		if j.Spec.Template.Labels[k] != uid {
			t.Errorf("template label %s = %q", k, j.Spec.Template.Labels[k])
		}
	}
	for _, k := range []string{"batch.kubernetes.io/job-name", "job-name"} {
		if j.Spec.Template.Labels[k] != "pi" {
			t.Errorf("template label %s = %q", k, j.Spec.Template.Labels[k])
		}
	}
	if !reflect.DeepEqual(j.Spec.Selector.MatchLabels, map[string]string{"batch.kubernetes.io/controller-uid": uid}) {
		t.Errorf("selector %v", j.Spec.Selector)
	}
	if j.Labels["job-name"] != "pi" {
		t.Errorf("job labels %v", j.Labels)
	}

	m := grpJob()
	m.Spec.ManualSelector = ptrTo(true)
	m.Spec.Selector = grpSelector()
	if errs := grpCreate(jobKind, m); len(errs) != 0 {
		t.Fatalf("manual selector job rejected: %v", errs)
	}
	if _, ok := m.Spec.Template.Labels["controller-uid"]; ok {
		t.Errorf("manual selector job got generated labels")
	}
}

func TestGroupValidate(t *testing.T) {
	tests := []struct {
		name string
		kind *Kind
		obj  runtime.Object
		want string // "" means valid; else the field path that must be reported
	}{
		{"deployment valid", deploymentKind, grpDeployment(), ""},
		{"deployment selector mismatch", deploymentKind, func() runtime.Object {
			d := grpDeployment()
			d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "other"}}
			return d
		}(), "spec.template.metadata.labels"},
		{"deployment no selector", deploymentKind, func() runtime.Object {
			d := grpDeployment()
			d.Spec.Selector = nil
			return d
		}(), "spec.selector"},
		{"deployment negative replicas", deploymentKind, func() runtime.Object {
			d := grpDeployment()
			d.Spec.Replicas = ptrTo[int32](-1)
			return d
		}(), "spec.replicas"},
		{"deployment zero surge and unavailable", deploymentKind, func() runtime.Object {
			d := grpDeployment()
			d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxUnavailable: ptrTo(intstr.FromInt32(0)), MaxSurge: ptrTo(intstr.FromString("0%"))}
			return d
		}(), "spec.strategy.rollingUpdate.maxUnavailable"},
		{"deployment bad percent", deploymentKind, func() runtime.Object {
			d := grpDeployment()
			d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxSurge: ptrTo(intstr.FromString("lots"))}
			return d
		}(), "spec.strategy.rollingUpdate.maxSurge"},
		{"deployment restart never", deploymentKind, func() runtime.Object {
			d := grpDeployment()
			d.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
			return d
		}(), "spec.template.spec.restartPolicy"},
		{"statefulset valid", statefulSetKind, grpStatefulSet(), ""},
		{"job valid", jobKind, grpJob(), ""},
		{"job restart always", jobKind, func() runtime.Object {
			j := grpJob()
			j.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyAlways
			return j
		}(), "spec.template.spec.restartPolicy"},
		{"cronjob valid", cronJobKind, grpCronJob("*/5 * * * *"), ""},
		{"cronjob macro", cronJobKind, grpCronJob("@daily"), ""},
		{"cronjob bad schedule", cronJobKind, grpCronJob("61 * * * *"), "spec.schedule"},
		{"cronjob too few fields", cronJobKind, grpCronJob("* * *"), "spec.schedule"},
		{"cronjob TZ in schedule", cronJobKind, grpCronJob("TZ=UTC 0 * * * *"), "spec.schedule"},
		{"cronjob bad time zone", cronJobKind, func() runtime.Object {
			c := grpCronJob("0 * * * *")
			c.Spec.TimeZone = ptrTo("Mars/Olympus")
			return c
		}(), "spec.timeZone"},
		{"pdb both set", podDisruptionBudgetKind, &policyv1.PodDisruptionBudget{Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptrTo(intstr.FromInt32(1)), MaxUnavailable: ptrTo(intstr.FromInt32(1))}}, "spec"},
		{"pdb valid", podDisruptionBudgetKind, &policyv1.PodDisruptionBudget{Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptrTo(intstr.FromString("50%")), Selector: grpSelector()}}, ""},
		{"role no verbs", roleKind, &rbacv1.Role{Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}}}}, "rules[0].verbs"},
		{"role non-resource", roleKind, &rbacv1.Role{Rules: []rbacv1.PolicyRule{{Verbs: []string{"get"}, NonResourceURLs: []string{"/healthz"}}}}, "rules[0].nonResourceURLs"},
		{"clusterrole non-resource", clusterRoleKind, &rbacv1.ClusterRole{Rules: []rbacv1.PolicyRule{{Verbs: []string{"get"}, NonResourceURLs: []string{"/healthz"}}}}, ""},
		{"clusterrolebinding to role", clusterRoleBindingKind, &rbacv1.ClusterRoleBinding{
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "r"}}, "roleRef.kind"},
		{"rolebinding valid", roleBindingKind, &rbacv1.RoleBinding{
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "default"}, {Kind: "User", APIGroup: rbacv1.GroupName, Name: "jane"}}}, ""},
		{"priorityclass too high", priorityClassKind, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 2000000000}, "value"},
		{"priorityclass reserved", priorityClassKind, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "system-mine"}, Value: 1}, "metadata.name"},
		{"endpointslice bad address type", endpointSliceKind, &discoveryv1.EndpointSlice{AddressType: "IPv5"}, "addressType"},
		{"endpointslice bad ip", endpointSliceKind, &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"::1"}}}}, "endpoints[0].addresses[0]"},
		{"endpointslice valid", endpointSliceKind, &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}}, Ports: []discoveryv1.EndpointPort{{Port: ptrTo[int32](80)}}}, ""},
		{"netpol endport on named port", networkPolicyKind, &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: ptrTo(intstr.FromString("http")), EndPort: ptrTo[int32](90)}}}}}},
			"spec.ingress[0].ports[0].endPort"},
		{"netpol empty peer", networkPolicyKind, &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{}}}}}}, "spec.ingress[0].from[0]"},
		{"lease zero duration", leaseKind, &coordinationLease0, "spec.leaseDurationSeconds"},
		{"event missing time", eventsV1Kind, &eventsv1.Event{Type: "Normal", ReportingController: "x", ReportingInstance: "i", Action: "a", Reason: "r"}, "eventTime"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := grpCreate(tt.kind, tt.obj)
			if tt.want == "" {
				if len(errs) != 0 {
					t.Fatalf("unexpected errors: %v", errs)
				}
				return
			}
			for _, e := range errs {
				if e.Field == tt.want {
					return
				}
			}
			t.Fatalf("want an error at %s, got %v", tt.want, errs)
		})
	}
}

func TestSelectorMismatchMessage(t *testing.T) {
	d := grpDeployment()
	d.Spec.Template.Labels = map[string]string{"app": "api"}
	errs := grpCreate(deploymentKind, d)
	want := "spec.template.metadata.labels: Invalid value: {\"app\":\"api\"}: `selector` does not match template `labels`"
	if len(errs) != 1 || errs[0].Error() != want {
		t.Fatalf("got %v, want %q", errs, want)
	}
}

func TestGroupValidateUpdate(t *testing.T) {
	tests := []struct {
		name   string
		kind   *Kind
		old    runtime.Object
		mutate func(runtime.Object)
		want   string
	}{
		{"deployment scale ok", deploymentKind, grpDeployment(), func(o runtime.Object) {
			o.(*appsv1.Deployment).Spec.Replicas = ptrTo[int32](5)
		}, ""},
		{"deployment selector immutable", deploymentKind, grpDeployment(), func(o runtime.Object) {
			d := o.(*appsv1.Deployment)
			d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web", "tier": "x"}}
			d.Spec.Template.Labels["tier"] = "x"
		}, "spec.selector"},
		{"statefulset template ok", statefulSetKind, grpStatefulSet(), func(o runtime.Object) {
			o.(*appsv1.StatefulSet).Spec.Template.Spec.Containers[0].Image = "nginx:1.28"
		}, ""},
		{"statefulset service name forbidden", statefulSetKind, grpStatefulSet(), func(o runtime.Object) {
			o.(*appsv1.StatefulSet).Spec.ServiceName = "other"
		}, "spec"},
		{"job template immutable", jobKind, grpJob(), func(o runtime.Object) {
			o.(*batchv1.Job).Spec.Template.Spec.Containers[0].Image = "perl:2"
		}, "spec.template"},
		{"rolebinding roleRef immutable", roleBindingKind, &rbacv1.RoleBinding{RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "a"}},
			func(o runtime.Object) { o.(*rbacv1.RoleBinding).RoleRef.Name = "b" }, "roleRef"},
		{"priorityclass value immutable", priorityClassKind, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Value: 1},
			func(o runtime.Object) { o.(*schedulingv1.PriorityClass).Value = 2 }, "value"},
		{"endpointslice address type immutable", endpointSliceKind, &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4},
			func(o runtime.Object) { o.(*discoveryv1.EndpointSlice).AddressType = discoveryv1.AddressTypeIPv6 }, "addressType"},
		{"controllerrevision data immutable", controllerRevisionKind, &appsv1.ControllerRevision{Data: runtime.RawExtension{Raw: []byte(`{"a":1}`)}, Revision: 1},
			func(o runtime.Object) { o.(*appsv1.ControllerRevision).Data.Raw = []byte(`{"a":2}`) }, "data"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if errs := grpCreate(tt.kind, tt.old); len(errs) != 0 {
				t.Fatalf("old object invalid: %v", errs)
			}
			obj := tt.old.DeepCopyObject()
			tt.mutate(obj)
			if tt.kind.Default != nil {
				tt.kind.Default(obj)
			}
			validate := tt.kind.ValidateUpdate
			if validate == nil {
				validate = func(obj, _ runtime.Object) field.ErrorList { return tt.kind.Validate(obj) }
			}
			errs := validate(obj, tt.old)
			if tt.want == "" {
				if len(errs) != 0 {
					t.Fatalf("unexpected errors: %v", errs)
				}
				return
			}
			for _, e := range errs {
				if e.Field == tt.want {
					return
				}
			}
			t.Fatalf("want an error at %s, got %v", tt.want, errs)
		})
	}
}

func TestScaleAccess(t *testing.T) {
	for _, k := range []*Kind{deploymentKind, replicaSetKind, statefulSetKind} {
		var obj runtime.Object
		switch k {
		case deploymentKind:
			obj = grpDeployment()
		case replicaSetKind:
			obj = &appsv1.ReplicaSet{Spec: appsv1.ReplicaSetSpec{Selector: grpSelector(), Template: grpTemplate()}}
		case statefulSetKind:
			obj = grpStatefulSet()
		}
		k.Default(obj)
		k.Scale.Set(obj, 4)
		spec, _, sel := k.Scale.Get(obj)
		if spec != 4 || sel != "app=web" {
			t.Errorf("%s: scale %d selector %q", k.Resource, spec, sel)
		}
	}
}

func TestGenerationChangedOnAnnotations(t *testing.T) {
	old := grpDeployment()
	cur := old.DeepCopy()
	cur.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": "now"}
	if !deploymentKind.GenerationChanged(cur, old) {
		t.Error("annotation change did not bump generation")
	}
	if deploymentKind.GenerationChanged(old.DeepCopy(), old) {
		t.Error("no change bumped generation")
	}
}

func TestEventConversionRoundTrip(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	micro := metav1.NewMicroTime(now.Time)
	in := &eventsv1.Event{
		TypeMeta:                 metav1.TypeMeta{APIVersion: "events.k8s.io/v1", Kind: "Event"},
		ObjectMeta:               metav1.ObjectMeta{Name: "web.1", Namespace: "default"},
		EventTime:                micro,
		Series:                   &eventsv1.EventSeries{Count: 3, LastObservedTime: micro},
		ReportingController:      "tether.io/scheduler",
		ReportingInstance:        "hub-1",
		Action:                   "Binding",
		Reason:                   "Scheduled",
		Regarding:                corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web"},
		Related:                  &corev1.ObjectReference{Kind: "Node", Name: "n1"},
		Note:                     "assigned default/web to n1",
		Type:                     "Normal",
		DeprecatedSource:         corev1.EventSource{Component: "scheduler", Host: "h"},
		DeprecatedFirstTimestamp: now,
		DeprecatedLastTimestamp:  now,
		DeprecatedCount:          2,
	}
	stored, err := eventsV1Kind.ToStorage(in)
	if err != nil {
		t.Fatal(err)
	}
	core := stored.(*corev1.Event)
	if core.InvolvedObject.Name != "web" || core.Message != in.Note || core.ReportingController != in.ReportingController ||
		core.Source.Component != "scheduler" || core.Count != 2 || core.Series.Count != 3 || core.Related.Name != "n1" ||
		core.Action != "Binding" || core.APIVersion != "v1" {
		t.Errorf("core event %+v", core)
	}
	back, err := eventsV1Kind.FromStorage(core)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, in) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, in)
	}
}

func TestGroupCells(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	created := metav1.NewTime(now.Add(-3 * time.Hour))
	start := metav1.NewTime(now.Add(-90 * time.Second))
	done := metav1.NewTime(now.Add(-30 * time.Second))

	d := grpDeployment()
	d.CreationTimestamp = created
	d.Spec.Replicas = ptrTo[int32](3)
	d.Status = appsv1.DeploymentStatus{ReadyReplicas: 2, UpdatedReplicas: 3, AvailableReplicas: 2}

	j := grpJob()
	j.CreationTimestamp = created
	grpCreate(jobKind, j)
	j.Status = batchv1.JobStatus{Succeeded: 1, StartTime: &start, CompletionTime: &done,
		Conditions: []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}}

	cj := grpCronJob("*/1 * * * *")
	cj.CreationTimestamp = created
	cronJobKind.Default(cj)

	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "agent", CreationTimestamp: created},
		Spec:   appsv1.DaemonSetSpec{Selector: grpSelector(), Template: grpTemplate()},
		Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 2, CurrentNumberScheduled: 2, NumberReady: 1, UpdatedNumberScheduled: 2, NumberAvailable: 1}}
	ds.Spec.Template.Spec.NodeSelector = map[string]string{"kubernetes.io/os": "linux"}

	cr := &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: "db-7f", CreationTimestamp: created,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "db", Controller: ptrTo(true)}}}, Revision: 2}

	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-abc", CreationTimestamp: created}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1", "10.0.0.2"}}, {Addresses: []string{"10.0.0.3"}}, {Addresses: []string{"10.0.0.4"}}},
		Ports:     []discoveryv1.EndpointPort{{Port: ptrTo[int32](80)}, {Port: ptrTo[int32](443)}}}

	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "rb", CreationTimestamp: created},
		RoleRef:  rbacv1.RoleRef{Kind: "ClusterRole", Name: "view"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "a"}, {Kind: "User", Name: "b"}, {Kind: "ServiceAccount", Namespace: "ns", Name: "sa"}}}

	tests := []struct {
		kind *Kind
		obj  runtime.Object
		want []any
	}{
		{deploymentKind, d, []any{"web", "2/3", int64(3), int64(2), "3h", "app", "nginx:1.27", "app=web"}},
		{jobKind, j, []any{"pi", "Complete", "1/1", "60s", "3h", "app", "nginx:1.27", "batch.kubernetes.io/controller-uid=" + string(j.UID)}},
		{cronJobKind, cj, []any{"tick", "*/1 * * * *", "<none>", "False", int64(0), "<none>", "3h", "app", "nginx:1.27", "<none>"}},
		{daemonSetKind, ds, []any{"agent", int64(2), int64(2), int64(1), int64(2), int64(1), "kubernetes.io/os=linux", "3h", "app", "nginx:1.27", "app=web"}},
		{controllerRevisionKind, cr, []any{"db-7f", "statefulset.apps/db", int64(2), "3h"}},
		{endpointSliceKind, es, []any{"web-abc", "IPv4", "80,443", "10.0.0.1,10.0.0.2,10.0.0.3 + 1 more...", "3h"}},
		{roleBindingKind, rb, []any{"rb", "ClusterRole/view", "3h", "a, b", "", "ns:sa"}},
		{roleKind, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "r", CreationTimestamp: created}}, []any{"r", "2026-01-01T09:00:00Z"}},
		{podDisruptionBudgetKind, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "p", CreationTimestamp: created},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptrTo(intstr.FromString("50%"))}, Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 1}},
			[]any{"p", "50%", "N/A", int64(1), "3h"}},
		{priorityClassKind, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "hi", CreationTimestamp: created}, Value: 1000, PreemptionPolicy: ptrTo(corev1.PreemptNever)},
			[]any{"hi", int64(1000), false, "3h", "Never"}},
		{networkPolicyKind, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny", CreationTimestamp: created}}, []any{"deny", "<none>", "3h"}},
	}
	for _, tt := range tests {
		got := tt.kind.Cells(tt.obj, now)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s cells:\n got %#v\nwant %#v", tt.kind.Resource, got, tt.want)
		}
		if len(got) != len(tt.kind.Columns) {
			t.Errorf("%s: %d cells for %d columns", tt.kind.Resource, len(got), len(tt.kind.Columns))
		}
	}
	var names []string
	for _, c := range deploymentKind.Columns {
		names = append(names, c.Name)
	}
	if strings.Join(names, ",") != "Name,Ready,Up-to-date,Available,Age,Containers,Images,Selector" {
		t.Errorf("deployment columns %v", names)
	}
}

func TestRBACNameRule(t *testing.T) {
	if msgs := roleKind.NameRule("system:controller:foo", false); len(msgs) != 0 {
		t.Errorf("path segment name rejected: %v", msgs)
	}
	if msgs := roleKind.NameRule("a/b", false); len(msgs) == 0 {
		t.Error("name with / accepted")
	}
}

var coordinationLease0 = coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptrTo[int32](0)}}

func TestDaemonSetTemplateGeneration(t *testing.T) {
	old := &appsv1.DaemonSet{ObjectMeta: grpMeta("agent"), Spec: appsv1.DaemonSetSpec{Selector: grpSelector(), Template: grpTemplate()}}
	if errs := grpCreate(daemonSetKind, old); len(errs) != 0 {
		t.Fatalf("valid daemonset rejected: %v", errs)
	}
	if got := old.Annotations[daemonSetTemplateGenerationKey]; got != "1" {
		t.Fatalf("template generation on create = %q", got)
	}
	tests := []struct {
		name   string
		mutate func(d *appsv1.DaemonSet)
		want   string
	}{
		{"template changed", func(d *appsv1.DaemonSet) { d.Spec.Template.Spec.Containers[0].Image = "nginx:2" }, "2"},
		{"other change", func(d *appsv1.DaemonSet) { d.Spec.MinReadySeconds = 5 }, "1"},
	}
	for _, tt := range tests {
		cur := old.DeepCopy()
		tt.mutate(cur)
		daemonSetKind.PrepareForUpdate(cur, old)
		if got := cur.Annotations[daemonSetTemplateGenerationKey]; got != tt.want {
			t.Errorf("%s: template generation %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestBindingDefaults(t *testing.T) {
	b := &rbacv1.ClusterRoleBinding{
		RoleRef:  rbacv1.RoleRef{Kind: "ClusterRole", Name: "view"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "jane"}, {Kind: "Group", Name: "ops"}, {Kind: "ServiceAccount", Namespace: "kube-system", Name: "x"}},
	}
	if errs := grpCreate(clusterRoleBindingKind, b); len(errs) != 0 {
		t.Fatalf("binding without apiGroups rejected: %v", errs)
	}
	want := []string{rbacv1.GroupName, rbacv1.GroupName, ""}
	for i, s := range b.Subjects {
		if s.APIGroup != want[i] {
			t.Errorf("subject %d apiGroup %q, want %q", i, s.APIGroup, want[i])
		}
	}
	if b.RoleRef.APIGroup != rbacv1.GroupName {
		t.Errorf("roleRef apiGroup %q", b.RoleRef.APIGroup)
	}
}

func TestStatefulSetClaimTemplateMount(t *testing.T) {
	s := grpStatefulSet()
	s.Spec.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	s.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}}}
	if errs := grpCreate(statefulSetKind, s); len(errs) != 0 {
		t.Fatalf("statefulset mounting a claim template rejected: %v", errs)
	}
	if msgs := statefulSetKind.NameRule("db.v1", false); len(msgs) == 0 {
		t.Error("statefulset name with a dot accepted")
	}
}

func TestDaemonSetStrategyValidation(t *testing.T) {
	tests := []struct {
		name string
		ru   *appsv1.RollingUpdateDaemonSet
		want string
	}{
		{"both zero", &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptrTo(intstr.FromInt32(0)), MaxSurge: ptrTo(intstr.FromInt32(0))}, "spec.updateStrategy.rollingUpdate.maxUnavailable"},
		{"both set", &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptrTo(intstr.FromInt32(1)), MaxSurge: ptrTo(intstr.FromString("10%"))}, "spec.updateStrategy.rollingUpdate.maxSurge"},
		{"surge only", &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptrTo(intstr.FromInt32(0)), MaxSurge: ptrTo(intstr.FromInt32(1))}, ""},
	}
	for _, tt := range tests {
		ds := &appsv1.DaemonSet{ObjectMeta: grpMeta("agent"), Spec: appsv1.DaemonSetSpec{Selector: grpSelector(), Template: grpTemplate(),
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType, RollingUpdate: tt.ru}}}
		errs := grpCreate(daemonSetKind, ds)
		if tt.want == "" {
			if len(errs) != 0 {
				t.Errorf("%s: unexpected %v", tt.name, errs)
			}
			continue
		}
		if len(errs) != 1 || errs[0].Field != tt.want {
			t.Errorf("%s: got %v, want one error at %s", tt.name, errs, tt.want)
		}
	}
}

func TestStorageClassAndDefaultClaimClass(t *testing.T) {
	bad := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	storageClassKind.Default(bad)
	if errs := storageClassKind.Validate(bad); len(errs) != 1 || errs[0].Field != "provisioner" {
		t.Errorf("class without provisioner: %v", errs)
	}
	old := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Provisioner: "tether.io/local-path"}
	storageClassKind.Default(old)
	if *old.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete || *old.VolumeBindingMode != storagev1.VolumeBindingImmediate {
		t.Errorf("defaults: %v %v", *old.ReclaimPolicy, *old.VolumeBindingMode)
	}
	changed := old.DeepCopy()
	changed.Provisioner = "other.io/p"
	if errs := storageClassKind.ValidateUpdate(changed, old); len(errs) != 1 || errs[0].Field != "provisioner" {
		t.Errorf("provisioner change: %v", errs)
	}

	older := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "older", CreationTimestamp: metav1.Unix(100, 0),
		Annotations: map[string]string{annDefaultStorageClass: "true"}}, Provisioner: "a.io/p"}
	newer := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "newer", CreationTimestamp: metav1.Unix(200, 0),
		Annotations: map[string]string{annDefaultStorageClass: "true"}}, Provisioner: "a.io/p"}
	plain := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "plain", CreationTimestamp: metav1.Unix(300, 0)}, Provisioner: "a.io/p"}
	l := listerFunc(func(resource string) []runtime.Object {
		if resource != "storageclasses.storage.k8s.io" {
			t.Fatalf("listed %s", resource)
		}
		return []runtime.Object{older, newer, plain}
	})
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data"}}
	if err := admitPVC(context.Background(), l, pvc, nil); err != nil {
		t.Fatal(err)
	}
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != "newer" {
		t.Errorf("claim without class got %v, want the newest default", pvc.Spec.StorageClassName)
	}
	none := ""
	explicit := &corev1.PersistentVolumeClaim{Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &none}}
	if err := admitPVC(context.Background(), l, explicit, nil); err != nil || *explicit.Spec.StorageClassName != "" {
		t.Errorf("claim asking for no class got %q (%v)", *explicit.Spec.StorageClassName, err)
	}
}

type listerFunc func(resource string) []runtime.Object

func (f listerFunc) List(_ context.Context, resource, _ string) ([]runtime.Object, error) {
	return f(resource), nil
}
