package apiserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/proxy"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
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
	node, addr, err := s.pickEndpoint(r.Context(), t.namespace, name, port, t.name)
	if err != nil {
		s.writeError(w, err)
		return
	}
	s.proxyToPod(w, r, t, node, &url.URL{Scheme: scheme, Host: addr})
}

// pickEndpoint returns a ready endpoint of the service port named port, and
// the node of its pod. Only endpoints that are pods of the namespace with
// that address are taken, as upstream only proxies to pods.
func (s *Server) pickEndpoint(ctx context.Context, namespace, service, port, id string) (node, addr string, err error) {
	sliceKind := s.kinds[discoveryv1.SchemeGroupVersion]["endpointslices"]
	podKind := s.kinds[corev1.SchemeGroupVersion]["pods"]
	if sliceKind == nil || podKind == nil {
		return "", "", apierrors.NewServiceUnavailable(fmt.Sprintf("no endpoints available for service %q", service))
	}
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service})
	obj, err := s.cfg.Storage.List(ctx, sliceKind, namespace, storage.ListOptions{Label: sel})
	if err != nil {
		return "", "", err
	}
	type candidate struct {
		ip, pod string
		port    int32
	}
	var cands []candidate
	anyReady := false
	for _, sl := range obj.(*discoveryv1.EndpointSliceList).Items {
		var ready []discoveryv1.Endpoint
		for _, ep := range sl.Endpoints {
			if (ep.Conditions.Ready == nil || *ep.Conditions.Ready) && len(ep.Addresses) > 0 {
				ready = append(ready, ep)
			}
		}
		anyReady = anyReady || len(ready) > 0
		for _, p := range sl.Ports {
			pn := ""
			if p.Name != nil {
				pn = *p.Name
			}
			if pn != port || p.Port == nil {
				continue
			}
			for _, ep := range ready {
				if ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" ||
					ep.TargetRef.Namespace != "" && ep.TargetRef.Namespace != namespace {
					continue
				}
				cands = append(cands, candidate{ip: ep.Addresses[0], pod: ep.TargetRef.Name, port: *p.Port})
			}
		}
	}
	if !anyReady {
		return "", "", apierrors.NewServiceUnavailable(fmt.Sprintf("no endpoints available for service %q", service))
	}
	rand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	for _, c := range cands {
		obj, err := s.cfg.Storage.Get(ctx, podKind, namespace, c.pod)
		if err != nil {
			continue
		}
		pod := obj.(*corev1.Pod)
		if pod.Spec.NodeName == "" || !podHasIP(pod, c.ip) {
			continue
		}
		return pod.Spec.NodeName, net.JoinHostPort(c.ip, strconv.Itoa(int(c.port))), nil
	}
	return "", "", apierrors.NewServiceUnavailable(fmt.Sprintf("no endpoints available for service %q", id))
}

func podHasIP(pod *corev1.Pod, ip string) bool {
	for _, p := range pod.Status.PodIPs {
		if p.IP == ip {
			return true
		}
	}
	return pod.Status.PodIP == ip
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
