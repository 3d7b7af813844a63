// Package streaming is the node server: the HTTP handler the hub reaches
// through streams it opens on the tunnel when it proxies a node's
// endpoints, pods' logs, exec, attach and port-forward. Nothing listens on
// the node's network: the server's [Listener] is fed in-memory
// connections.
//
// Vocabulary:
//   - node server: the handler [NewServer] returns; it authenticates
//     nothing, because only the hub can open streams to it.
//   - [Runtime]: what the server asks of the node's container runtime
//     (container logs and the [Streamer]); edge.Runtime includes it.
//   - session: one exec or attach, SPDY streams upgraded from one request
//     (stdin, stdout, stderr, error, resize), or one port-forward
//     connection of data and error streams paired by request ID.
//   - [Streams]: a session's standard streams as the runtime sees them.
//   - [LogOptions]: the pods/log query parameters, parsed.
package streaming

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Config configures the node server.
type Config struct {
	// Runtime serves container logs, exec, attach and port-forward.
	// Required.
	Runtime Runtime
	// Pods returns the pods the node runs. Required.
	Pods func() []*corev1.Pod
	// Metrics serves /metrics, the agent's own metrics. Nil: not found.
	Metrics http.Handler
	// Resource and Cadvisor serve /metrics/resource and
	// /metrics/cadvisor, the usage of the node and its containers in
	// the kubelet's and cAdvisor's names. Nil: not found.
	Resource, Cadvisor http.Handler
	// ResendStatus asks the agent to write its node status again now,
	// whatever it last wrote. Nil: not found.
	ResendStatus func()
	// Logger receives request errors. Nil means slog.Default().
	Logger *slog.Logger
}

// NewServer returns the node server's handler: what the hub reaches
// through the tunnel when it proxies /api/v1/nodes/<node>/proxy/... and
// pods/log. It serves
//
//	GET /healthz                                  "ok"
//	GET /metrics                                  the agent's metrics, Prometheus text
//	GET /metrics/resource, /metrics/cadvisor      the node's usage, Prometheus text
//	GET /pods                                     a PodList of the node's pods
//	GET /containerLogs/{namespace}/{pod}/{container}
//	    ?follow=&tailLines=&limitBytes=&sinceSeconds=&sinceTime=&timestamps=&previous=
//	GET|POST /exec/{namespace}/{pod}/{container}?command=...&stdin=&stdout=&stderr=&tty=
//	GET|POST /attach/{namespace}/{pod}/{container}?stdin=&stdout=&stderr=&tty=
//	GET|POST /portForward/{namespace}/{pod}
//	POST /status/resend                           204; the node status is written again
//
// The exec, attach and port-forward paths upgrade to SPDY (see
// streaming.go). The hub posts /status/resend when the Node's Ready
// condition turns Unknown while the node's tunnel is up: the node then
// says at once that it is alive instead of at its next periodic report.
//
// It does no authentication of its own: only the hub can open streams to
// it, over the tunnel's mutually authenticated connection.
func NewServer(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &nodeServer{cfg: cfg}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok")
	})
	for path, h := range map[string]http.Handler{"/metrics": cfg.Metrics, "/metrics/resource": cfg.Resource, "/metrics/cadvisor": cfg.Cadvisor} {
		if h != nil {
			mux.Handle("GET "+path, h)
		}
	}
	mux.HandleFunc("GET /pods", s.pods)
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", s.logs)
	for _, m := range []string{"GET", "POST"} {
		mux.HandleFunc(m+" /exec/{namespace}/{pod}/{container}", s.exec)
		mux.HandleFunc(m+" /attach/{namespace}/{pod}/{container}", s.attach)
		mux.HandleFunc(m+" /portForward/{namespace}/{pod}", s.portForward)
	}
	if cfg.ResendStatus != nil {
		mux.HandleFunc("POST /status/resend", func(w http.ResponseWriter, _ *http.Request) {
			cfg.ResendStatus()
			w.WriteHeader(http.StatusNoContent)
		})
	}
	return mux
}

type nodeServer struct {
	cfg Config
}

func (s *nodeServer) pods(w http.ResponseWriter, _ *http.Request) {
	list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
	for _, p := range s.cfg.Pods() {
		p = p.DeepCopy()
		p.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
		list.Items = append(list.Items, *p)
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&list); err != nil {
		s.cfg.Logger.Debug("write pod list", "err", err)
	}
}

// logOptions parses the pods/log query parameters as the API defines them.
func logOptions(r *http.Request) (LogOptions, error) {
	q := r.URL.Query()
	opts := LogOptions{TailLines: -1}
	var err error
	boolean := func(name string, dst *bool) {
		if v := q.Get(name); v != "" && err == nil {
			b, perr := strconv.ParseBool(v)
			if perr != nil {
				err = fmt.Errorf("%s: %q is not a boolean", name, v)
			}
			*dst = b
		}
	}
	integer := func(name string, minimum int64, dst *int64) bool {
		v := q.Get(name)
		if v == "" || err != nil {
			return false
		}
		n, perr := strconv.ParseInt(v, 10, 64)
		if perr != nil || n < minimum {
			err = fmt.Errorf("%s: %q must be an integer of at least %d", name, v, minimum)
			return false
		}
		*dst = n
		return true
	}
	boolean("follow", &opts.Follow)
	boolean("timestamps", &opts.Timestamps)
	boolean("previous", &opts.Previous)
	integer("tailLines", 0, &opts.TailLines)
	integer("limitBytes", 1, &opts.LimitBytes)
	var since int64
	if integer("sinceSeconds", 1, &since) {
		opts.Since = time.Now().Add(-time.Duration(since) * time.Second)
	}
	if v := q.Get("sinceTime"); v != "" && err == nil {
		if since != 0 {
			return opts, errors.New("sinceSeconds and sinceTime are mutually exclusive")
		}
		t, perr := time.Parse(time.RFC3339, v)
		if perr != nil {
			return opts, fmt.Errorf("sinceTime: %q is not an RFC 3339 time", v)
		}
		opts.Since = t
	}
	return opts, err
}

func (s *nodeServer) logs(w http.ResponseWriter, r *http.Request) {
	ns, name, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	opts, err := logOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var pod *corev1.Pod
	for _, p := range s.cfg.Pods() {
		if p.Namespace == ns && p.Name == name {
			pod = p
		}
	}
	if pod == nil {
		http.Error(w, fmt.Sprintf("pod %s/%s is not on this node", ns, name), http.StatusNotFound)
		return
	}
	// Nothing is written before the runtime found the container, so
	// errors still get their status code.
	out := &lazyWriter{w: w, flush: opts.Follow}
	err = s.cfg.Runtime.ContainerLogs(r.Context(), pod.UID, container, opts, out)
	if err == nil {
		out.start()
		return
	}
	if out.started {
		s.cfg.Logger.Debug("container log stream ended", "pod", ns+"/"+name, "container", container, "err", err)
		return
	}
	switch {
	case errors.Is(err, ErrPodNotFound), errors.Is(err, ErrContainerNotFound):
		http.Error(w, err.Error(), http.StatusNotFound)
	case errors.Is(err, ErrContainerWaiting):
		http.Error(w, err.Error(), http.StatusBadRequest)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// lazyWriter sends the response header with the first bytes, and flushes
// every write of a followed log so that lines reach the client as they are
// written.
type lazyWriter struct {
	w       http.ResponseWriter
	flush   bool
	started bool
}

func (l *lazyWriter) start() {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		l.w.WriteHeader(http.StatusOK)
		if l.flush {
			http.NewResponseController(l.w).Flush()
		}
	}
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	l.start()
	n, err := l.w.Write(p)
	if err == nil && l.flush {
		err = http.NewResponseController(l.w).Flush()
	}
	return n, err
}
