package registry

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// ingressClassLister serves stored ingress classes.
type ingressClassLister []runtime.Object

func (l ingressClassLister) List(_ context.Context, resource, _ string) ([]runtime.Object, error) {
	if resource != ingressClassesResource {
		return nil, nil
	}
	return l, nil
}

func svcBackend(name string, port int32) networkingv1.IngressBackend {
	return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: name, Port: networkingv1.ServiceBackendPort{Number: port}}}
}

func ingPath(path string, typ networkingv1.PathType, b networkingv1.IngressBackend) networkingv1.HTTPIngressPath {
	p := networkingv1.HTTPIngressPath{Path: path, Backend: b}
	if typ != "" {
		p.PathType = &typ
	}
	return p
}

func ingRule(host string, paths ...networkingv1.HTTPIngressPath) networkingv1.IngressRule {
	return networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: paths}}}
}

func TestValidateIngress(t *testing.T) {
	prefix, exact, impl := networkingv1.PathTypePrefix, networkingv1.PathTypeExact, networkingv1.PathTypeImplementationSpecific
	ok := svcBackend("web", 80)
	tests := []struct {
		name string
		spec networkingv1.IngressSpec
		ann  map[string]string
		want []string // "field: message part"
	}{
		{"valid", networkingv1.IngressSpec{IngressClassName: ptr.To("tether"), DefaultBackend: &ok,
			Rules: []networkingv1.IngressRule{ingRule("*.example.com", ingPath("/", prefix, ok), ingPath("/x", exact, ok), ingPath("", impl, ok))},
			TLS:   []networkingv1.IngressTLS{{Hosts: []string{"*.example.com", "a.example.com"}, SecretName: "tls"}}}, nil, nil},
		{"empty", networkingv1.IngressSpec{}, nil, []string{"spec: Invalid value: null: either `defaultBackend` or `rules` must be specified"}},
		{"no path type", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{ingRule("a.b", ingPath("/", "", ok))}}, nil,
			[]string{"spec.rules[0].http.paths[0].pathType: Required value: pathType must be specified"}},
		{"bad path type", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{ingRule("", ingPath("/", "Regex", ok))}}, nil,
			[]string{`spec.rules[0].http.paths[0].pathType: Unsupported value: "Regex": supported values: "Exact", "ImplementationSpecific", "Prefix"`}},
		{"relative paths", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{ingRule("", ingPath("foo", prefix, ok), ingPath("bar", impl, ok), ingPath("/a//b", exact, ok), ingPath("/a/..", exact, ok))}}, nil,
			[]string{`spec.rules[0].http.paths[0].path: Invalid value: "foo": must be an absolute path`,
				`spec.rules[0].http.paths[1].path: Invalid value: "bar": must be an absolute path`,
				`spec.rules[0].http.paths[2].path: Invalid value: "/a//b": must not contain '//'`,
				`spec.rules[0].http.paths[3].path: Invalid value: "/a/..": cannot end with '/..'`}},
		{"hosts", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{ingRule("10.0.0.1", ingPath("/", prefix, ok)), ingRule("a.*.com", ingPath("/", prefix, ok)), ingRule("Upper.com", ingPath("/", prefix, ok))}}, nil,
			[]string{`spec.rules[0].host: Invalid value: "10.0.0.1": must be a DNS name, not an IP address`,
				`spec.rules[1].host: Invalid value: "a.*.com": a wildcard DNS-1123 subdomain must start with '*.'`,
				`spec.rules[2].host: Invalid value: "Upper.com": a lowercase RFC 1123 subdomain`}},
		{"no paths", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{ingRule("a.com")}}, nil, []string{"spec.rules[0].http.paths: Required value"}},
		{"backends", networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{ingRule("",
			ingPath("/a", prefix, networkingv1.IngressBackend{}),
			ingPath("/b", prefix, networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "web"}}),
			ingPath("/c", prefix, networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Name: "http", Number: 80}}}),
			ingPath("/d", prefix, networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "Web", Port: networkingv1.ServiceBackendPort{Number: 70000}}}),
			ingPath("/e", prefix, networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Number: 80}}, Resource: &corev1TypedRef}),
			ingPath("/f", prefix, networkingv1.IngressBackend{Resource: &corev1TypedRefNoKind}),
		)}}, nil, []string{
			`spec.rules[0].http.paths[0].backend: Invalid value: "": resource or service backend is required`,
			`spec.rules[0].http.paths[1].backend: Required value: port name or number is required`,
			`spec.rules[0].http.paths[2].backend: Invalid value: "": cannot set both port name & port number`,
			`spec.rules[0].http.paths[3].backend.service.name: Invalid value: "Web": a DNS-1035 label`,
			`spec.rules[0].http.paths[3].backend.service.port.number: Invalid value: 70000: must be between 1 and 65535, inclusive`,
			`spec.rules[0].http.paths[4].backend: Invalid value: "": cannot set both resource and service backends`,
			`spec.rules[0].http.paths[5].backend.resource.kind: Required value: kind is required`,
		}},
		{"tls and class", networkingv1.IngressSpec{DefaultBackend: &ok, IngressClassName: ptr.To("Bad_Class"),
			TLS: []networkingv1.IngressTLS{{Hosts: []string{"*.*.x.com"}, SecretName: "Bad"}}}, nil, []string{
			`spec.tls[0].hosts[0]: Invalid value: "*.*.x.com": a wildcard DNS-1123 subdomain`,
			`spec.tls[0].secretName: Invalid value: "Bad": a lowercase RFC 1123 subdomain`,
			`spec.ingressClassName: Invalid value: "Bad_Class": a lowercase RFC 1123 subdomain`,
		}},
		{"annotation mismatch", networkingv1.IngressSpec{DefaultBackend: &ok, IngressClassName: ptr.To("a")}, map[string]string{"kubernetes.io/ingress.class": "b"},
			[]string{`annotations.kubernetes.io/ingress.class: Invalid value: "b": must match ` + "`ingressClassName`" + ` when both are specified`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "i", Namespace: "default", Annotations: tt.ann}, Spec: tt.spec}
			errs := ingressKind.Validate(ing)
			if len(errs) != len(tt.want) {
				t.Fatalf("got %d errors, want %d: %v", len(errs), len(tt.want), errs)
			}
			for i, e := range errs {
				if !strings.HasPrefix(e.Error(), tt.want[i]) {
					t.Errorf("error %d: %q, want prefix %q", i, e.Error(), tt.want[i])
				}
			}
		})
	}
}

var (
	corev1TypedRef       = corev1TypedLocalRef("Bucket", "b")
	corev1TypedRefNoKind = corev1TypedLocalRef("", "b")
)

func TestValidateIngressClass(t *testing.T) {
	ns := networkingv1.IngressClassParametersReferenceScopeNamespace
	tests := []struct {
		name string
		spec networkingv1.IngressClassSpec
		want []string
	}{
		{"valid", networkingv1.IngressClassSpec{Controller: "tether.io/ingress", Parameters: &networkingv1.IngressClassParametersReference{Kind: "Config", Name: "c", Scope: &ns, Namespace: ptr.To("x")}}, nil},
		{"no domain", networkingv1.IngressClassSpec{Controller: "ingress"}, []string{"spec.controller: Invalid value: \"ingress\": must be a domain-prefixed path (such as \"acme.io/foo\")"}},
		{"namespace scope without namespace", networkingv1.IngressClassSpec{Controller: "a.io/b", Parameters: &networkingv1.IngressClassParametersReference{Kind: "K", Name: "n", Scope: &ns}},
			[]string{"spec.parameters.namespace: Required value: `parameters.scope` is set to 'Namespace'"}},
		{"cluster scope with namespace", networkingv1.IngressClassSpec{Controller: "a.io/b", Parameters: &networkingv1.IngressClassParametersReference{Kind: "K", Name: "n", Namespace: ptr.To("x")}},
			[]string{"spec.parameters.namespace: Forbidden: `parameters.scope` is set to 'Cluster'"}},
	}
	for _, tt := range tests {
		c := &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: tt.spec}
		ingressClassKind.Default(c)
		errs := ingressClassKind.Validate(c)
		if len(errs) != len(tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, errs, tt.want)
			continue
		}
		for i, e := range errs {
			if !strings.HasPrefix(e.Error(), tt.want[i]) {
				t.Errorf("%s: %q, want prefix %q", tt.name, e.Error(), tt.want[i])
			}
		}
	}
	old := &networkingv1.IngressClass{Spec: networkingv1.IngressClassSpec{Controller: "a.io/b"}}
	if errs := ingressClassKind.ValidateUpdate(&networkingv1.IngressClass{Spec: networkingv1.IngressClassSpec{Controller: "a.io/c"}}, old); len(errs) != 1 || errs[0].Field != "spec.controller" {
		t.Errorf("controller change: %v", errs)
	}
}

// The newest default class wins; ties go to the first name; an Ingress
// that names a class, or carries the legacy annotation, keeps it.
func TestDefaultIngressClass(t *testing.T) {
	now := time.Now()
	class := func(name string, def bool, created time.Time) *networkingv1.IngressClass {
		c := &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
		if def {
			c.Annotations = map[string]string{networkingv1.AnnotationIsDefaultIngressClass: "true"}
		}
		return c
	}
	admit := func(l ingressClassLister, ing *networkingv1.Ingress) string {
		if err := ingressKind.Mutate(context.Background(), l, ing, nil); err != nil {
			t.Fatal(err)
		}
		return ptr.Deref(ing.Spec.IngressClassName, "<nil>")
	}
	l := ingressClassLister{class("old", true, now.Add(-time.Hour)), class("new", true, now), class("newer-not-default", false, now.Add(time.Hour))}
	if got := admit(l, &networkingv1.Ingress{}); got != "new" {
		t.Errorf("class %q, want new", got)
	}
	l = ingressClassLister{class("b", true, now), class("a", true, now)}
	if got := admit(l, &networkingv1.Ingress{}); got != "a" {
		t.Errorf("tie: class %q, want a", got)
	}
	if got := admit(l, &networkingv1.Ingress{Spec: networkingv1.IngressSpec{IngressClassName: ptr.To("x")}}); got != "x" {
		t.Errorf("named class replaced: %q", got)
	}
	if got := admit(l, &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"kubernetes.io/ingress.class": "y"}}}); got != "<nil>" {
		t.Errorf("legacy annotation: class %q", got)
	}
	if got := admit(ingressClassLister{class("a", false, now)}, &networkingv1.Ingress{}); got != "<nil>" {
		t.Errorf("no default: class %q", got)
	}
	// Updates are left alone.
	ing := &networkingv1.Ingress{}
	if err := ingressKind.Mutate(context.Background(), l, ing, &networkingv1.Ingress{}); err != nil || ing.Spec.IngressClassName != nil {
		t.Errorf("update defaulted: %v %v", err, ing.Spec.IngressClassName)
	}
}

func TestIngressCells(t *testing.T) {
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "web"}}
	ing.Spec.Rules = []networkingv1.IngressRule{{Host: "a.com"}, {Host: ""}, {Host: "b.com"}, {Host: "c.com"}, {Host: "d.com"}}
	ing.Spec.TLS = []networkingv1.IngressTLS{{}}
	ing.Status.LoadBalancer.Ingress = []networkingv1.IngressLoadBalancerIngress{{IP: "10.0.0.2"}, {IP: "10.0.0.1"}, {Hostname: "lb.example.com"}, {IP: "10.0.0.1"}}
	cells := ingressKind.Cells(ing, time.Now())
	if cells[1] != "<none>" || cells[2] != "a.com,b.com,c.com + 2 more..." || cells[3] != "10.0.0.1,10.0.0.2,lb.example.com" || cells[4] != "80, 443" {
		t.Errorf("cells %v", cells)
	}
	ing = &networkingv1.Ingress{Spec: networkingv1.IngressSpec{IngressClassName: ptr.To("tether")}}
	if cells := ingressKind.Cells(ing, time.Now()); cells[1] != "tether" || cells[2] != "*" || cells[3] != "" || cells[4] != "80" {
		t.Errorf("cells %v", cells)
	}
}

func corev1TypedLocalRef(kind, name string) corev1.TypedLocalObjectReference {
	return corev1.TypedLocalObjectReference{APIGroup: ptr.To("storage.example.com"), Kind: kind, Name: name}
}
