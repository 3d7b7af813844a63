package scheduler

import (
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/reference"
)

// slimPodFields lists, for each struct of a pod that slimPod looks into,
// the fields it keeps whole, the fields it keeps in part (checked on
// their own in TestSlimPod) and the fields it drops. Every field must be
// listed, so that a field a new k8s.io/api adds is looked at: if the
// scheduler reads it, slimPod must keep it.
var slimPodFields = map[string]struct{ kept, part, dropped string }{
	"ObjectMeta": {
		kept:    "Name Namespace UID ResourceVersion CreationTimestamp DeletionTimestamp Labels",
		dropped: "GenerateName SelfLink Generation DeletionGracePeriodSeconds Annotations OwnerReferences Finalizers ManagedFields",
	},
	"PodSpec": {
		kept: "NodeName SchedulerName SchedulingGates Priority PriorityClassName PreemptionPolicy NodeSelector Affinity " +
			"Tolerations TopologySpreadConstraints Overhead ActiveDeadlineSeconds TerminationGracePeriodSeconds",
		part: "Volumes InitContainers Containers EphemeralContainers",
		dropped: "RestartPolicy DNSPolicy ServiceAccountName DeprecatedServiceAccount AutomountServiceAccountToken " +
			"HostNetwork HostPID HostIPC ShareProcessNamespace SecurityContext ImagePullSecrets Hostname Subdomain " +
			"HostAliases DNSConfig ReadinessGates RuntimeClassName EnableServiceLinks SetHostnameAsFQDN OS HostUsers " +
			"ResourceClaims Resources HostnameOverride SchedulingGroup EvictionResponders",
	},
	"PodStatus": {
		kept: "Phase NominatedNodeName StartTime",
		part: "Conditions",
		dropped: "ObservedGeneration Message Reason HostIP HostIPs PodIP PodIPs InitContainerStatuses ContainerStatuses " +
			"QOSClass EphemeralContainerStatuses Resize ResourceClaimStatuses ExtendedResourceClaimStatus " +
			"AllocatedResources Resources NodeAllocatableResourceClaimStatuses VolumeHealth",
	},
	"Container": {
		kept: "Name Image Ports Resources RestartPolicy",
		dropped: "Command Args WorkingDir EnvFrom Env ResizePolicy RestartPolicyRules VolumeMounts VolumeDevices " +
			"LivenessProbe ReadinessProbe StartupProbe Lifecycle TerminationMessagePath TerminationMessagePolicy " +
			"ImagePullPolicy SecurityContext Stdin StdinOnce TTY",
	},
	"Volume": {kept: "Name", part: "VolumeSource"},
	"VolumeSource": {
		kept: "PersistentVolumeClaim Ephemeral",
		dropped: "HostPath EmptyDir GCEPersistentDisk AWSElasticBlockStore GitRepo Secret NFS ISCSI Glusterfs RBD " +
			"FlexVolume Cinder CephFS Flocker DownwardAPI FC AzureFile ConfigMap VsphereVolume Quobyte AzureDisk " +
			"PhotonPersistentDisk Projected PortworxVolume ScaleIO StorageOS CSI Image",
	},
	"EphemeralContainer": {part: "EphemeralContainerCommon", dropped: "TargetContainerName"},
	"EphemeralContainerCommon": {
		kept: "Name",
		dropped: "Image Command Args WorkingDir Ports EnvFrom Env Resources ResizePolicy RestartPolicy RestartPolicyRules " +
			"VolumeMounts VolumeDevices LivenessProbe ReadinessProbe StartupProbe Lifecycle TerminationMessagePath " +
			"TerminationMessagePolicy ImagePullPolicy SecurityContext Stdin StdinOnce TTY",
	},
}

// TestSlimPod fills every field of a pod, slims it, and checks each field
// against slimPodFields.
func TestSlimPod(t *testing.T) {
	whole := &corev1.Pod{}
	fill(reflect.ValueOf(whole).Elem(), 0)
	// One volume that claims storage (fill set every source, the claim
	// among them) and one that does not; one condition of each kind.
	whole.Spec.Volumes = append(whole.Spec.Volumes, corev1.Volume{Name: "token",
		VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}})
	scheduled := corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes"}
	whole.Status.Conditions = append(whole.Status.Conditions, scheduled, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	before := whole.DeepCopy()
	slim := slimPod(whole)
	if !apiequality.Semantic.DeepEqual(whole, before) {
		t.Fatal("slimPod changed the pod it was given")
	}

	if slim.TypeMeta != whole.TypeMeta {
		t.Errorf("TypeMeta = %+v, want %+v", slim.TypeMeta, whole.TypeMeta)
	}
	checkFields(t, "ObjectMeta", whole.ObjectMeta, slim.ObjectMeta)
	checkFields(t, "PodSpec", whole.Spec, slim.Spec)
	checkFields(t, "PodStatus", whole.Status, slim.Status)

	if len(slim.Spec.Volumes) != 1 {
		t.Fatalf("kept %d volumes, want the 1 that claims storage", len(slim.Spec.Volumes))
	}
	checkFields(t, "Volume", whole.Spec.Volumes[0], slim.Spec.Volumes[0])
	checkFields(t, "VolumeSource", whole.Spec.Volumes[0].VolumeSource, slim.Spec.Volumes[0].VolumeSource)
	for _, l := range []struct{ whole, slim []corev1.Container }{
		{whole.Spec.InitContainers, slim.Spec.InitContainers},
		{whole.Spec.Containers, slim.Spec.Containers},
	} {
		if len(l.slim) != len(l.whole) {
			t.Fatalf("kept %d of %d containers", len(l.slim), len(l.whole))
		}
		for i := range l.whole {
			checkFields(t, "Container", l.whole[i], l.slim[i])
		}
	}
	if len(slim.Spec.EphemeralContainers) != len(whole.Spec.EphemeralContainers) {
		t.Fatalf("kept %d of %d ephemeral containers", len(slim.Spec.EphemeralContainers), len(whole.Spec.EphemeralContainers))
	}
	for i := range whole.Spec.EphemeralContainers {
		f, s := whole.Spec.EphemeralContainers[i], slim.Spec.EphemeralContainers[i]
		checkFields(t, "EphemeralContainer", f, s)
		checkFields(t, "EphemeralContainerCommon", f.EphemeralContainerCommon, s.EphemeralContainerCommon)
	}
	if want := []corev1.PodCondition{scheduled}; !apiequality.Semantic.DeepEqual(slim.Status.Conditions, want) {
		t.Errorf("conditions = %+v, want only PodScheduled %+v", slim.Status.Conditions, want)
	}

	if again := slimPod(slim); !apiequality.Semantic.DeepEqual(again, slim) {
		t.Error("slimPod of a slim pod is not the same slim pod")
	}
}

// checkFields checks a struct of the whole pod and the same struct of its
// slim copy against slimPodFields[name]. Every field of the whole pod's
// struct must be set, so that a dropped field is seen going.
func checkFields(t *testing.T, name string, whole, slim any) {
	t.Helper()
	row, ok := slimPodFields[name]
	if !ok {
		t.Fatalf("slimPodFields has no row %s", name)
	}
	listed := map[string]string{}
	for kind, names := range map[string]string{"kept": row.kept, "part": row.part, "dropped": row.dropped} {
		for _, f := range strings.Fields(names) {
			listed[f] = kind
		}
	}
	fv, sv := reflect.ValueOf(whole), reflect.ValueOf(slim)
	for i := range fv.NumField() {
		f := fv.Type().Field(i)
		if fv.Field(i).IsZero() {
			t.Errorf("%s.%s: the test's pod does not set it", name, f.Name)
		}
		switch listed[f.Name] {
		case "kept":
			if !apiequality.Semantic.DeepEqual(fv.Field(i).Interface(), sv.Field(i).Interface()) {
				t.Errorf("%s.%s: dropped or changed, want kept: the scheduler reads it", name, f.Name)
			}
		case "dropped":
			if !sv.Field(i).IsZero() {
				t.Errorf("%s.%s: kept, want dropped: the scheduler does not read it", name, f.Name)
			}
		case "part":
		default:
			t.Errorf("%s.%s: not in slimPodFields; tell slimPod whether the scheduler reads it, and list it", name, f.Name)
		}
		delete(listed, f.Name)
	}
	for f := range listed {
		t.Errorf("slimPodFields lists %s.%s, which does not exist", name, f)
	}
}

// fill sets every settable field under v to a value other than its zero:
// strings "x", numbers 1, true, one element in every slice and map.
func fill(v reflect.Value, depth int) {
	if depth > 12 || !v.CanSet() {
		return
	}
	if v.Type() == reflect.TypeFor[time.Time]() {
		v.Set(reflect.ValueOf(time.Unix(1, 0).UTC()))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), depth+1)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0), depth+1)
	case reflect.Map:
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, depth+1)
		fill(e, depth+1)
		v.Set(reflect.MakeMapWithSize(v.Type(), 1))
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			fill(v.Field(i), depth+1)
		}
	}
}

// realisticPodJSON is a DaemonSet's running pod as the API serves it
// (managedFields left out: the informer never keeps them): a projected
// service account volume, the tolerations the DaemonSet controller adds,
// five conditions and a container status. %[1]s is its name, %[2]s its
// uid.
const realisticPodJSON = `{
  "apiVersion": "v1", "kind": "Pod",
  "metadata": {
    "name": "%[1]s", "generateName": "app-", "namespace": "default", "uid": "%[2]s",
    "resourceVersion": "1835022", "generation": 1, "creationTimestamp": "2025-01-01T00:00:00Z",
    "labels": {"app": "app", "controller-revision-hash": "6d5f8b7c9d", "pod-template-generation": "1"},
    "annotations": {"kubectl.kubernetes.io/default-container": "app"},
    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "app",
      "uid": "5c1b3f0e-8a9d-4f7e-9b2a-3d4c5e6f7a8b", "controller": true, "blockOwnerDeletion": true}]
  },
  "spec": {
    "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
      {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
      {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
      {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
    ]}}],
    "containers": [{"name": "app", "image": "app:1", "resources": {},
      "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
      "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
    "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
    "serviceAccountName": "default", "serviceAccount": "default", "nodeName": "node-00042", "securityContext": {},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
      {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-00042"]}]}]}}},
    "schedulerName": "default-scheduler",
    "tolerations": [
      {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
      {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
      {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
      {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
      {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
      {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}],
    "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"
  },
  "status": {
    "phase": "Running",
    "conditions": [
      {"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2025-01-01T00:00:03Z"},
      {"type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2025-01-01T00:00:01Z"},
      {"type": "ContainersReady", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2025-01-01T00:00:04Z"},
      {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2025-01-01T00:00:04Z"},
      {"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2025-01-01T00:00:00Z"}],
    "hostIP": "10.0.0.42", "hostIPs": [{"ip": "10.0.0.42"}],
    "podIP": "10.244.42.17", "podIPs": [{"ip": "10.244.42.17"}],
    "startTime": "2025-01-01T00:00:01Z",
    "containerStatuses": [{"name": "app", "state": {"running": {"startedAt": "2025-01-01T00:00:03Z"}}, "lastState": {},
      "ready": true, "restartCount": 0, "image": "docker.io/library/app:1",
      "imageID": "docker.io/library/app@sha256:3f1a8c1d5e0b7a9c2d4e6f8a0b1c3d5e7f9a1b3c5d7e9f0a2b4c6d8e0f1a3b5c",
      "containerID": "containerd://9b2e4c6a8d0f1e3c5a7b9d1f3e5c7a9b1d3f5e7c9a1b3d5f7e9c1a3b5d7f9e1c", "started": true}],
    "qosClass": "BestEffort"
  }
}`

// realisticPod decodes realisticPodJSON, named name with uid.
func realisticPod(t testing.TB, name, uid string) *corev1.Pod {
	t.Helper()
	obj, err := k8sruntime.Decode(scheme.Codecs.UniversalDeserializer(), fmt.Appendf(nil, realisticPodJSON, name, uid))
	if err != nil {
		t.Fatalf("decode pod: %v", err)
	}
	return obj.(*corev1.Pod)
}

// TestSlimPodReadsTheSame: what the scheduler derives from a realistic pod,
// the Event reference it writes and the spec comparison that requeues a
// pending pod are the same on its slim copy.
func TestSlimPodReadsTheSame(t *testing.T) {
	whole := realisticPod(t, "app-x7k2p", "1f0c2d3e-4a5b-4c6d-8e7f-9a0b1c2d3e4f")
	slim := slimPod(whole)

	pf, err := NewPodInfo(whole, nil)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := NewPodInfo(slim, nil)
	if err != nil {
		t.Fatal(err)
	}
	pf.Pod, ps.Pod = nil, nil
	if !reflect.DeepEqual(pf, ps) {
		t.Errorf("PodInfo of the slim pod differs:\nwhole: %+v\n slim: %+v", pf, ps)
	}
	if terminal(whole) != terminal(slim) {
		t.Error("terminal differs")
	}
	rf, err := reference.GetReference(scheme.Scheme, whole)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := reference.GetReference(scheme.Scheme, slim)
	if err != nil {
		t.Fatal(err)
	}
	if *rf != *rs {
		t.Errorf("event reference = %+v, want %+v", rs, rf)
	}

	// Every change an update may make to a pod (spec fields the API lets
	// change, ephemeral containers, metadata, status) is seen as a change
	// that matters to scheduling on the slim copies exactly when it is on
	// the whole pods.
	for _, u := range []struct {
		name   string
		change func(p *corev1.Pod)
	}{
		{"image", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "app:2" }},
		{"activeDeadlineSeconds", func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = new(int64(60)) }},
		{"toleration added", func(p *corev1.Pod) {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: "k", Operator: corev1.TolerationOpExists})
		}},
		{"terminationGracePeriodSeconds", func(p *corev1.Pod) { p.Spec.TerminationGracePeriodSeconds = new(int64(1)) }},
		{"scheduling gate removed", func(p *corev1.Pod) { p.Spec.SchedulingGates = nil }},
		{"ephemeral container added", func(p *corev1.Pod) {
			p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{
				EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "busybox", Stdin: true, TTY: true}})
		}},
		{"labels", func(p *corev1.Pod) { p.Labels = map[string]string{"app": "other"} }},
		{"annotations", func(p *corev1.Pod) { p.Annotations = map[string]string{"a": "b"} }},
		{"owner references", func(p *corev1.Pod) { p.OwnerReferences = nil }},
		{"nominated node", func(p *corev1.Pod) { p.Status.NominatedNodeName = "node-1" }},
		{"conditions", func(p *corev1.Pod) { p.Status.Conditions = p.Status.Conditions[:1] }},
		{"container statuses", func(p *corev1.Pod) { p.Status.ContainerStatuses = nil }},
		{"pod IP", func(p *corev1.Pod) { p.Status.PodIP, p.Status.PodIPs = "", nil }},
	} {
		old := whole.DeepCopy()
		old.Spec.NodeName = ""
		old.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/gate"}}
		old.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug-0", Image: "busybox"}}}
		cur := old.DeepCopy()
		u.change(cur)
		if f, s := schedulingChanged(old, cur), schedulingChanged(slimPod(old), slimPod(cur)); f != s {
			t.Errorf("%s: schedulingChanged = %v on slim pods, %v on whole pods", u.name, s, f)
		}
	}
}

// TestSlimPodHeap measures the heap that 10,000 realistic pods hold, kept
// whole and kept slim, and bounds the slim one.
func TestSlimPodHeap(t *testing.T) {
	const n = 10000
	whole := heapPerPod(t, n, false)
	slim := heapPerPod(t, n, true)
	t.Logf("heap per pod over %d realistic pods: whole %.0f bytes, slim %.0f bytes (%.0f%%)", n, whole, slim, 100*slim/whole)
	// Measured: 52% (about 6,970 and 3,650 bytes; under the race
	// detector 7,480 and 3,860). The Pod struct alone is 1,240 of the
	// slim pod's bytes.
	if slim > 0.6*whole {
		t.Errorf("a slim pod holds %.0f bytes, more than 60%% of a whole one's %.0f", slim, whole)
	}
}

// heapPerPod decodes n copies of the realistic pod, each with a name and
// uid of its own, from protobuf as the scheduler's informer does, keeps
// them (slimmed if slim) and returns the live heap they add per pod.
func heapPerPod(t *testing.T, n int, slim bool) float64 {
	tmpl := realisticPod(t, "", "")
	pods := make([]*corev1.Pod, n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range pods {
		tmpl.Name, tmpl.UID = fmt.Sprintf("app-%06d", i), types.UID(fmt.Sprintf("1f0c2d3e-4a5b-4c6d-8e7f-%012d", i))
		b, err := tmpl.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		p := &corev1.Pod{}
		if err := p.Unmarshal(b); err != nil {
			t.Fatal(err)
		}
		if slim {
			p = slimPod(p)
		}
		pods[i] = p
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(pods)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

// dressPod adds to pod what a running pod carries and the scheduler never
// reads: annotations, an owner, a service account volume and its mount,
// container commands, environment and probes, conditions other than
// PodScheduled, addresses and container statuses. Scenarios run on
// slimPod(dressPod(pod)) must decide as on pod.
func dressPod(pod *corev1.Pod) *corev1.Pod {
	p := pod.DeepCopy()
	p.GenerateName = "app-"
	p.Generation = 1
	p.Annotations = map[string]string{"kubectl.kubernetes.io/default-container": "app"}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "app-6d5f8b7c9d",
		UID: "5c1b3f0e-8a9d-4f7e-9b2a-3d4c5e6f7a8b", Controller: new(true)}}
	p.Finalizers = []string{"example.com/keep"}
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{
		Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}})
	p.Spec.ServiceAccountName, p.Spec.DNSPolicy, p.Spec.RestartPolicy = "default", corev1.DNSClusterFirst, corev1.RestartPolicyAlways
	p.Spec.EnableServiceLinks, p.Spec.SecurityContext = new(true), &corev1.PodSecurityContext{}
	dress := func(c *corev1.Container) {
		c.Command, c.Args = []string{"/app"}, []string{"--port=8080"}
		c.Env = []corev1.EnvVar{{Name: "MODE", Value: "edge"}}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
		c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
		c.TerminationMessagePath, c.TerminationMessagePolicy = "/dev/termination-log", corev1.TerminationMessageReadFile
		c.ImagePullPolicy = corev1.PullIfNotPresent
	}
	for i := range p.Spec.InitContainers {
		dress(&p.Spec.InitContainers[i])
	}
	for i := range p.Spec.Containers {
		dress(&p.Spec.Containers[i])
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: p.Spec.Containers[i].Name, Image: p.Spec.Containers[i].Image, Ready: true, ContainerID: "containerd://0123"})
	}
	p.Status.Conditions = append(p.Status.Conditions,
		corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue},
		corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue})
	p.Status.HostIP, p.Status.PodIP, p.Status.QOSClass = "10.0.0.1", "10.244.0.7", corev1.PodQOSBurstable
	return p
}
