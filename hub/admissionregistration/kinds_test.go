package admissionregistration

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store/sqlite"
)

func newStorage(t *testing.T) (*storage.Storage, map[string]*registry.Kind) {
	t.Helper()
	db, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	kinds := map[string]*registry.Kind{}
	for _, k := range Kinds() {
		kinds[k.Resource] = k
	}
	st, err := storage.New(storage.Config{Store: db, Kinds: append(registry.All(), Kinds()...),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return st, kinds
}

func testCA(t *testing.T) []byte {
	t.Helper()
	ca, _, err := certutil.GenerateSelfSignedCertKey("webhook.example.com", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func validHook() admissionregistrationv1.ValidatingWebhook {
	return admissionregistrationv1.ValidatingWebhook{
		Name:                    "check.example.com",
		ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:8443/check")},
		Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"CREATE"}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
	}
}

func TestWebhookConfigurationDefaults(t *testing.T) {
	st, kinds := newStorage(t)
	h := validHook()
	h.ClientConfig = admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "ns", Name: "svc"},
		CABundle: testCA(t)}
	out, err := st.Create(context.Background(), kinds["validatingwebhookconfigurations"], "",
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "ok"},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{h}}, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*admissionregistrationv1.ValidatingWebhookConfiguration).Webhooks[0]
	if *got.FailurePolicy != admissionregistrationv1.Fail || *got.MatchPolicy != admissionregistrationv1.Equivalent ||
		*got.TimeoutSeconds != 10 || got.NamespaceSelector == nil || got.ObjectSelector == nil ||
		*got.Rules[0].Scope != admissionregistrationv1.AllScopes || *got.ClientConfig.Service.Port != 443 {
		t.Fatalf("defaults not set: %+v", got)
	}
	m, err := st.Create(context.Background(), kinds["mutatingwebhookconfigurations"], "",
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "ok"},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: h.Name, ClientConfig: h.ClientConfig, Rules: h.Rules,
				SideEffects: h.SideEffects, AdmissionReviewVersions: h.AdmissionReviewVersions}}}, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if p := m.(*admissionregistrationv1.MutatingWebhookConfiguration).Webhooks[0].ReinvocationPolicy; p == nil || *p != admissionregistrationv1.NeverReinvocationPolicy {
		t.Fatalf("reinvocationPolicy not defaulted: %v", p)
	}
}

// TestInvalidAdmissionConfiguration: each bad object is a 422 whose causes
// name the field, and nothing is stored.
func TestInvalidAdmissionConfiguration(t *testing.T) {
	st, kinds := newStorage(t)
	vwc := func(edit func(h *admissionregistrationv1.ValidatingWebhook)) runtime.Object {
		h := validHook()
		edit(&h)
		return &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{h}}
	}
	policy := func(expr string) runtime.Object {
		return &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: validHook().Rules[0]}}},
				Validations: []admissionregistrationv1.Validation{{Expression: expr}}}}
	}
	for _, tc := range []struct {
		name, resource string
		obj            runtime.Object
		field, message string
	}{
		{"caBundle not PEM", "validatingwebhookconfigurations", vwc(func(h *admissionregistrationv1.ValidatingWebhook) {
			h.ClientConfig.CABundle = []byte("not a certificate")
		}), "webhooks[0].clientConfig.caBundle", "unable to load root certificates"},
		{"url and service", "validatingwebhookconfigurations", vwc(func(h *admissionregistrationv1.ValidatingWebhook) {
			h.ClientConfig.Service = &admissionregistrationv1.ServiceReference{Namespace: "ns", Name: "svc"}
		}), "webhooks[0].clientConfig", "exactly one of url or service is required"},
		{"http url", "validatingwebhookconfigurations", vwc(func(h *admissionregistrationv1.ValidatingWebhook) {
			h.ClientConfig.URL = ptr.To("http://example.com/x")
		}), "webhooks[0].clientConfig.url", "'https' is the only allowed URL scheme"},
		{"timeout", "validatingwebhookconfigurations", vwc(func(h *admissionregistrationv1.ValidatingWebhook) {
			h.TimeoutSeconds = ptr.To[int32](31)
		}), "webhooks[0].timeoutSeconds", "the timeout value must be between 1 and 30 seconds"},
		{"sideEffects", "validatingwebhookconfigurations", vwc(func(h *admissionregistrationv1.ValidatingWebhook) {
			h.SideEffects = nil
		}), "webhooks[0].sideEffects", "must specify one of None, NoneOnDryRun"},
		{"review versions", "validatingwebhookconfigurations", vwc(func(h *admissionregistrationv1.ValidatingWebhook) {
			h.AdmissionReviewVersions = []string{"v2"}
		}), "webhooks[0].admissionReviewVersions", "must include at least one of v1, v1beta1"},
		{"name", "validatingwebhookconfigurations", vwc(func(h *admissionregistrationv1.ValidatingWebhook) {
			h.Name = "check"
		}), "webhooks[0].name", "should be a domain with at least three segments separated by dots"},
		{"matchCondition", "validatingwebhookconfigurations", vwc(func(h *admissionregistrationv1.ValidatingWebhook) {
			h.MatchConditions = []admissionregistrationv1.MatchCondition{{Name: "c", Expression: "object.metadata.name =="}}
		}), "webhooks[0].matchConditions[0].expression", "compilation failed"},
		{"operations", "validatingwebhookconfigurations", vwc(func(h *admissionregistrationv1.ValidatingWebhook) {
			h.Rules[0].Operations = []admissionregistrationv1.OperationType{"*", "CREATE"}
		}), "webhooks[0].rules[0].operations", "if '*' is present, must not specify other operations"},
		{"policy CEL", "validatingadmissionpolicies", policy("object.spec.replicas >"), "spec.validations[0].expression", "compilation failed"},
		{"policy type", "validatingadmissionpolicies", policy("'a string'"), "spec.validations[0].expression", "must evaluate to bool"},
		{"binding", "validatingadmissionpolicybindings", &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "p"}},
			"spec.validationActions", "Required value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := kinds[tc.resource]
			_, err := st.Create(context.Background(), k, "", tc.obj, storage.Options{})
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create: %v, want 422", err)
			}
			found := false
			for _, c := range err.(apierrors.APIStatus).Status().Details.Causes {
				if c.Field == tc.field && strings.Contains(c.Message, tc.message) {
					found = true
				}
			}
			if !found {
				t.Fatalf("causes %+v lack %s: %s", err.(apierrors.APIStatus).Status().Details.Causes, tc.field, tc.message)
			}
			list, err := st.List(context.Background(), k, "", storage.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if n := len(mustItems(t, list)); n != 0 {
				t.Fatalf("%d objects stored", n)
			}
		})
	}
}

func mustItems(t *testing.T, list runtime.Object) []runtime.Object {
	t.Helper()
	items, err := apimeta.ExtractList(list)
	if err != nil {
		t.Fatal(err)
	}
	return items
}
