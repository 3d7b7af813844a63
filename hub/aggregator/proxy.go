package aggregator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	"github.com/tether-edge/tether/hub/auth"
)

// ServiceDialer reaches a Service's ready endpoints wherever its pods run
// (hub/servicedial's Dialer).
type ServiceDialer interface {
	DialService(ctx context.Context, namespace, name string, port int32) (net.Conn, error)
}

// Front-proxy headers, as upstream's request-header authenticator reads
// them and as the hub publishes them in extension-apiserver-authentication.
const (
	headerUser        = "X-Remote-User"
	headerUID         = "X-Remote-Uid"
	headerGroup       = "X-Remote-Group"
	headerExtraPrefix = "X-Remote-Extra-"
)

// backend is how one service-backed APIService is reached.
type backend struct {
	svc       *apiregistrationv1.APIService
	transport *http.Transport
	proxy     *httputil.ReverseProxy
}

// newBackend builds the transport and proxy for s, a service-backed
// APIService: connections go through dial to the Service's port, over TLS
// verified against spec.caBundle (or not verified, with
// insecureSkipTLSVerify), presenting client, the front-proxy client
// certificate.
func newBackend(s *apiregistrationv1.APIService, dial ServiceDialer, client *tls.Certificate) *backend {
	ref := s.Spec.Service
	port := int32(443)
	if ref.Port != nil {
		port = *ref.Port
	}
	tlsCfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: ref.Name + "." + ref.Namespace + ".svc",
	}
	if client != nil {
		tlsCfg.Certificates = []tls.Certificate{*client}
	}
	if s.Spec.InsecureSkipTLSVerify {
		tlsCfg.InsecureSkipVerify = true
	} else {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(s.Spec.CABundle)
		tlsCfg.RootCAs = pool
	}
	ns, name := ref.Namespace, ref.Name
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial.DialService(ctx, ns, name, port)
		},
		TLSClientConfig:       tlsCfg,
		TLSHandshakeTimeout:   10 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   16,
		ResponseHeaderTimeout: 0, // watches answer late and stream long
	}
	host := net.JoinHostPort(tlsCfg.ServerName, strconv.Itoa(int(port)))
	b := &backend{svc: s, transport: tr}
	b.proxy = &httputil.ReverseProxy{
		Transport:     tr,
		FlushInterval: -1, // watch events go out as they come
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "https"
			pr.Out.URL.Host = host
			pr.Out.Host = host
			u, _ := auth.UserFrom(pr.In.Context())
			setFrontProxyHeaders(pr.Out.Header, u)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeStatus(w, apierrors.NewServiceUnavailable("error trying to reach service: "+err.Error()))
		},
	}
	return b
}

// setFrontProxyHeaders replaces whatever the caller sent about identity
// with the hub's word for it: the authenticated user in X-Remote-*, no
// credentials and no impersonation.
func setFrontProxyHeaders(h http.Header, u *auth.User) {
	for k := range h {
		lk := strings.ToLower(k)
		if lk == "authorization" || strings.HasPrefix(lk, "impersonate-") || strings.HasPrefix(lk, "x-remote-") {
			delete(h, k)
		}
	}
	if u == nil {
		u = auth.AnonymousUser()
	}
	h.Set(headerUser, u.Name)
	if u.UID != "" {
		h.Set(headerUID, u.UID)
	}
	for _, g := range u.Groups {
		h.Add(headerGroup, g)
	}
	for k, vs := range u.Extra {
		for _, v := range vs {
			h.Add(headerExtraPrefix+url.PathEscape(k), v)
		}
	}
}

// proxyHandler serves requests for one APIService's group/version.
type proxyHandler struct {
	b         *backend
	available bool
}

func (p *proxyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.available {
		writeStatus(w, apierrors.NewServiceUnavailable("service unavailable"))
		return
	}
	p.b.proxy.ServeHTTP(w, r)
}

// writeStatus writes err as a metav1.Status in JSON.
func writeStatus(w http.ResponseWriter, err *apierrors.StatusError) {
	st := err.ErrStatus
	st.Kind, st.APIVersion = "Status", "v1"
	body, _ := json.Marshal(st)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(int(st.Code))
	_, _ = w.Write(body)
}

// probeDiscovery fetches the APIService's discovery document,
// /apis/<group>/<version>, as the aggregator itself (system:kube-aggregator
// in system:masters), and returns its body.
func (b *backend) probeDiscovery(ctx context.Context) ([]byte, error) {
	s := b.svc
	path := "/apis/" + s.Spec.Group + "/" + s.Spec.Version
	if s.Spec.Group == "" {
		path = "/api/" + s.Spec.Version
	}
	u := "https://" + b.proxyHost() + path
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("build discovery request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	setFrontProxyHeaders(req.Header, &auth.User{Name: "system:kube-aggregator", Groups: []string{"system:masters"}})
	resp, err := (&http.Client{Transport: b.transport, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}).Do(req)
	if err != nil {
		b.transport.CloseIdleConnections()
		return nil, fmt.Errorf("failing or missing response from %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < http.StatusOK || resp.StatusCode >= http.StatusMultipleChoices {
		return nil, fmt.Errorf("bad status from %s: %d", u, resp.StatusCode)
	}
	var buf strings.Builder
	if _, err := copyLimited(&buf, resp.Body, 4<<20); err != nil {
		return nil, fmt.Errorf("failing or missing response from %s: %w", u, err)
	}
	return []byte(buf.String()), nil
}

func (b *backend) proxyHost() string {
	ref := b.svc.Spec.Service
	port := int32(443)
	if ref.Port != nil {
		port = *ref.Port
	}
	return net.JoinHostPort(ref.Name+"."+ref.Namespace+".svc", strconv.Itoa(int(port)))
}
