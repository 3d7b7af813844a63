package registry

//lint:file-ignore SA1019 Kubernetes still serves core/v1 Endpoints, so the hub does too

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/scheme"
)

func TestCoreDiscovery(t *testing.T) {
	tests := []struct {
		resource, singular, kind string
		namespaced, status       bool
		short, categories        []string
	}{
		{"configmaps", "configmap", "ConfigMap", true, false, []string{"cm"}, nil},
		{"endpoints", "endpoints", "Endpoints", true, false, []string{"ep"}, nil},
		{"events", "event", "Event", true, false, []string{"ev"}, nil},
		{"limitranges", "limitrange", "LimitRange", true, false, []string{"limits"}, nil},
		{"namespaces", "namespace", "Namespace", false, true, []string{"ns"}, nil},
		{"nodes", "node", "Node", false, true, []string{"no"}, nil},
		{"persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim", true, true, []string{"pvc"}, nil},
		{"persistentvolumes", "persistentvolume", "PersistentVolume", false, true, []string{"pv"}, nil},
		{"pods", "pod", "Pod", true, true, []string{"po"}, []string{"all"}},
		{"podtemplates", "podtemplate", "PodTemplate", true, false, nil, nil},
		{"replicationcontrollers", "replicationcontroller", "ReplicationController", true, true, []string{"rc"}, []string{"all"}},
		{"resourcequotas", "resourcequota", "ResourceQuota", true, true, []string{"quota"}, nil},
		{"secrets", "secret", "Secret", true, false, nil, nil},
		{"serviceaccounts", "serviceaccount", "ServiceAccount", true, false, []string{"sa"}, nil},
		{"services", "service", "Service", true, true, []string{"svc"}, []string{"all"}},
	}
	kinds := coreKinds(newServiceAllocator(ServiceNetwork{}), newPodCIDRAllocator(ClusterNetwork{}))
	if len(kinds) != len(tests) {
		t.Fatalf("%d core kinds, want %d", len(kinds), len(tests))
	}
	for i, tt := range tests {
		k := kinds[i]
		if k.Resource != tt.resource || k.Singular != tt.singular || k.GVK.Kind != tt.kind || k.GVK.Version != "v1" || k.GVK.Group != "" ||
			k.Namespaced != tt.namespaced || k.HasStatus != tt.status || !reflect.DeepEqual(k.ShortNames, tt.short) || !reflect.DeepEqual(k.Categories, tt.categories) {
			t.Errorf("kind %d = %+v, want %+v", i, k, tt)
		}
		if k.Cells == nil || len(k.Columns) == 0 {
			t.Errorf("%s has no table", k.Resource)
		}
		// Every kind round-trips through the client-go scheme.
		if _, err := scheme.Scheme.New(k.GVK); err != nil {
			t.Errorf("%s: %v", k.Resource, err)
		}
	}
	if v := namespaceKind.Verbs; len(v) != 7 || strings.Contains(strings.Join(v, ","), "deletecollection") {
		t.Errorf("namespace verbs = %v", v)
	}
}

// TestCoreCellsMatchColumns renders every kind's zero object and checks the
// number of cells.
func TestCoreCellsMatchColumns(t *testing.T) {
	for _, k := range coreKinds(newServiceAllocator(ServiceNetwork{}), newPodCIDRAllocator(ClusterNetwork{})) {
		obj, err := scheme.Scheme.New(k.GVK)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(k.Cells(obj, time.Now())); got != len(k.Columns) {
			t.Errorf("%s: %d cells, %d columns", k.Resource, got, len(k.Columns))
		}
		if k.Fields != nil {
			got := k.Fields(obj)
			if len(got) != len(k.FieldLabels) {
				t.Errorf("%s: Fields has %d keys, FieldLabels %d", k.Resource, len(got), len(k.FieldLabels))
			}
			for _, l := range k.FieldLabels {
				if _, ok := got[l]; !ok {
					t.Errorf("%s: label %s missing from Fields", k.Resource, l)
				}
			}
		}
	}
}

func TestNamespace(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}
	namespaceKind.Default(ns)
	namespaceKind.PrepareForCreate(ns)
	if ns.Labels[corev1.LabelMetadataName] != "team-a" || ns.Status.Phase != corev1.NamespaceActive ||
		!reflect.DeepEqual(ns.Spec.Finalizers, []corev1.FinalizerName{"kubernetes"}) {
		t.Errorf("namespace = %+v", ns)
	}
	if errs := namespaceKind.Validate(ns); len(errs) > 0 {
		t.Errorf("valid namespace: %v", errs)
	}
	if msgs := namespaceKind.NameRule("a.b", false); len(msgs) == 0 {
		t.Error("dotted namespace name accepted")
	}
	ns.Spec.Finalizers = append(ns.Spec.Finalizers, "custom")
	wantErr(t, namespaceKind.Validate(ns), field.ErrorTypeInvalid, "spec.finalizers")
	term := ns.DeepCopy()
	term.Status.Phase = corev1.NamespaceTerminating
	wantErr(t, namespaceKind.ValidateStatusUpdate(term, ns), field.ErrorTypeInvalid, "status.phase")
	if got := namespaceKind.Cells(ns, time.Now()); got[1] != "Active" {
		t.Errorf("cells = %v", got)
	}
}

func TestNodeCells(t *testing.T) {
	nodeKind := Lookup(corev1.SchemeGroupVersion.WithResource("nodes"))
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Labels: map[string]string{
		"node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/edge": "", "kubernetes.io/role": "worker"}}}
	n.Spec.Unschedulable = true
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "edge-1"}, {Type: corev1.NodeInternalIP, Address: "192.168.1.5"}}
	n.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.37.2", OSImage: "Debian GNU/Linux 13", KernelVersion: "6.12.0", ContainerRuntimeVersion: "containerd://2.1.0"}
	want := []any{"edge-1", "Ready,SchedulingDisabled", "control-plane,edge,worker", "<unknown>", "v1.37.2", "192.168.1.5", "<none>", "Debian GNU/Linux 13", "6.12.0", "containerd://2.1.0"}
	if got := nodeKind.Cells(n, time.Now()); !reflect.DeepEqual(got, want) {
		t.Errorf("cells = %#v", got)
	}
	n.Status.Conditions[0].Status = corev1.ConditionUnknown
	n.Spec.Unschedulable = false
	if got := nodeKind.Cells(n, time.Now())[1]; got != "NotReady" {
		t.Errorf("status = %v", got)
	}
	n.Status.Conditions = nil
	if got := nodeKind.Cells(n, time.Now())[1]; got != "Unknown" {
		t.Errorf("status = %v", got)
	}
}

func TestValidateNode(t *testing.T) {
	nodeKind := Lookup(corev1.SchemeGroupVersion.WithResource("nodes"))
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"},
		Taints: []corev1.Taint{{Key: "edge", Effect: corev1.TaintEffectNoSchedule}}}}
	if errs := nodeKind.Validate(n); len(errs) > 0 {
		t.Fatalf("valid node: %v", errs)
	}
	bad := n.DeepCopy()
	bad.Spec.Taints[0].Effect = "Sometimes"
	wantErr(t, nodeKind.Validate(bad), field.ErrorTypeNotSupported, "spec.taints[0].effect")
	bad = n.DeepCopy()
	bad.Spec.PodCIDR, bad.Spec.PodCIDRs = "10.244.1.0", []string{"10.244.1.0"}
	wantErr(t, nodeKind.Validate(bad), field.ErrorTypeInvalid, "spec.podCIDRs[0]")
	moved := n.DeepCopy()
	moved.Spec.PodCIDR, moved.Spec.PodCIDRs = "10.244.2.0/24", []string{"10.244.2.0/24"}
	wantErr(t, nodeKind.ValidateUpdate(moved, n), field.ErrorTypeForbidden, "spec.podCIDRs")
	if f := nodeKind.Fields(n); f["spec.unschedulable"] != "false" {
		t.Errorf("fields = %v", f)
	}
}

func TestConfigMap(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Data: map[string]string{"a.conf": "x"}, BinaryData: map[string][]byte{"b": {1}}}
	if errs := configMapKind.Validate(cm); len(errs) > 0 {
		t.Fatalf("valid configmap: %v", errs)
	}
	bad := cm.DeepCopy()
	bad.Data["bad key"] = ""
	wantErr(t, configMapKind.Validate(bad), field.ErrorTypeInvalid, "data[bad key]")
	bad = cm.DeepCopy()
	bad.Data["b"] = ""
	wantErr(t, configMapKind.Validate(bad), field.ErrorTypeInvalid, "data[b]")
	bad = cm.DeepCopy()
	bad.Data["big"] = strings.Repeat("x", 1<<20)
	wantErr(t, configMapKind.Validate(bad), field.ErrorTypeTooLong, field.NewPath("").String())

	yes := true
	cm.Immutable = &yes
	changed := cm.DeepCopy()
	changed.Data["a.conf"] = "y"
	wantErr(t, configMapKind.ValidateUpdate(changed, cm), field.ErrorTypeForbidden, "data")
	unset := cm.DeepCopy()
	unset.Immutable = nil
	wantErr(t, configMapKind.ValidateUpdate(unset, cm), field.ErrorTypeForbidden, "immutable")
	if got := configMapKind.Cells(cm, time.Now()); got[1] != int64(2) {
		t.Errorf("data count = %v", got[1])
	}
}

func TestSecret(t *testing.T) {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}, StringData: map[string]string{"password": "hunter2"}}
	secretKind.Default(s)
	if s.Type != corev1.SecretTypeOpaque || string(s.Data["password"]) != "hunter2" || s.StringData != nil {
		t.Fatalf("defaults: %+v", s)
	}
	if errs := secretKind.Validate(s); len(errs) > 0 {
		t.Fatalf("valid secret: %v", errs)
	}
	tests := []struct {
		name string
		s    *corev1.Secret
		typ  field.ErrorType
		path string
	}{
		{"tls cert", &corev1.Secret{Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.key": {}}}, field.ErrorTypeRequired, "data[tls.crt]"},
		{"tls key", &corev1.Secret{Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": {}}}, field.ErrorTypeRequired, "data[tls.key]"},
		{"dockerconfigjson", &corev1.Secret{Type: corev1.SecretTypeDockerConfigJson}, field.ErrorTypeRequired, "data[.dockerconfigjson]"},
		{"dockerconfigjson not json", &corev1.Secret{Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{".dockerconfigjson": []byte("{")}}, field.ErrorTypeInvalid, "data[.dockerconfigjson]"},
		{"service account token", &corev1.Secret{Type: corev1.SecretTypeServiceAccountToken}, field.ErrorTypeRequired, "metadata.annotations[kubernetes.io/service-account.name]"},
		{"basic auth", &corev1.Secret{Type: corev1.SecretTypeBasicAuth}, field.ErrorTypeRequired, "data[username]"},
		{"ssh", &corev1.Secret{Type: corev1.SecretTypeSSHAuth}, field.ErrorTypeRequired, "data[ssh-privatekey]"},
		{"bad key", &corev1.Secret{Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"a/b": {}}}, field.ErrorTypeInvalid, "data[a/b]"},
	}
	for _, tt := range tests {
		wantErr(t, secretKind.Validate(tt.s), tt.typ, tt.path)
	}
	retyped := s.DeepCopy()
	retyped.Type = corev1.SecretTypeBasicAuth
	wantErr(t, secretKind.ValidateUpdate(retyped, s), field.ErrorTypeInvalid, "type")
	if f := secretKind.Fields(s); f["type"] != "Opaque" {
		t.Errorf("fields = %v", f)
	}
	if got := secretKind.Cells(s, time.Now()); !reflect.DeepEqual(got[:3], []any{"s", "Opaque", int64(1)}) {
		t.Errorf("cells = %v", got)
	}
}

func TestEndpoints(t *testing.T) {
	ep := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Subsets: []corev1.EndpointSubset{{
		Addresses: []corev1.EndpointAddress{{IP: "10.0.0.1"}, {IP: "10.0.0.2"}},
		Ports:     []corev1.EndpointPort{{Name: "http", Port: 80}, {Name: "https", Port: 443}},
	}}}
	endpointsKind.Default(ep)
	if errs := endpointsKind.Validate(ep); len(errs) > 0 {
		t.Fatalf("valid endpoints: %v", errs)
	}
	if got := formatEndpoints(ep); got != "10.0.0.1:80,10.0.0.2:80,10.0.0.1:443 + 1 more..." {
		t.Errorf("endpoints = %q", got)
	}
	if got := formatEndpoints(&corev1.Endpoints{}); got != "<none>" {
		t.Errorf("empty endpoints = %q", got)
	}
	bad := ep.DeepCopy()
	bad.Subsets[0].Addresses[0].IP = "127.0.0.1"
	wantErr(t, endpointsKind.Validate(bad), field.ErrorTypeInvalid, "subsets[0].addresses[0].ip")
	bad = ep.DeepCopy()
	bad.Subsets[0].Ports[1].Name = ""
	wantErr(t, endpointsKind.Validate(bad), field.ErrorTypeRequired, "subsets[0].ports[1].name")
}

func TestEvent(t *testing.T) {
	now := time.Now()
	e := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "web.1", Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "web", FieldPath: "spec.containers{app}"},
		Reason:         "Pulled", Message: "Pulled image  ", Type: "Normal", Count: 3,
		Source:         corev1.EventSource{Component: "kubelet", Host: "edge-1"},
		FirstTimestamp: metav1.NewTime(now.Add(-time.Hour)), LastTimestamp: metav1.NewTime(now.Add(-2 * time.Minute)),
	}
	if errs := eventKind.Validate(e); len(errs) > 0 {
		t.Fatalf("valid event: %v", errs)
	}
	want := []any{"2m", "Normal", "Pulled", "pod/web", "spec.containers{app}", "kubelet, edge-1", "Pulled image", "60m", int64(3), "web.1"}
	if got := eventKind.Cells(e, now); !reflect.DeepEqual(got, want) {
		t.Errorf("cells = %#v", got)
	}
	other := e.DeepCopy()
	other.InvolvedObject.Namespace = "kube-system"
	wantErr(t, eventKind.Validate(other), field.ErrorTypeInvalid, "involvedObject.namespace")
	f := eventKind.Fields(e)
	if f["involvedObject.name"] != "web" || f["source"] != "kubelet" || f["reason"] != "Pulled" || f["type"] != "Normal" {
		t.Errorf("fields = %v", f)
	}
	newStyle := e.DeepCopy()
	newStyle.EventTime = metav1.NewMicroTime(now)
	wantErr(t, eventKind.Validate(newStyle), field.ErrorTypeRequired, "reportingComponent")
}

func TestPersistentVolumes(t *testing.T) {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv1"}, Spec: corev1.PersistentVolumeSpec{
		Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")},
		AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany, corev1.ReadWriteOnce},
		PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/data"}},
		ClaimRef:               &corev1.ObjectReference{Namespace: "default", Name: "data"},
		StorageClassName:       "local",
	}}
	pvKind.Default(pv)
	pvKind.PrepareForCreate(pv)
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain || *pv.Spec.VolumeMode != corev1.PersistentVolumeFilesystem || pv.Status.Phase != corev1.VolumePending {
		t.Errorf("pv defaults: %+v", pv)
	}
	if errs := pvKind.Validate(pv); len(errs) > 0 {
		t.Fatalf("valid pv: %v", errs)
	}
	want := []any{"pv1", "10Gi", "RWO,RWX", "Retain", "Pending", "default/data", "local", "<unset>", "", "<unknown>", "Filesystem"}
	if got := pvKind.Cells(pv, time.Now()); !reflect.DeepEqual(got, want) {
		t.Errorf("pv cells = %#v", got)
	}
	bad := pv.DeepCopy()
	bad.Spec.Capacity = nil
	bad.Spec.AccessModes = nil
	errs := pvKind.Validate(bad)
	wantErr(t, errs, field.ErrorTypeRequired, "spec.capacity")
	wantErr(t, errs, field.ErrorTypeRequired, "spec.accessModes")
	bad = pv.DeepCopy()
	bad.Spec.NFS = &corev1.NFSVolumeSource{Server: "s", Path: "/"}
	wantErr(t, pvKind.Validate(bad), field.ErrorTypeForbidden, "spec")
	wantErr(t, pvKind.ValidateUpdate(bad, pv), field.ErrorTypeForbidden, "spec.persistentvolumesource")

	class := "local"
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "default"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		StorageClassName: &class,
	}}
	pvcKind.Default(pvc)
	pvcKind.PrepareForCreate(pvc)
	if *pvc.Spec.VolumeMode != corev1.PersistentVolumeFilesystem || pvc.Status.Phase != corev1.ClaimPending {
		t.Errorf("pvc defaults: %+v", pvc)
	}
	if errs := pvcKind.Validate(pvc); len(errs) > 0 {
		t.Fatalf("valid pvc: %v", errs)
	}
	if got := pvcKind.Cells(pvc, time.Now()); !reflect.DeepEqual(got, []any{"data", "Pending", "", "", "", "local", "<unset>", "<unknown>", "Filesystem"}) {
		t.Errorf("pvc cells = %#v", got)
	}
	noSize := pvc.DeepCopy()
	noSize.Spec.Resources.Requests = nil
	wantErr(t, pvcKind.Validate(noSize), field.ErrorTypeRequired, "spec.resources.requests[storage]")

	// Binding sets the volume name; growing is allowed once bound; other changes are not.
	bound := pvc.DeepCopy()
	bound.Spec.VolumeName = "pv1"
	if errs := pvcKind.ValidateUpdate(bound, pvc); len(errs) > 0 {
		t.Errorf("binding: %v", errs)
	}
	bound.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, AccessModes: bound.Spec.AccessModes,
		Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}
	grown := bound.DeepCopy()
	grown.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
	if errs := pvcKind.ValidateUpdate(grown, bound); len(errs) > 0 {
		t.Errorf("growth: %v", errs)
	}
	// A claim bound to a larger volume keeps its request through other
	// updates (a finalizer); shrinking to the capacity or below is refused.
	big := bound.DeepCopy()
	big.Status.Capacity[corev1.ResourceStorage] = resource.MustParse("5Gi")
	fin := big.DeepCopy()
	fin.Finalizers = []string{"kubernetes.io/pvc-protection"}
	if errs := pvcKind.ValidateUpdate(fin, big); len(errs) > 0 {
		t.Errorf("finalizer on a claim bound to a larger volume: %v", errs)
	}
	shrunk := grown.DeepCopy()
	shrunk.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("1Gi")
	wantErr(t, pvcKind.ValidateUpdate(shrunk, grown), field.ErrorTypeForbidden, "spec.resources.requests.storage")
	if got := pvcKind.Cells(bound, time.Now()); !reflect.DeepEqual(got[:5], []any{"data", "Bound", "pv1", "1Gi", "RWO"}) {
		t.Errorf("bound cells = %#v", got)
	}
	grownUnbound := pvc.DeepCopy()
	grownUnbound.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
	wantErr(t, pvcKind.ValidateUpdate(grownUnbound, pvc), field.ErrorTypeForbidden, "spec")
	modes := bound.DeepCopy()
	modes.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	wantErr(t, pvcKind.ValidateUpdate(modes, bound), field.ErrorTypeForbidden, "spec")
}

func TestResourceQuota(t *testing.T) {
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{
		"pods": resource.MustParse("10"), "requests.cpu": resource.MustParse("4"), "limits.memory": resource.MustParse("8Gi")}}}
	if errs := resourceQuotaKind.Validate(q); len(errs) > 0 {
		t.Fatalf("valid quota: %v", errs)
	}
	q.Status.Hard = q.Spec.Hard
	q.Status.Used = corev1.ResourceList{"pods": resource.MustParse("3"), "requests.cpu": resource.MustParse("500m")}
	got := resourceQuotaKind.Cells(q, time.Now())
	want := []any{"q", "<unknown>", "pods: 3/10, requests.cpu: 500m/4", "limits.memory: 0/8Gi"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("cells = %#v", got)
	}
	bad := q.DeepCopy()
	bad.Spec.Hard["pods"] = resource.MustParse("-1")
	wantErr(t, resourceQuotaKind.Validate(bad), field.ErrorTypeInvalid, "spec.hard[pods]")
	bad = q.DeepCopy()
	bad.Spec.Scopes = []corev1.ResourceQuotaScope{"Sometimes"}
	wantErr(t, resourceQuotaKind.Validate(bad), field.ErrorTypeNotSupported, "spec.scopes[0]")
}

func TestLimitRange(t *testing.T) {
	lr := &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "l", CreationTimestamp: metav1.NewTime(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
			Type: corev1.LimitTypeContainer,
			Max:  corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
			Min:  corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		}}}}
	limitRangeKind.Default(lr)
	item := lr.Spec.Limits[0]
	if item.Default.Cpu().String() != "2" || item.DefaultRequest.Cpu().String() != "2" || item.DefaultRequest.Memory().String() != "64Mi" {
		t.Errorf("defaults: %+v", item)
	}
	if errs := limitRangeKind.Validate(lr); len(errs) > 0 {
		t.Fatalf("valid limit range: %v", errs)
	}
	if got := limitRangeKind.Cells(lr, time.Now()); !reflect.DeepEqual(got, []any{"l", "2026-03-04T05:06:07Z"}) {
		t.Errorf("cells = %#v", got)
	}
	bad := lr.DeepCopy()
	bad.Spec.Limits[0].Min[corev1.ResourceCPU] = resource.MustParse("3")
	wantErr(t, limitRangeKind.Validate(bad), field.ErrorTypeInvalid, "spec.limits[0].min[cpu]")
	bad = lr.DeepCopy()
	bad.Spec.Limits[0].Type = "Cluster"
	wantErr(t, limitRangeKind.Validate(bad), field.ErrorTypeNotSupported, "spec.limits[0].type")
}

func TestServiceAccount(t *testing.T) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Secrets: []corev1.ObjectReference{{Name: "t"}}}
	if errs := serviceAccountKind.Validate(sa); len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := serviceAccountKind.Cells(sa, time.Now()); !reflect.DeepEqual(got, []any{"default", int64(1), "<unknown>"}) {
		t.Errorf("cells = %#v", got)
	}
}

var _ runtime.Object = (*corev1.Pod)(nil)
