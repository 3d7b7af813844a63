// Package apiserver is the HTTP layer of the hub's Kubernetes API: it
// authenticates and authorizes requests, routes them to resources described
// by hub/registry, negotiates content types with apimachinery's codecs,
// decodes bodies, query parameters and patches, calls hub/storage, and
// writes objects, server-side tables, watch streams and metav1.Status errors
// the way an upstream API server does, so that unmodified kubectl and
// client-go work against it.
package apiserver

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apiserver/pkg/warning"

	"github.com/tether-edge/tether/hub/audit"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/servicedial"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/internal/fleetapi"
)

// Authorizer decides whether an authenticated user may perform a request.
type Authorizer interface {
	// Authorize returns nil to allow the request, or an error (usually a
	// Forbidden apierrors.APIStatus, such as *apierrors.StatusError) to
	// deny it.
	Authorize(u *auth.User, a Attributes) error
}

// Attributes describe a request for authorization.
type Attributes struct {
	// Verb is get, list, watch, create, update, patch, delete or
	// deletecollection for resource requests; the lower-case HTTP method
	// for others.
	Verb        string
	Resource    bool
	Group       string
	Version     string
	Kind        string
	Namespace   string
	Name        string
	Subresource string
	// Path is the request path (used for non-resource requests).
	Path string
	// LabelSelector and FieldSelector are the raw selectors of list,
	// watch and deletecollection requests.
	LabelSelector, FieldSelector string
}

// CreateAuthorizer is implemented by Authorizers that also decide on the
// object of a create, whose name only the body carries.
type CreateAuthorizer interface {
	AuthorizeCreate(u *auth.User, a Attributes, obj runtime.Object) error
}

// Config configures a Server.
type Config struct {
	// Storage performs every object operation. Required.
	Storage storage.API
	// Kinds are the served resources. Required unless Registry is set.
	Kinds []*registry.Kind
	// Registry, when set, is the source of the served resources instead
	// of Kinds: each request is routed by the registry's current kinds,
	// so resources it adds or removes (custom resources) are served or
	// gone at once.
	Registry *registry.Registry
	// Authenticator identifies users; requests without credentials (and
	// every request when it is nil) are user system:anonymous in group
	// system:unauthenticated, which the Authorizer decides on like any
	// other. Invalid credentials are 401.
	Authenticator auth.Authenticator
	// Authorizer decides what users may do; nil is AllowAuthenticated.
	Authorizer Authorizer
	// Discovery serves /api, /api/v1, /apis, /apis/<g> and /apis/<g>/<v>;
	// nil answers 404 there.
	Discovery http.Handler
	// OpenAPI serves /openapi/v2 and /openapi/v3[/...]; nil answers 404.
	OpenAPI http.Handler
	// Version is served at /version.
	Version version.Info
	// MaxRequestBytes caps request bodies; zero means 3 MiB.
	MaxRequestBytes int64
	// Logger receives request logs at debug level and panics at error
	// level; nil means slog.Default().
	Logger *slog.Logger
	// ReadyChecks are extra named checks for /readyz; each returns nil
	// when ready. Nil means only the built-in ping check.
	ReadyChecks map[string]func() error
	// Metrics is the registry /metrics serves; the server adds its request
	// counter and latency histogram to it. Nil means a registry of the
	// server's own.
	Metrics *prometheus.Registry
	// Fleet, when set, serves the fleet page under /fleet/ to users
	// allowed to list nodes.
	Fleet http.Handler
	// Releases, when set, serves the release store at
	// fleetapi.ImportPath and below (imports and downloads): non-resource
	// requests, authorized by path and the lower-cased method as verb
	// ("post" to import, "get" to download), as every other path.
	Releases http.Handler
	// Profiling serves the Go runtime's profiles under /debug/pprof/ to
	// authorized users, as kube-apiserver's --profiling does.
	Profiling bool
	// ServiceAccountTokens signs tokens for serviceaccounts/token; nil
	// leaves that subresource unserved.
	ServiceAccountTokens *auth.ServiceAccountTokens
	// DialNode reaches node agents for nodes/proxy, pods/log, pods/exec,
	// pods/attach and pods/portforward; nil answers 503 there.
	DialNode NodeDialer
	// DialPod reaches pods' addresses through their nodes for pods/proxy
	// and services/proxy; nil answers 503 there.
	DialPod PodDialer
	// Audit, when set, receives an audit event per request stage its
	// policy logs (see hub/audit).
	Audit *audit.Log
	// Extensions serve tether's own endpoints, keyed by exact path (e.g.
	// the node join exchanges under /tether/). They run with the
	// authenticated user in the request context when the request carries
	// valid credentials, and without one otherwise: each decides itself.
	Extensions map[string]http.Handler
	// Aggregated, when set, routes group/versions registered by
	// service-backed APIServices to their servers; nil serves none.
	Aggregated Aggregated
}

// Server serves the Kubernetes API over HTTP.
type Server struct {
	cfg            Config
	log            *slog.Logger
	scheme         *runtime.Scheme
	codecs         serializer.CodecFactory
	kinds          routeTable // when Config.Registry is nil
	routes         routes     // when it is set
	authz          Authorizer
	metrics        *requestMetrics
	metricsHandler http.Handler // /metrics
	maxBody        int64
	frames         frameCache
	workers        *workers
	// eventBufs holds the buffers watches encode events in, between
	// events: a fleet's thousands of watches each kept two, grown to
	// the largest event they had encoded.
	eventBufs sync.Pool
	// services reaches Services' endpoints for services/proxy.
	services *servicedial.Dialer
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Storage == nil {
		return nil, errors.New("create apiserver: no storage")
	}
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		authz:   cfg.Authorizer,
		maxBody: cfg.MaxRequestBytes,
		workers: newWorkers(),
	}
	s.services = &servicedial.Dialer{Storage: cfg.Storage, DialPod: cfg.DialPod}
	reg := cfg.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	var err error
	if s.metrics, err = newRequestMetrics(reg); err != nil {
		return nil, fmt.Errorf("create apiserver: %w", err)
	}
	s.metricsHandler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.authz == nil {
		s.authz = AllowAuthenticated{}
	}
	if s.maxBody <= 0 {
		s.maxBody = 3 << 20
	}
	if s.scheme, err = registry.NewScheme(); err != nil {
		return nil, err
	}
	if err := metav1.AddMetaToScheme(s.scheme); err != nil {
		return nil, fmt.Errorf("build scheme: %w", err)
	}
	if err := metav1beta1.AddMetaToScheme(s.scheme); err != nil {
		return nil, fmt.Errorf("build scheme: %w", err)
	}
	// Upstream accepts DeleteOptions (and the other options) under the
	// meta.k8s.io/v1 group as well as under every served group version.
	s.scheme.AddKnownTypes(metav1.SchemeGroupVersion, &metav1.ListOptions{}, &metav1.GetOptions{},
		&metav1.DeleteOptions{}, &metav1.CreateOptions{}, &metav1.UpdateOptions{}, &metav1.PatchOptions{})
	s.codecs = serializer.NewCodecFactory(s.scheme, serializer.EnableStrict)
	kinds := cfg.Kinds
	if cfg.Registry != nil {
		kinds = cfg.Registry.Kinds()
	}
	if err := s.checkTypes(append(slices.Clone(kinds), registry.ReviewKinds()...)); err != nil {
		return nil, err
	}
	if cfg.Registry == nil {
		s.kinds = newRouteTable(kinds)
	}
	return s, nil
}

// Handler returns the HTTP handler serving the whole API.
func (s *Server) Handler() http.Handler {
	return s.withAudit(http.HandlerFunc(s.serve))
}

type ctxWriter struct {
	http.ResponseWriter
	code    int
	written bool
}

func (w *ctxWriter) WriteHeader(code int) {
	if !w.written {
		w.code = code
		w.written = true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *ctxWriter) Write(b []byte) (int, error) {
	if !w.written {
		w.code = http.StatusOK
		w.written = true
	}
	return w.ResponseWriter.Write(b)
}

func (w *ctxWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *ctxWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// request carries what the pipeline learned about one request.
type request struct {
	id    string
	attrs Attributes
	kind  *registry.Kind
}

func newRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) serve(rw http.ResponseWriter, r *http.Request) {
	start := time.Now()
	w := &ctxWriter{ResponseWriter: rw}
	req := &request{id: requestID(r)}
	w.Header().Set("Audit-Id", req.id)
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			stack := debug.Stack()
			if wp, ok := p.(*workerPanic); ok {
				p, stack = wp.value, wp.stack
			}
			s.log.Error("apiserver: panic serving request", "request_id", req.id, "method", r.Method, "path", r.URL.Path, "panic", p, "stack", string(stack))
			if !w.written {
				s.writeError(w, apierrors.NewInternalError(fmt.Errorf("panic: %v", p)))
			}
		}
		code := w.code
		if code == 0 {
			code = http.StatusOK
		}
		verb := req.attrs.Verb
		if verb == "" {
			verb = strings.ToLower(r.Method)
		}
		res := req.attrs.Kind
		if req.attrs.Subresource != "" {
			res += "/" + req.attrs.Subresource
		}
		if verb != "watch" {
			s.metrics.observe(verb, res, code, time.Since(start))
		} else {
			s.metrics.observe(verb, res, code, 0)
		}
		s.log.Debug("apiserver: request", "request_id", req.id, "method", r.Method, "path", r.URL.Path, "query", r.URL.RawQuery, "code", code, "duration", time.Since(start), "user_agent", r.UserAgent())
	}()

	path := strings.TrimSuffix(r.URL.Path, "/")
	if path == "" {
		path = "/"
	}
	if h := s.cfg.Extensions[path]; h != nil {
		req.attrs = Attributes{Verb: strings.ToLower(r.Method), Path: path}
		if u, err := s.authenticate(r); err == nil && u != nil {
			r = r.WithContext(auth.WithUser(r.Context(), u))
		}
		h.ServeHTTP(w, r)
		return
	}
	u, err := s.authenticate(r)
	if err == nil && u == nil {
		u = auth.AnonymousUser()
	}
	auditAuthenticated(r, u)
	if err != nil {
		s.writeError(w, err)
		return
	}
	if u, err = s.impersonate(r, u); err != nil {
		s.writeError(w, err)
		return
	}
	r = r.WithContext(warning.WithWarningRecorder(auth.WithUser(r.Context(), u), &warningHeaders{w: w}))

	if strings.HasPrefix(path, "/api/") || strings.HasPrefix(path, "/apis/") {
		segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
		if segs[0] == "api" && len(segs) > 2 || segs[0] == "apis" && len(segs) > 3 {
			if s.serveAggregated(w, r, req, u, segs) {
				return
			}
			if pooled(r) {
				s.workers.run(func() { s.serveResource(w, r, req, u, segs) })
				return
			}
			s.serveResource(w, r, req, u, segs)
			return
		}
	}
	if s.cfg.Releases != nil && (path == fleetapi.ImportPath || strings.HasPrefix(path, fleetapi.ImportPath+"/")) {
		req.attrs = Attributes{Verb: strings.ToLower(r.Method), Path: path}
		if err := s.authorize(r, u, req.attrs); err != nil {
			s.writeError(w, toStatus(err))
			return
		}
		s.cfg.Releases.ServeHTTP(w, r)
		return
	}
	if s.cfg.Fleet != nil && (path == "/fleet" || strings.HasPrefix(path, "/fleet/")) {
		// The fleet page shows nodes: whoever may list them may see it.
		req.attrs = Attributes{Verb: "list", Resource: true, Version: "v1", Kind: "nodes"}
		if err := s.authorize(r, u, req.attrs); err != nil {
			s.writeError(w, toStatus(err))
			return
		}
		s.cfg.Fleet.ServeHTTP(w, r)
		return
	}
	req.attrs = Attributes{Verb: strings.ToLower(r.Method), Path: path}
	if err := s.authorize(r, u, req.attrs); err != nil {
		s.writeError(w, toStatus(err))
		return
	}
	s.serveNonResource(w, r, path)
}

// authenticate returns the user behind r's credentials, nil when it
// carries none, or a 401 when they are invalid.
func (s *Server) authenticate(r *http.Request) (*auth.User, error) {
	if u := localUser(r.Context()); u != nil {
		return u, nil
	}
	if s.cfg.Authenticator == nil {
		return nil, nil
	}
	u, ok, err := s.cfg.Authenticator.Authenticate(r)
	if err != nil {
		s.log.Debug("apiserver: authentication failed", "error", err)
		return nil, apierrors.NewUnauthorized("Unauthorized")
	}
	if !ok || u == nil {
		// A bearer token nobody accepts is invalid, not absent, as
		// upstream's bearer token authenticator decides.
		if scheme, tok, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " "); strings.EqualFold(scheme, "bearer") && strings.TrimSpace(tok) != "" {
			return nil, apierrors.NewUnauthorized("Unauthorized")
		}
		return nil, nil
	}
	return u, nil
}

func (s *Server) serveNonResource(w http.ResponseWriter, r *http.Request, path string) {
	switch {
	case path == "/api" || path == "/apis" || path == "/api/v1" ||
		strings.HasPrefix(path, "/apis/") && strings.Count(path, "/") <= 3:
		if s.cfg.Discovery == nil {
			s.writeError(w, notFoundPath())
			return
		}
		s.cfg.Discovery.ServeHTTP(w, r)
	case path == "/openapi/v2" || path == "/openapi/v3" || strings.HasPrefix(path, "/openapi/v3/"):
		if s.cfg.OpenAPI == nil {
			s.writeError(w, notFoundPath())
			return
		}
		s.cfg.OpenAPI.ServeHTTP(w, r)
	case path == "/version":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.writeError(w, apierrors.NewMethodNotSupported(schema.GroupResource{}, r.Method))
			return
		}
		s.writeRawJSON(w, http.StatusOK, s.cfg.Version)
	case path == "/healthz" || path == "/livez" || path == "/readyz" ||
		strings.HasPrefix(path, "/healthz/") || strings.HasPrefix(path, "/livez/") || strings.HasPrefix(path, "/readyz/"):
		s.serveHealth(w, r, path)
	case s.cfg.Profiling && (path == "/debug/pprof" || strings.HasPrefix(path, "/debug/pprof/")):
		servePprof(w, r, path)
	case path == "/metrics":
		s.metricsHandler.ServeHTTP(w, r)
	default:
		s.writeError(w, notFoundPath())
	}
}

func notFoundPath() error {
	return statusErr(http.StatusNotFound, "the server could not find the requested resource")
}

func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request, path string) {
	base, check, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	checks := map[string]func() error{"ping": func() error { return nil }}
	if base == "readyz" {
		for n, c := range s.cfg.ReadyChecks {
			checks[n] = c
		}
	}
	names := make([]string, 0, len(checks))
	for n := range checks {
		names = append(names, n)
	}
	sort.Strings(names)
	if check != "" {
		c, ok := checks[check]
		if !ok {
			s.writeError(w, notFoundPath())
			return
		}
		names, checks = []string{check}, map[string]func() error{check: c}
	}
	var b strings.Builder
	failed := false
	for _, n := range names {
		if err := checks[n](); err != nil {
			failed = true
			fmt.Fprintf(&b, "[-]%s failed: reason withheld\n", n)
			s.log.Info("apiserver: health check failed", "check", n, "error", err)
		} else {
			fmt.Fprintf(&b, "[+]%s ok\n", n)
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if failed {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "%s%s check failed\n", b.String(), base)
		return
	}
	w.WriteHeader(http.StatusOK)
	if _, verbose := r.URL.Query()["verbose"]; verbose {
		fmt.Fprintf(w, "%s%s check passed\n", b.String(), base)
		return
	}
	fmt.Fprint(w, "ok")
}
