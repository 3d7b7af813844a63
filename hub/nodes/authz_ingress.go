package nodes

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	networkingv1beta1 "k8s.io/api/networking/v1beta1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/storage"
)

// A node that runs tether's ingress controller (edge/ingress) carries the
// label ingressNodeLabel=true, which its agent sets when it registers.
// Such a node may read Ingresses and IngressClasses, write Ingresses'
// status (each node adds its own address), and read the Secrets that the
// TLS entries of the Ingresses it serves name: those of a class whose
// controller is ingressController, or without a class while such a class
// is the default. Other nodes have none of this.
const (
	ingressNodeLabel  = "ingress.tether.io/controller" // edge/ingress.NodeLabel
	ingressController = "tether.io/ingress"            // edge/ingress.ControllerName
)

var (
	ingressesKind      = mustKind(schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "ingresses"})
	ingressClassesKind = mustKind(schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "ingressclasses"})
)

// decideIngress decides a node's requests on Ingresses and
// IngressClasses; "" allows.
func (a *Authorizer) decideIngress(node string, at apiserver.Attributes) string {
	read := at.Verb == "get" || at.Verb == "list" || at.Verb == "watch"
	if !a.runsIngress(node) {
		return fmt.Sprintf("node '%s' does not run the ingress controller (label %s=true)", node, ingressNodeLabel)
	}
	switch {
	case at.Subresource == "" && read:
		return ""
	case at.Kind == "ingresses" && at.Subresource == "status" && (at.Verb == "get" || at.Verb == "update" || at.Verb == "patch"):
		return ""
	}
	return fmt.Sprintf("node '%s' may only read %s and write ingresses/status", node, at.Kind)
}

// runsIngress reports whether node's Node carries the ingress label.
func (a *Authorizer) runsIngress(node string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	obj, err := a.cfg.Storage.Get(ctx, nodesKind, "", node)
	if err != nil {
		return false
	}
	return obj.(*corev1.Node).Labels[ingressNodeLabel] == "true"
}

// ingressSecret reports whether Secret ns/name is named by a TLS entry of
// an Ingress that tether's ingress controller serves, and node runs it.
func (a *Authorizer) ingressSecret(node, ns, name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	obj, err := a.cfg.Storage.List(ctx, ingressesKind, ns, storage.ListOptions{})
	if err != nil {
		return false
	}
	var named []*networkingv1.Ingress
	for i := range obj.(*networkingv1.IngressList).Items {
		ing := &obj.(*networkingv1.IngressList).Items[i]
		for _, t := range ing.Spec.TLS {
			if t.SecretName == name {
				named = append(named, ing)
				break
			}
		}
	}
	if len(named) == 0 || !a.runsIngress(node) {
		return false
	}
	obj, err = a.cfg.Storage.List(ctx, ingressClassesKind, "", storage.ListOptions{})
	if err != nil {
		return false
	}
	ours, oursDefault := map[string]bool{}, false
	for _, c := range obj.(*networkingv1.IngressClassList).Items {
		if c.Spec.Controller == ingressController {
			ours[c.Name] = true
			oursDefault = oursDefault || c.Annotations[networkingv1.AnnotationIsDefaultIngressClass] == "true"
		}
	}
	for _, ing := range named {
		class, set := "", false
		if ing.Spec.IngressClassName != nil {
			class, set = *ing.Spec.IngressClassName, true
		} else if v, ok := ing.Annotations[networkingv1beta1.AnnotationIngressClass]; ok {
			class, set = v, true
		}
		if set && ours[class] || !set && oursDefault {
			return true
		}
	}
	return false
}
