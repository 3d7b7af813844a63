package ingress

import (
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Objects for the tests: Services "svc-N" with cluster IP 10.96.0.N, port
// 80 named "http", each with one ready endpoint unless told otherwise.

func service(name, ip string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
}

func slice(svc string, ready bool) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: svc + "-abc", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}},
	}
}

func be(svc string) networkingv1.IngressBackend {
	return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: svc, Port: networkingv1.ServiceBackendPort{Number: 80}}}
}

func path(p string, typ networkingv1.PathType, svc string) networkingv1.HTTPIngressPath {
	return networkingv1.HTTPIngressPath{Path: p, PathType: &typ, Backend: be(svc)}
}

func rule(host string, paths ...networkingv1.HTTPIngressPath) networkingv1.IngressRule {
	return networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: paths}}}
}

func ingress(name, class string, age time.Duration, spec networkingv1.IngressSpec) *networkingv1.Ingress {
	if class != "" {
		spec.IngressClassName = ptr.To(class)
	}
	return &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
		CreationTimestamp: metav1.NewTime(time.Unix(1e9, 0).Add(-age))}, Spec: spec}
}

func class(name, controller string, def bool) *networkingv1.IngressClass {
	c := &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.IngressClassSpec{Controller: controller}}
	if def {
		c.Annotations = map[string]string{networkingv1.AnnotationIsDefaultIngressClass: "true"}
	}
	return c
}

func testState(ings ...*networkingv1.Ingress) *state {
	s := &state{
		ingresses:  ings,
		classes:    map[string]*networkingv1.IngressClass{"tether": class("tether", ControllerName, false), "nginx": class("nginx", "k8s.io/ingress-nginx", true)},
		services:   map[types.NamespacedName]*corev1.Service{},
		slices:     map[types.NamespacedName][]*discoveryv1.EndpointSlice{},
		controller: ControllerName,
		cert:       func(types.NamespacedName) *tls.Certificate { return nil },
	}
	for i, name := range []string{"svc-1", "svc-2", "svc-3", "svc-4", "svc-5", "svc-6", "svc-7"} {
		s.services[types.NamespacedName{Namespace: "default", Name: name}] = service(name, "10.96.0."+string(rune('1'+i)))
		s.slices[types.NamespacedName{Namespace: "default", Name: name}] = []*discoveryv1.EndpointSlice{slice(name, true)}
	}
	// svc-5's only endpoint is not ready; svc-6 has no slice; svc-7 is
	// headless.
	s.slices[types.NamespacedName{Namespace: "default", Name: "svc-5"}] = []*discoveryv1.EndpointSlice{slice("svc-5", false)}
	delete(s.slices, types.NamespacedName{Namespace: "default", Name: "svc-6"})
	s.services[types.NamespacedName{Namespace: "default", Name: "svc-7"}].Spec.ClusterIP = corev1.ClusterIPNone
	return s
}

func TestRoute(t *testing.T) {
	exact, prefix, impl := networkingv1.PathTypeExact, networkingv1.PathTypePrefix, networkingv1.PathTypeImplementationSpecific
	main := ingress("main", "tether", time.Hour, networkingv1.IngressSpec{
		DefaultBackend: ptr.To(be("svc-4")),
		Rules: []networkingv1.IngressRule{
			rule("app.example.com", path("/", prefix, "svc-1"), path("/api", prefix, "svc-2"), path("/api", exact, "svc-3"), path("/api/v2/", prefix, "svc-3")),
			rule("*.example.com", path("/", prefix, "svc-2"), path("/down", prefix, "svc-5"), path("/gone", prefix, "svc-6"), path("/missing", prefix, "nope"), path("/headless", prefix, "svc-7")),
			rule("", path("/static", impl, "svc-3"), path("/exact", exact, "svc-1")),
		},
	})
	// A younger Ingress does not take a path the older one has, but adds
	// its own; an Ingress of another class and one without class (the
	// default class is not tether's) are not served.
	younger := ingress("younger", "tether", time.Minute, networkingv1.IngressSpec{
		DefaultBackend: ptr.To(be("svc-1")),
		Rules:          []networkingv1.IngressRule{rule("app.example.com", path("/api", prefix, "svc-4"), path("/new", exact, "svc-4"))},
	})
	other := ingress("other", "nginx", 2*time.Hour, networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{rule("other.com", path("/", prefix, "svc-1"))}})
	none := ingress("none", "", 2*time.Hour, networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{rule("none.com", path("/", prefix, "svc-1"))}})
	tbl := build(testState(main, younger, other, none))

	tests := []struct {
		host, path string
		want       string // target, or the status
	}{
		{"app.example.com", "/", "10.96.0.1:80"},
		{"app.example.com", "/foo", "10.96.0.1:80"},
		{"APP.example.com.", "/foo", "10.96.0.1:80"},
		{"app.example.com", "/api", "10.96.0.3:80"},       // Exact before Prefix
		{"app.example.com", "/api/", "10.96.0.2:80"},      // Prefix, element-wise
		{"app.example.com", "/api/users", "10.96.0.2:80"}, // Prefix
		{"app.example.com", "/apiary", "10.96.0.1:80"},    // not element-wise: "/"
		{"app.example.com", "/api/v2", "10.96.0.3:80"},    // trailing slash ignored
		{"app.example.com", "/api/v2/x", "10.96.0.3:80"},  // longest wins
		{"app.example.com", "/new", "10.96.0.4:80"},       // the younger's own path
		{"x.example.com", "/anything", "10.96.0.2:80"},    // wildcard
		{"a.b.example.com", "/static/x", "10.96.0.3:80"},  // wildcard is one label: the host-less rules
		{"example.com", "/exact", "10.96.0.1:80"},
		{"example.com", "/exact/", "10.96.0.4:80"}, // Exact only: default backend
		{"x.example.com", "/down", "503"},          // no ready endpoint
		{"x.example.com", "/gone", "503"},          // no slice
		{"x.example.com", "/missing", "503"},       // no Service
		{"x.example.com", "/headless", "503"},      // no cluster IP
		{"other.com", "/", "10.96.0.4:80"},         // another class's host: default backend
		{"none.com", "/", "10.96.0.4:80"},
	}
	for _, tt := range tests {
		b := tbl.route(tt.host, tt.path)
		got := "404"
		if b != nil {
			got = b.target
			if got == "" {
				got = "503"
			}
		}
		if got != tt.want {
			t.Errorf("%s%s: %s, want %s", tt.host, tt.path, got, tt.want)
		}
	}
	if len(tbl.served) != 2 || tbl.served[0].Name != "main" || tbl.served[1].Name != "younger" {
		t.Errorf("served %v", tbl.served)
	}

	// Without a default backend, what matches nothing is 404.
	noDefault := build(testState(ingress("r", "tether", 0, networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{rule("a.com", path("/x", exact, "svc-1"))}})))
	for _, tc := range [][2]string{{"a.com", "/y"}, {"b.com", "/x"}} {
		if b := noDefault.route(tc[0], tc[1]); b != nil {
			t.Errorf("%s%s: routed to %+v, want 404", tc[0], tc[1], b)
		}
	}
	// A defaultBackend-only Ingress takes everything; a port by name.
	byName := networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "svc-2", Port: networkingv1.ServiceBackendPort{Name: "http"}}}
	only := build(testState(ingress("d", "tether", 0, networkingv1.IngressSpec{DefaultBackend: &byName})))
	if b := only.route("any.host", "/x/y"); b == nil || b.target != "10.96.0.2:80" {
		t.Errorf("default backend by port name: %+v", b)
	}
	// A wrong port is 503.
	badPort := ingress("p", "tether", 0, networkingv1.IngressSpec{DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "svc-1", Port: networkingv1.ServiceBackendPort{Number: 81}}}})
	if b := build(testState(badPort)).route("h", "/"); b == nil || b.status != http.StatusServiceUnavailable {
		t.Errorf("wrong port: %+v", b)
	}
	// Once tether's class is the default, Ingresses without a class are
	// served.
	s := testState(none)
	s.classes["tether"] = class("tether", ControllerName, true)
	s.classes["nginx"] = class("nginx", "k8s.io/ingress-nginx", false)
	if b := build(s).route("none.com", "/"); b == nil || b.target != "10.96.0.1:80" {
		t.Errorf("Ingress without class under tether's default class: %+v", b)
	}
}

// TestHostOnly: the port is cut from a Host header that has one, IPv6
// literals included, and nothing from one without.
func TestHostOnly(t *testing.T) {
	for in, want := range map[string]string{
		"example.com": "example.com", "example.com:8080": "example.com",
		"[::1]": "[::1]", "[::1]:80": "::1", "10.0.0.1": "10.0.0.1", "10.0.0.1:80": "10.0.0.1", "": "",
	} {
		if got := hostOnly(in); got != want {
			t.Errorf("hostOnly(%q) = %q, want %q", in, got, want)
		}
	}
}
