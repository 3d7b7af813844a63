package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// typedJSON encodes a list as the HTTP layer does for application/json.
func typedJSON(t *testing.T, obj runtime.Object) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(obj); err != nil {
		t.Fatalf("encode %T: %v", obj, err)
	}
	return buf.Bytes()
}

func checkListJSON(t *testing.T, f *fixture, group, version, resource, ns string, opts ListOptions) int {
	t.Helper()
	ctx := context.Background()
	k := kind(t, group, version, resource)
	want, err := f.s.List(ctx, k, ns, opts)
	if err != nil {
		t.Fatalf("list %s: %v", resource, err)
	}
	got, ok, err := f.s.ListJSON(ctx, k, ns, opts)
	if err != nil {
		t.Fatalf("list %s as JSON: %v", resource, err)
	}
	if !ok {
		t.Fatalf("list %s as JSON: not answered", resource)
	}
	wb := typedJSON(t, want)
	if got.Len() != len(wb) {
		t.Errorf("list %s: Len %d, body %d bytes", resource, got.Len(), len(wb))
	}
	if got := got.Bytes(); !bytes.Equal(got, wb) {
		t.Errorf("list %s: JSON differs from the typed list\n got: %s\nwant: %s", resource, got, wb)
	}
	return bytes.Count(wb, []byte(`"resourceVersion"`)) - 1
}

// listSampleKinds are the lists the list tests compare after
// createListSamples.
var listSampleKinds = []struct{ group, version, resource, ns string }{
	{"", "v1", "configmaps", "default"},
	{"", "v1", "configmaps", ""},
	{"", "v1", "secrets", "default"},
	{"", "v1", "pods", "default"},
	{"", "v1", "pods", "empty"},
	{"apps", "v1", "deployments", "default"},
	{"", "v1", "services", ""},
	{"", "v1", "endpoints", ""},
	{"", "v1", "namespaces", ""},
	{"", "v1", "nodes", ""},
	{"coordination.k8s.io", "v1", "leases", "default"},
	{"rbac.authorization.k8s.io", "v1", "clusterroles", ""},
	{"rbac.authorization.k8s.io", "v1", "clusterrolebindings", ""},
	{"scheduling.k8s.io", "v1", "priorityclasses", ""},
}

// createListSamples creates objects of several kinds, with the
// characters and field types that encodings treat specially, for the
// tests that compare a list answered from stored bytes with the typed
// list.
func createListSamples(t *testing.T, f *fixture) {
	t.Helper()
	ctx := context.Background()
	create := func(group, version, resource, ns string, obj runtime.Object) {
		t.Helper()
		if _, err := f.s.Create(ctx, kind(t, group, version, resource), ns, obj, Options{FieldManager: "test"}); err != nil {
			t.Fatalf("create %s: %v", resource, err)
		}
	}
	create("", "v1", "configmaps", "default", &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "html", Labels: map[string]string{"app": "x"},
			Annotations: map[string]string{"a": "<b>c&d", "z": "\u2028 é \"q\" \\"}},
		Data:       map[string]string{"k": "<script>&amp;</script>", "u": "ünïcode ✓ \t\n"},
		BinaryData: map[string][]byte{"bin": {0, 1, 2, 255}},
	})
	create("", "v1", "configmaps", "default", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "gen-"}})
	create("", "v1", "configmaps", "kube-system", cm("plain", nil))
	create("", "v1", "secrets", "default", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Data: map[string][]byte{"password": []byte("\x00\xffsecret")}, Type: corev1.SecretTypeOpaque})
	create("", "v1", "pods", "default", &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"app": "x"}, Finalizers: []string{"example.com/f"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "1234", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "registry.example/app:1.0", Command: []string{"/app", "--serve"},
			Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("0.1"), corev1.ResourceMemory: resource.MustParse("64Mi")}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromString("http")}}},
		}}},
	})
	create("apps", "v1", "deployments", "default", &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "d"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "d"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "d"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}},
	})
	create("", "v1", "services", "default", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}, Selector: map[string]string{"app": "d"}}})
	create("", "v1", "nodes", "", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}}})
	now := metav1.NewMicroTime(time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC))
	create("coordination.k8s.io", "v1", "leases", "default", &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("me"), RenewTime: &now, LeaseDurationSeconds: ptr.To[int32](15)}})
}

func TestListJSONMatchesTypedList(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	createListSamples(t, f)

	for _, c := range listSampleKinds {
		checkListJSON(t, f, c.group, c.version, c.resource, c.ns, ListOptions{})
	}
	// Pages carry continue and remainingItemCount; selectors filter.
	if n := checkListJSON(t, f, "", "v1", "configmaps", "", ListOptions{Limit: 1}); n != 1 {
		t.Errorf("first page holds %d items, want 1", n)
	}
	if n := checkListJSON(t, f, "", "v1", "configmaps", "", ListOptions{Label: labels.SelectorFromSet(labels.Set{"app": "x"})}); n != 1 {
		t.Errorf("selected list holds %d items, want 1", n)
	}

	// A kind stored as another kind is left to List.
	if _, ok, err := f.s.ListJSON(ctx, kind(t, "events.k8s.io", "v1", "events"), "default", ListOptions{}); ok || err != nil {
		t.Errorf("events.k8s.io events as JSON: ok %v, err %v; want not answered", ok, err)
	}
	// Errors are List's.
	_, _, err := f.s.ListJSON(ctx, kind(t, "", "v1", "pods"), "default", ListOptions{ResourceVersion: "x"})
	wantReason(t, err, metav1.StatusReasonBadRequest)
}

func TestAppendListItem(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"n","uid":"u","creationTimestamp":null},"data":{"k":"}"}}`,
			`{"metadata":{"name":"a","namespace":"n","uid":"u","resourceVersion":"7","creationTimestamp":null},"data":{"k":"}"}}`},
		{`{"metadata":{"name":"a\"b"}}`, `{"metadata":{"name":"a\"b","resourceVersion":"7"}}`},
		{`{"metadata":{}}`, `{"metadata":{"resourceVersion":"7"}}`},
		{`{"metadata":{"labels":{"a":"b"}},"spec":{}}`, `{"metadata":{"resourceVersion":"7","labels":{"a":"b"}},"spec":{}}`},
		{`{"metadata":{"name":"a","resourceVersion":"3"}}`, ""},
		{`{"spec":{},"metadata":{}}`, ""},
		{`{"kind":"X"}`, ""},
		{`[]`, ""},
		{`{"metadata":{"name":"a`, ""},
	} {
		got, rest, ok := appendListItem(nil, []byte(c.in), 7)
		if ok {
			got = append(got, c.in[rest:]...)
		}
		if c.want == "" {
			if ok {
				t.Errorf("%s: got %s, want not answered", c.in, got)
			}
			continue
		}
		if !ok || string(got) != c.want {
			t.Errorf("%s: got %s (ok %v), want %s", c.in, got, ok, c.want)
		}
	}
}

// Decoded states are kept for a while only: an idle hub holds none.
func TestDecodeCacheExpires(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := kind(t, "", "v1", "configmaps")
	if _, err := f.s.Create(ctx, k, "default", cm("a", nil), Options{}); err != nil {
		t.Fatal(err)
	}
	o, err := f.s.st.Get(ctx, f.s.key(k, "default", "a"))
	if err != nil {
		t.Fatal(err)
	}
	first, err := f.s.decodeShared(k, o)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := f.s.decodeShared(k, o); again != first {
		t.Fatal("a second decode of the same state was not shared")
	}
	c := &f.s.shared
	c.mu.Lock()
	for _, d := range c.byKey {
		d.at = d.at.Add(-2 * sharedTTL)
	}
	c.mu.Unlock()
	c.expire()
	c.mu.Lock()
	n, timer := len(c.byKey), c.sweep
	c.mu.Unlock()
	if n != 0 || timer != nil {
		t.Fatalf("after expiry: %d entries, sweep timer %v", n, timer)
	}
	if again, _ := f.s.decodeShared(k, o); again == first {
		t.Fatal("an expired state was still shared")
	}
}
