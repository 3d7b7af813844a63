package apiserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/proxy"

	"github.com/tether-edge/tether/hub/registry"
)

// PodDialer opens a connection to addr (a pod's IP:port) from node, normally
// a stream through the node's tunnel that the agent connects to the pod.
// It returns ErrNodeNotConnected for a node without a tunnel.
type PodDialer func(ctx context.Context, node, addr string) (net.Conn, error)

// proxyMethods are the methods pods/proxy and services/proxy serve, as
// upstream's connect handlers declare them.
var proxyMethods = map[string]bool{
	http.MethodGet: true, http.MethodPost: true, http.MethodPut: true, http.MethodPatch: true,
	http.MethodDelete: true, http.MethodHead: true, http.MethodOptions: true,
}

// podProxy serves /api/v1/namespaces/<ns>/pods/[scheme:]<name>[:port]/proxy/<path>.
// Without a port it takes the pod's first declared container port, and
// without one the scheme's default port.
func (s *Server) podProxy(w http.ResponseWriter, r *http.Request, t target) {
	scheme, name, port, ok := utilnet.SplitSchemeNamePort(t.name)
	if !ok {
		s.writeError(w, apierrors.NewBadRequest(fmt.Sprintf("invalid pod request %q", t.name)))
		return
	}
	obj, err := s.cfg.Storage.Get(r.Context(), t.kind, t.namespace, name)
	if err != nil {
		s.writeError(w, err)
		return
	}
	pod := obj.(*corev1.Pod)
	if port == "" {
		for _, c := range pod.Spec.Containers {
			if len(c.Ports) > 0 {
				port = strconv.Itoa(int(c.Ports[0].ContainerPort))
				break
			}
		}
	}
	ip := net.ParseIP(pod.Status.PodIP)
	if ip == nil || !ip.IsGlobalUnicast() || pod.Spec.NodeName == "" {
		s.writeError(w, apierrors.NewBadRequest("address not allowed"))
		return
	}
	loc := &url.URL{Scheme: scheme, Host: ip.String()}
	if ip.To4() == nil {
		loc.Host = "[" + loc.Host + "]"
	}
	if port != "" {
		loc.Host = net.JoinHostPort(ip.String(), port)
	}
	s.proxyToPod(w, r, t, pod.Spec.NodeName, loc)
}

// serviceProxy serves
// /api/v1/namespaces/<ns>/services/[scheme:]<name>[:port]/proxy/<path>: the
// port is the service port's name or number (none for a service's one
// unnamed port), and a ready endpoint of that port, picked at random from
// the service's EndpointSlices, answers through its node's tunnel.
func (s *Server) serviceProxy(w http.ResponseWriter, r *http.Request, t target) {
	scheme, name, port, ok := utilnet.SplitSchemeNamePort(t.name)
	if !ok {
		s.writeError(w, apierrors.NewBadRequest(fmt.Sprintf("invalid service request %q", t.name)))
		return
	}
	obj, err := s.cfg.Storage.Get(r.Context(), t.kind, t.namespace, name)
	if err != nil {
		s.writeError(w, err)
		return
	}
	svc := obj.(*corev1.Service)
	if n, err := strconv.ParseInt(port, 10, 64); err == nil {
		found := false
		for _, p := range svc.Spec.Ports {
			if int64(p.Port) == n {
				port, found = p.Name, true
				break
			}
		}
		if !found {
			s.writeError(w, apierrors.NewServiceUnavailable(fmt.Sprintf("no service port %d found for service %q", n, name)))
			return
		}
	}
	node, addr, err := s.services.Endpoint(r.Context(), t.namespace, name, port)
	if err != nil {
		s.writeError(w, err)
		return
	}
	s.proxyToPod(w, r, t, node, &url.URL{Scheme: scheme, Host: addr})
}

// proxyToPod forwards r to loc (joined with the request's proxy path)
// through node: upstream's proxy handler does the forwarding, so the
// X-Forwarded-* headers, the rewriting of redirects and of HTML links to
// the proxy path, upgrades, and the redirect of an empty path to "/" are
// upstream's own.
func (s *Server) proxyToPod(w http.ResponseWriter, r *http.Request, t target, node string, loc *url.URL) {
	if !proxyMethods[r.Method] {
		s.writeError(w, apierrors.NewMethodNotSupported(schema.GroupResource{Resource: t.kind.Resource + "/proxy"}, r.Method))
		return
	}
	if s.cfg.DialPod == nil {
		s.writeError(w, statusErr(http.StatusServiceUnavailable, fmt.Sprintf("no tunnel server: node %q cannot be reached", node)))
		return
	}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			c, err := s.cfg.DialPod(ctx, node, addr)
			if errors.Is(err, ErrNodeNotConnected) {
				return nil, fmt.Errorf("node %q is not connected to the hub", node)
			}
			return c, err
		},
		// Pods serve their own certificates, which upstream does not
		// verify either.
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec
		DisableKeepAlives: true,
	}
	defer transport.CloseIdleConnections()
	loc.Path = utilnet.JoinPreservingTrailingSlash(loc.Path, t.proxyPath)
	// The hub's credentials are for the hub, not for the pod.
	r.Header.Del("Authorization")
	h := proxy.NewUpgradeAwareHandler(loc, transport, true, false, proxyResponder{s})
	h.ServeHTTP(w, r)
}

// proxyResponder writes the errors of a proxied request as Status objects.
type proxyResponder struct{ s *Server }

func (p proxyResponder) Error(w http.ResponseWriter, _ *http.Request, err error) {
	p.s.writeError(w, err)
}

// proxiable reports whether k has a proxy subresource served by
// proxyToPods.
func proxiable(k *registry.Kind) bool {
	return k.GVK.Group == "" && (k.Resource == "pods" || k.Resource == "services")
}

// proxyToPods serves pods/proxy and services/proxy.
func (s *Server) proxyToPods(w http.ResponseWriter, r *http.Request, t target) {
	if t.kind.Resource == "pods" {
		s.podProxy(w, r, t)
		return
	}
	s.serviceProxy(w, r, t)
}
