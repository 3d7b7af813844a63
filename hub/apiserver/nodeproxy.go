package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// ErrNodeNotConnected is what a NodeDialer returns for a node that has no
// tunnel to the hub right now.
var ErrNodeNotConnected = errors.New("node is not connected")

// NodeDialer opens a connection to a node agent's own HTTP server (the
// kubelet's equivalent), normally a stream through the node's tunnel.
type NodeDialer func(ctx context.Context, node string) (net.Conn, error)

// nodeHTTPPath maps a subresource to the path of the agent's node server,
// which uses the kubelet's layout.
var podStreamPaths = map[string]string{
	"log":         "/containerLogs",
	"exec":        "/exec",
	"attach":      "/attach",
	"portforward": "/portForward",
}

// proxyToNode forwards r to path on node's agent server. Upgrades (exec,
// attach and port-forward use SPDY or WebSocket) pass through: the reverse
// proxy splices the two connections after the 101 answer.
func (s *Server) proxyToNode(w http.ResponseWriter, r *http.Request, node, path string, query url.Values) {
	if s.cfg.DialNode == nil {
		s.writeError(w, statusErr(http.StatusServiceUnavailable, fmt.Sprintf("no tunnel server: node %q cannot be reached", node)))
		return
	}
	// Dial before proxying so that a node without a tunnel gets a clear
	// Status instead of a bare 502.
	conn, err := s.cfg.DialNode(r.Context(), node)
	if err != nil {
		if errors.Is(err, ErrNodeNotConnected) {
			s.writeError(w, statusErr(http.StatusServiceUnavailable, fmt.Sprintf("node %q is not connected to the hub", node)))
			return
		}
		s.writeError(w, statusErr(http.StatusBadGateway, fmt.Sprintf("dial node %q: %v", node, err)))
		return
	}
	used := false
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if !used {
				used = true
				return &agentConn{Conn: conn}, nil
			}
			c, err := s.cfg.DialNode(ctx, node)
			if err != nil {
				return nil, err
			}
			return &agentConn{Conn: c}, nil
		},
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: 60 * time.Second,
	}
	defer transport.CloseIdleConnections()
	target := &url.URL{Scheme: "http", Host: node, Path: path, RawQuery: query.Encode()}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = target
			pr.Out.Host = node
			// The node server trusts the tunnel, not credentials meant
			// for the hub.
			pr.Out.Header.Del("Authorization")
		},
		Transport:     transport,
		FlushInterval: -1, // logs and streams go out as they come
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			s.writeError(w, statusErr(http.StatusBadGateway, fmt.Sprintf("proxy to node %q: %v", node, err)))
		},
	}
	defer func() {
		if !used {
			conn.Close()
		}
	}()
	proxy.ServeHTTP(w, r)
}

// nodeProxy serves /api/v1/nodes/<name>/proxy/<path>.
func (s *Server) nodeProxy(w http.ResponseWriter, r *http.Request, t target) {
	if _, err := s.cfg.Storage.Get(r.Context(), t.kind, "", t.name); err != nil {
		s.writeError(w, err)
		return
	}
	path := t.proxyPath
	if path == "" {
		path = "/"
	}
	s.proxyToNode(w, r, t.name, path, r.URL.Query())
}

// podStream serves pods/log, pods/exec, pods/attach and pods/portforward by
// handing them to the agent of the pod's node, as the API server hands them
// to the kubelet.
func (s *Server) podStream(w http.ResponseWriter, r *http.Request, t target) {
	obj, err := s.cfg.Storage.Get(r.Context(), t.kind, t.namespace, t.name)
	if err != nil {
		s.writeError(w, err)
		return
	}
	pod := obj.(*corev1.Pod)
	if pod.Spec.NodeName == "" {
		s.writeError(w, apierrors.NewBadRequest(fmt.Sprintf("pod %s does not have a host assigned", pod.Name)))
		return
	}
	q := r.URL.Query()
	base := podStreamPaths[t.subresource]
	path := base + "/" + pod.Namespace + "/" + pod.Name
	if t.subresource != "portforward" {
		container, err := pickContainer(pod, q.Get("container"))
		if err != nil {
			s.writeError(w, err)
			return
		}
		path += "/" + container
		q.Del("container")
	}
	r = r.WithContext(bulkStream(r.Context(), t.subresource, q))
	s.proxyToNode(w, r, pod.Spec.NodeName, path, q)
}

// pickContainer returns the container a log, exec or attach request is
// for, with upstream's messages when it is missing or unknown.
func pickContainer(pod *corev1.Pod, name string) (string, error) {
	var names []string
	for _, c := range pod.Spec.InitContainers {
		names = append(names, c.Name)
	}
	for _, c := range pod.Spec.Containers {
		names = append(names, c.Name)
	}
	for _, c := range pod.Spec.EphemeralContainers {
		names = append(names, c.Name)
	}
	if name == "" {
		if len(pod.Spec.Containers) == 1 {
			return pod.Spec.Containers[0].Name, nil
		}
		return "", apierrors.NewBadRequest(fmt.Sprintf("a container name must be specified for pod %s, choose one of: [%s]", pod.Name, strings.Join(names, " ")))
	}
	for _, n := range names {
		if n == name {
			return name, nil
		}
	}
	return "", apierrors.NewBadRequest(fmt.Sprintf("container %s is not valid for pod %s", name, pod.Name))
}

// agentConn is a connection to a node agent that keeps relaying what the
// agent sends after the agent stopped reading. An agent ends an exec or
// attach by writing its status and closing its end of the stream, after
// which writes to it fail; the upgrade proxy ends a session as soon as
// either direction fails, and would close the client's connection with the
// status still unread (kubectl's attach then "succeeds" with no output).
// So once a write fails, this and later writes are dropped and reported
// done: the agent reads nothing more either way, and the proxy ends the
// session when the agent's side reaches its end.
type agentConn struct {
	net.Conn
	writeFailed atomic.Bool
}

func (c *agentConn) Write(p []byte) (int, error) {
	if c.writeFailed.Load() {
		return len(p), nil
	}
	if _, err := c.Conn.Write(p); err != nil {
		c.writeFailed.Store(true)
	}
	return len(p), nil
}
