package nodes

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/storage"
)

// A node labelled as running the ingress controller reads Ingresses,
// IngressClasses and the TLS Secrets of the Ingresses of tether's
// classes, and writes Ingresses' status; other nodes do none of it.
func TestNodeAuthorizerIngress(t *testing.T) {
	st := newStorage(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := NewAuthorizer(Config{Storage: st, Logger: quiet})
	go a.Run(ctx)
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "edge1", Labels: map[string]string{ingressNodeLabel: "true"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "edge2"}},
	} {
		if _, err := st.Create(ctx, nodesKind, "", n, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []*networkingv1.IngressClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "tether", Annotations: map[string]string{networkingv1.AnnotationIsDefaultIngressClass: "true"}}, Spec: networkingv1.IngressClassSpec{Controller: ingressController}},
		{ObjectMeta: metav1.ObjectMeta{Name: "nginx"}, Spec: networkingv1.IngressClassSpec{Controller: "k8s.io/ingress-nginx"}},
	} {
		if _, err := st.Create(ctx, ingressClassesKind, "", c, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	backend := &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Number: 80}}}
	ing := func(name string, class *string, secret string) *networkingv1.Ingress {
		return &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.IngressSpec{
			IngressClassName: class, DefaultBackend: backend, TLS: []networkingv1.IngressTLS{{SecretName: secret}}}}
	}
	for _, i := range []*networkingv1.Ingress{ing("ours", ptr.To("tether"), "ours-tls"), ing("classless", nil, "classless-tls"), ing("theirs", ptr.To("nginx"), "theirs-tls")} {
		if _, err := st.Create(ctx, ingressesKind, "shop", i, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	res := func(verb, group, kind, ns, name, sub, fieldSel string) apiserver.Attributes {
		return apiserver.Attributes{Verb: verb, Resource: true, Group: group, Version: "v1", Kind: kind,
			Namespace: ns, Name: name, Subresource: sub, FieldSelector: fieldSel}
	}
	const net = "networking.k8s.io"
	edge1, edge2 := nodeUser("edge1"), nodeUser("edge2")
	for _, at := range []apiserver.Attributes{
		res("list", net, "ingresses", "", "", "", ""),
		res("watch", net, "ingresses", "", "", "", ""),
		res("get", net, "ingresses", "shop", "ours", "", ""),
		res("watch", net, "ingressclasses", "", "", "", ""),
		res("update", net, "ingresses", "shop", "ours", "status", ""),
		res("get", "", "secrets", "shop", "ours-tls", "", ""),
		res("watch", "", "secrets", "shop", "", "", "metadata.name=ours-tls"),
		res("list", "", "secrets", "shop", "", "", "metadata.name=classless-tls"),
	} {
		if err := a.Authorize(edge1, at); err != nil {
			t.Errorf("ingress node: %s %s/%s %s: %v", at.Verb, at.Kind, at.Subresource, at.Name, err)
		}
		if err := a.Authorize(edge2, at); err == nil {
			t.Errorf("plain node allowed: %s %s/%s %s", at.Verb, at.Kind, at.Subresource, at.Name)
		}
	}
	for _, at := range []apiserver.Attributes{
		res("update", net, "ingresses", "shop", "ours", "", ""),
		res("delete", net, "ingresses", "shop", "ours", "", ""),
		res("create", net, "ingressclasses", "", "x", "", ""),
		res("get", "", "secrets", "shop", "theirs-tls", "", ""),
		res("get", "", "secrets", "default", "ours-tls", "", ""),
		res("list", "", "secrets", "shop", "", "", ""),
		res("list", "", "secrets", "", "", "", "metadata.name=ours-tls"),
	} {
		if err := a.Authorize(edge1, at); err == nil {
			t.Errorf("ingress node allowed: %s %s/%s %s/%s %s", at.Verb, at.Kind, at.Subresource, at.Namespace, at.Name, at.FieldSelector)
		}
	}
}
