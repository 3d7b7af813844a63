package edge

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// apiCounters count the agent's requests to the hub by kind. LISTs are the
// expensive ones; a reconnect must not add any.
type apiCounters struct {
	lists, watches, gets, writes, failures atomic.Int64
}

// countingTransport classifies every request before it leaves.
type countingTransport struct {
	next http.RoundTripper
	c    *apiCounters
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch {
	case req.Method != http.MethodGet:
		t.c.writes.Add(1)
	case isWatch(req):
		t.c.watches.Add(1)
	case isCollection(req.URL.Path):
		t.c.lists.Add(1)
	default:
		t.c.gets.Add(1)
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode >= 500 {
		t.c.failures.Add(1)
	}
	return resp, err
}

func isWatch(req *http.Request) bool {
	w := req.URL.Query().Get("watch")
	return w == "true" || w == "1"
}

// isCollection reports whether an API path names a collection
// (/api/v1/pods, /api/v1/namespaces/ns/pods) rather than an object.
func isCollection(path string) bool {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return false
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	return len(parts) == 1
}

// restConfig returns a client configuration whose requests go through dial
// (the tunnel). The hub knows the node from the tunnel's client
// certificate, so requests carry no credentials of their own.
//
// Requests travel as HTTP/2 over one tunnel stream, as a kubelet's do over
// one connection to its API server: the agent's watches and calls share
// it instead of holding a stream, an HTTP/1.1 connection and its buffers
// each on the hub, which with thousands of nodes was the larger part of
// what a node costs there. The hub must be as new as its edges (it serves
// HTTP/1.1 and HTTP/2 alike). No HTTP/2 pings: the tunnel has its own
// liveness, and an idle node's uplink carries none of them.
func restConfig(dial func(ctx context.Context, network, addr string) (net.Conn, error), version string, c *apiCounters) *rest.Config {
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	return &rest.Config{
		Host: "http://hub",
		Transport: &http.Transport{
			DialContext: dial,
			Protocols:   &protocols,
			// client-go's default for its own transports.
			IdleConnTimeout: 90 * time.Second,
		},
		// Short: it is sent with every request on a thin uplink.
		UserAgent: "tether-edge/" + version,
		ContentConfig: rest.ContentConfig{
			AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json",
			ContentType:        "application/vnd.kubernetes.protobuf",
		},
		// The kubelet's defaults (--kube-api-qps, --kube-api-burst): a
		// node starting a hundred pods reports them without waiting.
		QPS:   50,
		Burst: 100,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			return &countingTransport{next: rt, c: c}
		},
	}
}
