package ingress

import (
	"crypto/tls"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	networkingv1beta1 "k8s.io/api/networking/v1beta1"
	"k8s.io/apimachinery/pkg/types"
)

// backend is where a route sends requests: a Service's cluster IP and port,
// or, when the Service cannot take them, the status to answer with.
type backend struct {
	service types.NamespacedName
	port    string // the Ingress's port, by number or name
	target  string // ClusterIP:port; "" when status says why not
	status  int    // http.StatusServiceUnavailable when target is ""
}

// pathRoute is one path of a rule.
type pathRoute struct {
	path    string // for Prefix: without its trailing slashes
	exact   bool
	backend *backend
}

// hostRoutes are the paths of every rule for one host, longest first,
// Exact before Prefix among paths of one length.
type hostRoutes struct {
	paths []pathRoute
}

// match returns the backend of the longest path matching p, or nil.
func (h *hostRoutes) match(p string) *backend {
	if h == nil {
		return nil
	}
	for _, r := range h.paths {
		if r.exact {
			if p == r.path {
				return r.backend
			}
			continue
		}
		// Prefix: element-wise, "/foo" matches "/foo" and "/foo/bar",
		// not "/foobar"; "" (from "/") matches everything.
		if r.path == "" || p == r.path || strings.HasPrefix(p, r.path+"/") {
			return r.backend
		}
	}
	return nil
}

func (h *hostRoutes) add(r pathRoute) {
	for _, have := range h.paths {
		if have.path == r.path && have.exact == r.exact {
			return // the older Ingress keeps it
		}
	}
	h.paths = append(h.paths, r)
}

func (h *hostRoutes) sort() {
	sort.SliceStable(h.paths, func(i, j int) bool {
		a, b := h.paths[i], h.paths[j]
		if len(a.path) != len(b.path) {
			return len(a.path) > len(b.path)
		}
		return a.exact && !b.exact
	})
}

// table is one immutable state of the routes and certificates; the
// controller swaps it whole.
type table struct {
	exact     map[string]*hostRoutes // by host
	wildcard  map[string]*hostRoutes // by the host's part after "*."
	anyHost   *hostRoutes            // rules without a host
	def       *backend               // the oldest Ingress's defaultBackend
	certs     map[string]*tls.Certificate
	wildCerts map[string]*tls.Certificate
	fallback  *tls.Certificate // the first TLS entry's certificate
	// served are the Ingresses the table routes for; services and
	// secrets what they reference.
	served   []types.NamespacedName
	services map[types.NamespacedName]bool
	secrets  map[types.NamespacedName]bool
}

// route returns the backend for a request to host (without port) and
// path, or nil when nothing matches (404). The host's own rules come
// first, then the wildcard rules of its parent domain, then the rules
// without a host, then the default backend.
func (t *table) route(host, path string) *backend {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if b := t.exact[host].match(path); b != nil {
		return b
	}
	if _, parent, ok := strings.Cut(host, "."); ok {
		if b := t.wildcard[parent].match(path); b != nil {
			return b
		}
	}
	if b := t.anyHost.match(path); b != nil {
		return b
	}
	return t.def
}

// certificate returns the certificate for a TLS server name: the one of
// the TLS entry naming it, or of the entry with its wildcard, or the
// fallback.
func (t *table) certificate(name string) *tls.Certificate {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if c := t.certs[name]; c != nil {
		return c
	}
	if _, parent, ok := strings.Cut(name, "."); ok {
		if c := t.wildCerts[parent]; c != nil {
			return c
		}
	}
	return t.fallback
}

// state is what a table is built from. The builder only reads it.
type state struct {
	ingresses  []*networkingv1.Ingress
	classes    map[string]*networkingv1.IngressClass
	services   map[types.NamespacedName]*corev1.Service
	slices     map[types.NamespacedName][]*discoveryv1.EndpointSlice // by Service
	controller string
	cert       func(types.NamespacedName) *tls.Certificate // nil when missing or invalid
}

// handles reports whether the controller serves ing: its class (field,
// or the legacy annotation) is one of the controller's; an Ingress with
// neither goes to the controller whose class is the default.
func (s *state) handles(ing *networkingv1.Ingress) bool {
	name := ""
	if ing.Spec.IngressClassName != nil {
		name = *ing.Spec.IngressClassName
	} else if v, ok := ing.Annotations[networkingv1beta1.AnnotationIngressClass]; ok {
		name = v
	}
	if name != "" {
		c := s.classes[name]
		return c != nil && c.Spec.Controller == s.controller
	}
	for _, c := range s.classes {
		if c.Spec.Controller == s.controller && c.Annotations[networkingv1.AnnotationIsDefaultIngressClass] == "true" {
			return true
		}
	}
	return false
}

// build makes the table of s: the Ingresses the controller handles, oldest
// first, so that of two rules for one host and path the older stays.
func build(s *state) *table {
	t := &table{
		exact: map[string]*hostRoutes{}, wildcard: map[string]*hostRoutes{}, anyHost: &hostRoutes{},
		certs: map[string]*tls.Certificate{}, wildCerts: map[string]*tls.Certificate{},
		services: map[types.NamespacedName]bool{}, secrets: map[types.NamespacedName]bool{},
	}
	ings := make([]*networkingv1.Ingress, 0, len(s.ingresses))
	for _, ing := range s.ingresses {
		if s.handles(ing) && ing.DeletionTimestamp == nil {
			ings = append(ings, ing)
		}
	}
	sort.Slice(ings, func(i, j int) bool {
		a, b := ings[i], ings[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	for _, ing := range ings {
		t.served = append(t.served, types.NamespacedName{Namespace: ing.Namespace, Name: ing.Name})
		if d := ing.Spec.DefaultBackend; d != nil && t.def == nil {
			t.def = s.backend(t, ing.Namespace, d)
		}
		for _, r := range ing.Spec.Rules {
			if r.HTTP == nil {
				continue
			}
			h := t.hostFor(r.Host)
			for _, p := range r.HTTP.Paths {
				h.add(s.pathRoute(t, ing.Namespace, p))
			}
		}
		for _, tl := range ing.Spec.TLS {
			if tl.SecretName == "" {
				continue
			}
			ref := types.NamespacedName{Namespace: ing.Namespace, Name: tl.SecretName}
			t.secrets[ref] = true
			c := s.cert(ref)
			if c == nil {
				continue
			}
			if t.fallback == nil {
				t.fallback = c
			}
			for _, h := range tl.Hosts {
				h = strings.ToLower(h)
				if parent, ok := strings.CutPrefix(h, "*."); ok {
					if t.wildCerts[parent] == nil {
						t.wildCerts[parent] = c
					}
				} else if t.certs[h] == nil {
					t.certs[h] = c
				}
			}
		}
	}
	for _, h := range t.exact {
		h.sort()
	}
	for _, h := range t.wildcard {
		h.sort()
	}
	t.anyHost.sort()
	return t
}

func (t *table) hostFor(host string) *hostRoutes {
	host = strings.ToLower(host)
	m := t.exact
	if parent, ok := strings.CutPrefix(host, "*."); ok {
		m, host = t.wildcard, parent
	} else if host == "" {
		return t.anyHost
	}
	h := m[host]
	if h == nil {
		h = &hostRoutes{}
		m[host] = h
	}
	return h
}

func (s *state) pathRoute(t *table, ns string, p networkingv1.HTTPIngressPath) pathRoute {
	exact := p.PathType != nil && *p.PathType == networkingv1.PathTypeExact
	path := p.Path
	if !exact {
		// Prefix and ImplementationSpecific: element-wise prefixes.
		path = strings.TrimRight(path, "/")
	}
	return pathRoute{path: path, exact: exact, backend: s.backend(t, ns, &p.Backend)}
}

// backend resolves an Ingress backend to the Service's cluster IP and
// port. A resource backend, a missing Service, port or cluster IP, and a
// Service with no ready endpoint give 503.
func (s *state) backend(t *table, ns string, b *networkingv1.IngressBackend) *backend {
	out := &backend{status: http.StatusServiceUnavailable}
	if b.Service == nil {
		return out
	}
	ref := types.NamespacedName{Namespace: ns, Name: b.Service.Name}
	out.service = ref
	t.services[ref] = true
	if b.Service.Port.Name != "" {
		out.port = b.Service.Port.Name
	} else {
		out.port = strconv.Itoa(int(b.Service.Port.Number))
	}
	svc := s.services[ref]
	if svc == nil || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return out
	}
	var port *corev1.ServicePort
	for i, sp := range svc.Spec.Ports {
		if sp.Protocol != corev1.ProtocolTCP && sp.Protocol != "" {
			continue
		}
		if (b.Service.Port.Name != "" && sp.Name == b.Service.Port.Name) || (b.Service.Port.Name == "" && sp.Port == b.Service.Port.Number) {
			port = &svc.Spec.Ports[i]
			break
		}
	}
	if port == nil || !s.hasEndpoint(ref, port.Name) {
		return out
	}
	out.target = net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(port.Port)))
	out.status = 0
	return out
}

// hasEndpoint reports whether a slice of the Service has a ready endpoint
// for its port named portName.
func (s *state) hasEndpoint(svc types.NamespacedName, portName string) bool {
	for _, es := range s.slices[svc] {
		hasPort := false
		for _, p := range es.Ports {
			if p.Name != nil && *p.Name == portName || p.Name == nil && portName == "" {
				hasPort = true
				break
			}
		}
		if !hasPort {
			continue
		}
		for _, e := range es.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				return true
			}
		}
	}
	return false
}
