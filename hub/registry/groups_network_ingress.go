package registry

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	networkingv1beta1 "k8s.io/api/networking/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/validate/content"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ingressClassesResource is the group-qualified resource the Ingress
// admission lists to find the default class.
const ingressClassesResource = "ingressclasses.networking.k8s.io"

// maxIngressClassController bounds spec.controller, as upstream does.
const maxIngressClassController = 250

// ---- Ingress ----

var ingressKind = &Kind{
	GVK:        networkingv1.SchemeGroupVersion.WithKind("Ingress"),
	Resource:   "ingresses",
	Singular:   "ingress",
	Namespaced: true,
	ShortNames: []string{"ing"},
	HasStatus:  true,
	HasSpec:    true,
	Mutate: func(ctx context.Context, l Lister, obj, old runtime.Object) error {
		if old != nil {
			return nil
		}
		return defaultIngressClass(ctx, l, obj.(*networkingv1.Ingress))
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		ing := obj.(*networkingv1.Ingress)
		errs := validateIngressSpec(&ing.Spec)
		if v, ok := ing.Annotations[networkingv1beta1.AnnotationIngressClass]; ok && ing.Spec.IngressClassName != nil && v != *ing.Spec.IngressClassName {
			errs = append(errs, field.Invalid(field.NewPath("annotations").Child(networkingv1beta1.AnnotationIngressClass), v, "must match `ingressClassName` when both are specified"))
		}
		return errs
	},
	ValidateUpdate: func(obj, _ runtime.Object) field.ErrorList {
		return validateIngressSpec(&obj.(*networkingv1.Ingress).Spec)
	},
	ValidateStatusUpdate: func(obj, _ runtime.Object) field.ErrorList {
		return validateIngressLoadBalancer(&obj.(*networkingv1.Ingress).Status.LoadBalancer, field.NewPath("status", "loadBalancer"))
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Class", "string", 0, "The name of the IngressClass resource that should be used for additional configuration"),
		column("Hosts", "string", 0, "Hosts that incoming requests are matched against before the ingress rule"),
		column("Address", "string", 0, "Address is a list containing ingress points for the load-balancer"),
		column("Ports", "string", 0, "Ports of TLS configurations that open"),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		ing := obj.(*networkingv1.Ingress)
		class := "<none>"
		if ing.Spec.IngressClassName != nil {
			class = *ing.Spec.IngressClassName
		}
		ports := "80"
		if len(ing.Spec.TLS) != 0 {
			ports = "80, 443"
		}
		return []any{ing.Name, class, ingressHosts(ing.Spec.Rules), ingressAddress(ing.Status.LoadBalancer), ports, age(ing.CreationTimestamp, now)}
	},
}

// ingressHosts renders the hosts cell: up to three rule hosts, "*" when
// no rule names one.
func ingressHosts(rules []networkingv1.IngressRule) string {
	var list []string
	more := false
	for _, r := range rules {
		if len(list) == 3 {
			more = true
		}
		if !more && r.Host != "" {
			list = append(list, r.Host)
		}
	}
	if len(list) == 0 {
		return "*"
	}
	out := strings.Join(list, ",")
	if more {
		return fmt.Sprintf("%s + %d more...", out, len(rules)-3)
	}
	return out
}

// ingressAddress renders the address cell: the sorted distinct IPs, or
// host names where an entry has no IP. The server's table is wide, so
// nothing is cut.
func ingressAddress(s networkingv1.IngressLoadBalancerStatus) string {
	seen := map[string]bool{}
	var out []string
	for _, in := range s.Ingress {
		v := in.IP
		if v == "" {
			v = in.Hostname
		}
		if v != "" && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// defaultIngressClass is upstream's DefaultIngressClass admission: an
// Ingress created with neither spec.ingressClassName nor the legacy
// annotation gets the class annotated as the default; of several, the
// newest (then the first by name).
func defaultIngressClass(ctx context.Context, l Lister, ing *networkingv1.Ingress) error {
	if ing.Spec.IngressClassName != nil || l == nil {
		return nil
	}
	if _, ok := ing.Annotations[networkingv1beta1.AnnotationIngressClass]; ok {
		return nil
	}
	objs, err := l.List(ctx, ingressClassesResource, "")
	if err != nil {
		return apierrors.NewForbidden(networkingv1.Resource("ingresses"), ing.Name, fmt.Errorf("list ingress classes: %w", err))
	}
	var defaults []*networkingv1.IngressClass
	for _, o := range objs {
		if c, ok := o.(*networkingv1.IngressClass); ok && c.Annotations[networkingv1.AnnotationIsDefaultIngressClass] == "true" {
			defaults = append(defaults, c)
		}
	}
	if len(defaults) == 0 {
		return nil
	}
	sort.Slice(defaults, func(i, j int) bool {
		ti, tj := defaults[i].CreationTimestamp.UnixNano(), defaults[j].CreationTimestamp.UnixNano()
		if ti == tj {
			return defaults[i].Name < defaults[j].Name
		}
		return ti > tj
	})
	name := defaults[0].Name
	ing.Spec.IngressClassName = &name
	return nil
}

func validateIngressSpec(s *networkingv1.IngressSpec) field.ErrorList {
	var errs field.ErrorList
	if len(s.Rules) == 0 && s.DefaultBackend == nil {
		errs = append(errs, field.Invalid(gSpec, s.Rules, "either `defaultBackend` or `rules` must be specified"))
	}
	if s.DefaultBackend != nil {
		errs = append(errs, validateIngressBackend(s.DefaultBackend, gSpec.Child("defaultBackend"))...)
	}
	for i, r := range s.Rules {
		p := gSpec.Child("rules").Index(i)
		if r.Host != "" {
			if _, err := netip.ParseAddr(r.Host); err == nil {
				errs = append(errs, field.Invalid(p.Child("host"), r.Host, "must be a DNS name, not an IP address"))
			}
			errs = append(errs, validateIngressHost(r.Host, p.Child("host"))...)
		}
		if r.HTTP == nil {
			continue
		}
		hp := p.Child("http")
		if len(r.HTTP.Paths) == 0 {
			errs = append(errs, field.Required(hp.Child("paths"), ""))
		}
		for j := range r.HTTP.Paths {
			errs = append(errs, validateIngressPath(&r.HTTP.Paths[j], hp.Child("paths").Index(j))...)
		}
	}
	for i, t := range s.TLS {
		p := gSpec.Child("tls").Index(i)
		for j, h := range t.Hosts {
			errs = append(errs, validateIngressHost(h, p.Child("hosts").Index(j))...)
		}
		if t.SecretName != "" {
			for _, m := range dnsSubdomainMsgs(t.SecretName) {
				errs = append(errs, field.Invalid(p.Child("secretName"), t.SecretName, m))
			}
		}
	}
	if s.IngressClassName != nil {
		for _, m := range dnsSubdomainMsgs(*s.IngressClassName) {
			errs = append(errs, field.Invalid(gSpec.Child("ingressClassName"), *s.IngressClassName, m))
		}
	}
	return errs
}

// validateIngressHost checks a rule's or a TLS entry's host: a DNS
// subdomain, or a wildcard "*." followed by one.
func validateIngressHost(host string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	msgs := validation.IsDNS1123Subdomain(host)
	if strings.Contains(host, "*") {
		msgs = validation.IsWildcardDNS1123Subdomain(host)
	}
	for _, m := range msgs {
		errs = append(errs, field.Invalid(path, host, m))
	}
	return errs
}

var (
	supportedPathTypes   = []string{string(networkingv1.PathTypeExact), string(networkingv1.PathTypeImplementationSpecific), string(networkingv1.PathTypePrefix)}
	invalidPathSequences = []string{"//", "/./", "/../", "%2f", "%2F"}
	invalidPathSuffixes  = []string{"/..", "/."}
)

func validateIngressPath(p *networkingv1.HTTPIngressPath, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if p.PathType == nil {
		return append(errs, field.Required(path.Child("pathType"), "pathType must be specified"))
	}
	switch *p.PathType {
	case networkingv1.PathTypeExact, networkingv1.PathTypePrefix:
		if !strings.HasPrefix(p.Path, "/") {
			errs = append(errs, field.Invalid(path.Child("path"), p.Path, "must be an absolute path"))
		}
		for _, seq := range invalidPathSequences {
			if strings.Contains(p.Path, seq) {
				errs = append(errs, field.Invalid(path.Child("path"), p.Path, fmt.Sprintf("must not contain '%s'", seq)))
			}
		}
		for _, suf := range invalidPathSuffixes {
			if strings.HasSuffix(p.Path, suf) {
				errs = append(errs, field.Invalid(path.Child("path"), p.Path, fmt.Sprintf("cannot end with '%s'", suf)))
			}
		}
	case networkingv1.PathTypeImplementationSpecific:
		if p.Path != "" && !strings.HasPrefix(p.Path, "/") {
			errs = append(errs, field.Invalid(path.Child("path"), p.Path, "must be an absolute path"))
		}
	default:
		errs = append(errs, field.NotSupported(path.Child("pathType"), *p.PathType, supportedPathTypes))
	}
	return append(errs, validateIngressBackend(&p.Backend, path.Child("backend"))...)
}

func validateIngressBackend(b *networkingv1.IngressBackend, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch {
	case b.Resource != nil && b.Service != nil:
		return append(errs, field.Invalid(path, "", "cannot set both resource and service backends"))
	case b.Resource != nil:
		errs = append(errs, validateTypedLocalRef(b.Resource.APIGroup, b.Resource.Kind, b.Resource.Name, path.Child("resource"))...)
	case b.Service != nil:
		sp := path.Child("service")
		if b.Service.Name == "" {
			errs = append(errs, field.Required(sp.Child("name"), ""))
		} else {
			for _, m := range apivalidation.NameIsDNS1035Label(b.Service.Name, false) {
				errs = append(errs, field.Invalid(sp.Child("name"), b.Service.Name, m))
			}
		}
		port := b.Service.Port
		switch {
		case port.Name != "" && port.Number != 0:
			errs = append(errs, field.Invalid(path, "", "cannot set both port name & port number"))
		case port.Name != "":
			for _, m := range validation.IsValidPortName(port.Name) {
				errs = append(errs, field.Invalid(sp.Child("port", "name"), port.Name, m))
			}
		case port.Number != 0:
			for _, m := range validation.IsValidPortNum(int(port.Number)) {
				errs = append(errs, field.Invalid(sp.Child("port", "number"), port.Number, m))
			}
		default:
			errs = append(errs, field.Required(path, "port name or number is required"))
		}
	default:
		errs = append(errs, field.Invalid(path, "", "resource or service backend is required"))
	}
	return errs
}

// validateTypedLocalRef checks a backend resource or a class's parameters
// reference.
func validateTypedLocalRef(group *string, kind, name string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if group != nil {
		for _, m := range validation.IsDNS1123Subdomain(*group) {
			errs = append(errs, field.Invalid(path.Child("apiGroup"), *group, m))
		}
	}
	if kind == "" {
		errs = append(errs, field.Required(path.Child("kind"), "kind is required"))
	} else {
		for _, m := range content.IsPathSegmentName(kind) {
			errs = append(errs, field.Invalid(path.Child("kind"), kind, m))
		}
	}
	if name == "" {
		errs = append(errs, field.Required(path.Child("name"), "name is required"))
	} else {
		for _, m := range content.IsPathSegmentName(name) {
			errs = append(errs, field.Invalid(path.Child("name"), name, m))
		}
	}
	return errs
}

func validateIngressLoadBalancer(s *networkingv1.IngressLoadBalancerStatus, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, in := range s.Ingress {
		p := path.Child("ingress").Index(i)
		if in.IP != "" {
			errs = append(errs, validation.IsValidIP(p.Child("ip"), in.IP)...)
		}
		if in.Hostname != "" {
			for _, m := range validation.IsDNS1123Subdomain(in.Hostname) {
				errs = append(errs, field.Invalid(p.Child("hostname"), in.Hostname, m))
			}
			if _, err := netip.ParseAddr(in.Hostname); err == nil {
				errs = append(errs, field.Invalid(p.Child("hostname"), in.Hostname, "must be a DNS name, not an IP address"))
			}
		}
	}
	return errs
}

// ---- IngressClass ----

var ingressClassKind = &Kind{
	GVK:      networkingv1.SchemeGroupVersion.WithKind("IngressClass"),
	Resource: "ingressclasses",
	Singular: "ingressclass",
	Default: func(obj runtime.Object) {
		c := obj.(*networkingv1.IngressClass)
		if p := c.Spec.Parameters; p != nil && p.Scope == nil {
			p.Scope = ptrTo(networkingv1.IngressClassParametersReferenceScopeCluster)
		}
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateIngressClass(&obj.(*networkingv1.IngressClass).Spec)
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		c, o := obj.(*networkingv1.IngressClass), old.(*networkingv1.IngressClass)
		errs := apivalidation.ValidateImmutableField(c.Spec.Controller, o.Spec.Controller, gSpec.Child("controller"))
		return append(errs, validateIngressClass(&c.Spec)...)
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Controller", "string", 0, "Controller that is responsible for handling this class"),
		column("Parameters", "string", 0, "A reference to a resource with additional parameters"),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		c := obj.(*networkingv1.IngressClass)
		params := "<none>"
		if p := c.Spec.Parameters; p != nil {
			params = p.Kind
			if p.APIGroup != nil {
				params += "." + *p.APIGroup
			}
			params += "/" + p.Name
		}
		return []any{c.Name, c.Spec.Controller, params, age(c.CreationTimestamp, now)}
	},
}

func validateIngressClass(s *networkingv1.IngressClassSpec) field.ErrorList {
	var errs field.ErrorList
	cp := gSpec.Child("controller")
	if len(s.Controller) > maxIngressClassController {
		errs = append(errs, field.TooLong(cp, s.Controller, maxIngressClassController))
	}
	errs = append(errs, validation.IsDomainPrefixedPath(cp, s.Controller)...)
	p := s.Parameters
	if p == nil {
		return errs
	}
	pp := gSpec.Child("parameters")
	errs = append(errs, validateTypedLocalRef(p.APIGroup, p.Kind, p.Name, pp)...)
	if p.Scope == nil {
		return append(errs, field.Required(pp.Child("scope"), ""))
	}
	switch *p.Scope {
	case networkingv1.IngressClassParametersReferenceScopeNamespace:
		if p.Namespace == nil {
			errs = append(errs, field.Required(pp.Child("namespace"), "`parameters.scope` is set to 'Namespace'"))
		} else {
			for _, m := range apivalidation.NameIsDNSLabel(*p.Namespace, false) {
				errs = append(errs, field.Invalid(pp.Child("namespace"), *p.Namespace, m))
			}
		}
	case networkingv1.IngressClassParametersReferenceScopeCluster:
		if p.Namespace != nil {
			errs = append(errs, field.Forbidden(pp.Child("namespace"), "`parameters.scope` is set to 'Cluster'"))
		}
	default:
		errs = append(errs, field.NotSupported(pp.Child("scope"), *p.Scope, []string{
			networkingv1.IngressClassParametersReferenceScopeCluster, networkingv1.IngressClassParametersReferenceScopeNamespace}))
	}
	return errs
}
