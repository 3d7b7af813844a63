package webhooks_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/admissionregistration"
	"github.com/tether-edge/tether/hub/apiextensions/customresource"
	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/servicedial"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/hub/webhooks"
	"github.com/tether-edge/tether/store/sqlite"
)

type fixture struct {
	st    *storage.Storage
	kinds map[string]*registry.Kind
	ctx   context.Context
}

func (f *fixture) create(t *testing.T, resource, ns string, obj runtime.Object) (runtime.Object, error) {
	t.Helper()
	return f.st.Create(f.ctx, f.kinds[resource], ns, obj, storage.Options{})
}

func (f *fixture) mustCreate(t *testing.T, resource, ns string, obj runtime.Object) runtime.Object {
	t.Helper()
	out, err := f.create(t, resource, ns, obj)
	if err != nil {
		t.Fatalf("create %s: %v", resource, err)
	}
	return out
}

// newFixture runs storage with the admissionregistration kinds, an API
// server over it for the admission's in-process clients, and the
// admission itself, whose Services are dialed through dialPod.
func newFixture(t *testing.T, dialPod func(ctx context.Context, node, addr string) (net.Conn, error), extra ...*registry.Kind) *fixture {
	t.Helper()
	db, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	kinds := append(append(registry.All(), admissionregistration.Kinds()...), extra...)
	st, err := storage.New(storage.Config{Store: db, Kinds: kinds, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	api, err := apiserver.New(apiserver.Config{Storage: st, Kinds: kinds, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	sch, err := registry.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	adm, err := webhooks.New(webhooks.Config{
		RestConfig: &rest.Config{Host: "https://localhost", Transport: api.LocalTransport(&auth.User{Name: "admin", Groups: []string{"system:masters", "system:authenticated"}})},
		Services:   &servicedial.Dialer{Storage: st, DialPod: dialPod},
		Scheme:     sch,
		Kinds:      func() []*registry.Kind { return kinds },
		Logger:     log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	adm.Start(ctx)
	if !adm.WaitSynced(ctx) {
		t.Fatal("admission informers did not sync")
	}
	st.SetExternalAdmission(adm)
	f := &fixture{st: st, kinds: map[string]*registry.Kind{}, ctx: auth.WithUser(ctx, &auth.User{Name: "alice", Groups: []string{"system:authenticated"}})}
	for _, k := range kinds {
		f.kinds[k.Resource] = k
	}
	return f
}

// reviewer is a TLS webhook on loopback that records what it was asked.
type reviewer struct {
	url   string
	ca    []byte
	addr  string
	calls atomic.Int64
	users chan string
}

func newReviewer(t *testing.T, decide func(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse)) *reviewer {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("hook.system.svc", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	r := &reviewer{ca: certPEM, users: make(chan string, 100)}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.calls.Add(1)
		var ar admissionv1.AdmissionReview
		if err := json.NewDecoder(req.Body).Decode(&ar); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		select {
		case r.users <- fmt.Sprintf("%s %s dryRun=%v", ar.Request.UserInfo.Username, ar.Request.Operation, ptr.Deref(ar.Request.DryRun, false)):
		default:
		}
		resp := &admissionv1.AdmissionResponse{UID: ar.Request.UID, Allowed: true}
		decide(ar.Request, resp)
		ar.Request, ar.Response = nil, resp
		_ = json.NewEncoder(w).Encode(&ar)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	r.url, r.addr = srv.URL, srv.Listener.Addr().String()
	return r
}

func rule(resource string, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
	return []admissionregistrationv1.RuleWithOperations{{Operations: ops,
		Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{resource}}}}
}

// TestServiceWebhookThroughNode: a webhook configured by Service is reached
// through servicedial at its endpoint on its node; it sees the user and the
// operation, its objectSelector keeps it from unselected objects, it is
// called on delete, and a denial is upstream's 403.
func TestServiceWebhookThroughNode(t *testing.T) {
	hook := newReviewer(t, func(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
		if req.Operation == admissionv1.Delete || strings.Contains(string(req.Object.Raw), `"refuse":"yes"`) {
			resp.Allowed = false
			resp.Result = &metav1.Status{Code: 403, Message: "refused by the hook"}
		}
	})
	var dialed atomic.Value
	f := newFixture(t, func(ctx context.Context, node, addr string) (net.Conn, error) {
		dialed.Store(node + "/" + addr)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", hook.addr)
	})
	// The webhook's pod on node n1 behind Service system/hook.
	f.mustCreate(t, "namespaces", "", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "system"}})
	f.mustCreate(t, "serviceaccounts", "system", &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}})
	pod := f.mustCreate(t, "pods", "system", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hook-0"},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "img"}}}}).(*corev1.Pod)
	pod.Status.PodIP, pod.Status.PodIPs = "10.9.0.7", []corev1.PodIP{{IP: "10.9.0.7"}}
	if _, err := f.st.Update(f.ctx, f.kinds["pods"], "system", "hook-0", pod, storage.Options{Subresource: "status"}); err != nil {
		t.Fatal(err)
	}
	f.mustCreate(t, "services", "system", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "hook"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(9443)}}}})
	f.mustCreate(t, "endpointslices", "system", &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "hook-1", Labels: map[string]string{discoveryv1.LabelServiceName: "hook"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](9443)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.9.0.7"},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "system", Name: "hook-0"}}},
	})
	f.mustCreate(t, "validatingwebhookconfigurations", "", &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "hook"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "hook.tether.test",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: hook.ca,
				Service: &admissionregistrationv1.ServiceReference{Namespace: "system", Name: "hook", Path: ptr.To("/check")}},
			Rules:                   rule("configmaps", "CREATE", "DELETE"),
			ObjectSelector:          &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "skip", Operator: metav1.LabelSelectorOpDoesNotExist}}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}},
	})

	cm := func(name string, labels map[string]string, data map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: data}
	}
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		// Until the configuration is seen, creates pass.
		_, err = f.create(t, "configmaps", "system", cm("refused-"+string(rune('a'+i)), nil, map[string]string{"refuse": "yes"}))
		if err != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `admission webhook "hook.tether.test" denied the request: refused by the hook`) {
		t.Fatalf("create refused configmap: %v", err)
	}
	if got, _ := dialed.Load().(string); got != "n1/10.9.0.7:9443" {
		t.Fatalf("webhook dialed at %q, want its endpoint through n1", got)
	}
	if u := <-hook.users; u != "alice CREATE dryRun=false" {
		t.Errorf("webhook saw %q, want alice CREATE dryRun=false", u)
	}
	// The webhook is reached at its Service's port 443 by its name, with
	// the caBundle verifying the certificate issued for hook.system.svc.
	// A dry run calls the webhook (sideEffects None) and says so; nothing
	// is stored.
	for len(hook.users) > 0 {
		<-hook.users
	}
	if _, err := f.st.Create(f.ctx, f.kinds["configmaps"], "system", cm("dry", nil, nil), storage.Options{DryRun: true}); err != nil {
		t.Fatalf("dry-run create: %v", err)
	}
	if u := <-hook.users; u != "alice CREATE dryRun=true" {
		t.Errorf("webhook saw %q on a dry run", u)
	}
	if _, err := f.st.Get(f.ctx, f.kinds["configmaps"], "system", "dry"); !apierrors.IsNotFound(err) {
		t.Errorf("dry-run create stored the object: %v", err)
	}
	// Not selected: the webhook is not called.
	before := hook.calls.Load()
	f.mustCreate(t, "configmaps", "system", cm("skipped", map[string]string{"skip": "1"}, map[string]string{"refuse": "yes"}))
	if hook.calls.Load() != before {
		t.Error("webhook called for an object its objectSelector leaves out")
	}
	// Deletes are validated with the old object.
	f.mustCreate(t, "configmaps", "system", cm("kept", nil, nil))
	if _, _, err := f.st.Delete(f.ctx, f.kinds["configmaps"], "system", "kept", nil, false); !apierrors.IsForbidden(err) {
		t.Fatalf("delete refused by the webhook: %v", err)
	}
	if _, err := f.st.Get(f.ctx, f.kinds["configmaps"], "system", "kept"); err != nil {
		t.Fatalf("refused delete removed the object: %v", err)
	}
}

// TestUnreachableWebhookFailurePolicy: a webhook whose Service has no
// endpoints, or whose URL does not answer within timeoutSeconds, fails the
// request under failurePolicy Fail and is ignored under Ignore.
func TestUnreachableWebhookFailurePolicy(t *testing.T) {
	hang := newReviewer(t, func(*admissionv1.AdmissionRequest, *admissionv1.AdmissionResponse) { time.Sleep(5 * time.Second) })
	f := newFixture(t, nil)
	f.mustCreate(t, "namespaces", "", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}})
	f.mustCreate(t, "services", "ns", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "gone"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 443}}}})
	hook := func(name string, cc admissionregistrationv1.WebhookClientConfig, policy admissionregistrationv1.FailurePolicyType) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{Name: name, ClientConfig: cc, Rules: rule("configmaps", "CREATE"),
			FailurePolicy: &policy, TimeoutSeconds: ptr.To[int32](1), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"case": name}}}
	}
	svc := admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "ns", Name: "gone"}}
	url := admissionregistrationv1.WebhookClientConfig{URL: ptr.To(hang.url), CABundle: hang.ca}
	f.mustCreate(t, "validatingwebhookconfigurations", "", &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "unreachable"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			hook("svc-fail.tether.test", svc, admissionregistrationv1.Fail),
			hook("svc-ignore.tether.test", svc, admissionregistrationv1.Ignore),
			hook("url-fail.tether.test", url, admissionregistrationv1.Fail),
			hook("url-ignore.tether.test", url, admissionregistrationv1.Ignore),
		},
	})
	for _, tc := range []struct {
		name, want string
		slow       bool
	}{
		{"svc-fail.tether.test", `failed calling webhook "svc-fail.tether.test"`, false},
		{"svc-ignore.tether.test", "", false},
		{"url-fail.tether.test", `failed calling webhook "url-fail.tether.test"`, true},
		{"url-ignore.tether.test", "", true},
	} {
		var err error
		var took time.Duration
		deadline := time.Now().Add(10 * time.Second)
		for i := 0; ; i++ {
			start := time.Now()
			name := strings.Split(tc.name, ".")[0] + "-" + string(rune('a'+i))
			_, err = f.create(t, "configmaps", "ns", &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"case": tc.name}}})
			took = time.Since(start)
			// Until the configuration is seen, creates pass at once.
			if err != nil || !tc.slow && tc.want == "" && i > 20 || tc.slow && took > 900*time.Millisecond || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		switch {
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %s", tc.name, err, tc.want)
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want admitted", tc.name, err)
		case tc.slow && (took < 900*time.Millisecond || took > 4*time.Second):
			t.Errorf("%s: took %v, want the 1s timeout", tc.name, took)
		}
	}
}

// TestMutatingWebhookOnCustomResource: a custom resource (unstructured)
// is patched by a mutating webhook like a built-in object.
func TestMutatingWebhookOnCustomResource(t *testing.T) {
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}}},
					}}}}},
		},
	}
	crKinds, err := customresource.Kinds(crd)
	if err != nil {
		t.Fatal(err)
	}
	hook := newReviewer(t, func(req *admissionv1.AdmissionRequest, resp *admissionv1.AdmissionResponse) {
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = []byte(`[{"op":"add","path":"/spec/size","value":3}]`), &pt
	})
	f := newFixture(t, nil, crKinds...)
	f.mustCreate(t, "namespaces", "", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}})
	f.mustCreate(t, "mutatingwebhookconfigurations", "", &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "size"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         "size.tether.test",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To(hook.url), CABundle: hook.ca},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"CREATE"},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"example.com"}, APIVersions: []string{"v1"}, Resources: []string{"widgets"}}}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}},
	})
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Widget",
			"metadata": map[string]any{"name": fmt.Sprintf("w%d", i), "namespace": "ns"}, "spec": map[string]any{}}}
		out, err := f.st.Create(f.ctx, crKinds[0], "ns", w, storage.Options{})
		if err != nil {
			t.Fatalf("create widget: %v", err)
		}
		size, found, _ := unstructured.NestedInt64(out.(*unstructured.Unstructured).Object, "spec", "size")
		if found && size == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("widget not patched by the webhook: %v", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
