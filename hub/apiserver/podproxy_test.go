package apiserver

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/auth"
)

// recordingAuthz allows everything and remembers what it was asked.
type recordingAuthz struct {
	mu   sync.Mutex
	last Attributes
}

func (a *recordingAuthz) Authorize(_ *auth.User, at Attributes) error {
	a.mu.Lock()
	a.last = at
	a.mu.Unlock()
	return nil
}

func TestPodAndServiceProxy(t *testing.T) {
	backend := func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/moved":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		default:
			body, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s %s?%s tls=%v auth=%q fwd-uri=%q body=%q", r.Method, r.URL.Path, r.URL.RawQuery,
				r.TLS != nil, r.Header.Get("Authorization"), r.Header.Get("X-Forwarded-Uri"), body)
		}
	}
	plain := httptest.NewServer(http.HandlerFunc(backend))
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(http.HandlerFunc(backend))
	t.Cleanup(secure.Close)
	// The pods' addresses, as reached from node n1; n2 has no tunnel.
	routes := map[string]string{
		"10.9.0.1:8080": plain.Listener.Addr().String(),
		"10.9.0.1:80":   plain.Listener.Addr().String(),
		"10.9.0.1:8443": secure.Listener.Addr().String(),
	}
	var mu sync.Mutex
	var dialed []string
	dial := func(ctx context.Context, node, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, node+"/"+addr)
		mu.Unlock()
		if node != "n1" {
			return nil, ErrNodeNotConnected
		}
		real, ok := routes[addr]
		if !ok {
			return nil, fmt.Errorf("dial tcp %s: connect: connection refused", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", real)
	}
	authz := &recordingAuthz{}
	h := newHubWith(t, func(c *Config) { c.DialPod = dial; c.Authorizer = authz })
	ctx := context.Background()
	pods := h.cs.CoreV1().Pods("default")
	mkPod := func(name, node, ip string, ports ...int32) {
		t.Helper()
		c := corev1.Container{Name: "app", Image: "img"}
		for _, p := range ports {
			c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: p})
		}
		p, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{c}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ip != "" {
			p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
			if _, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	mkPod("web", "n1", "10.9.0.1", 8080, 9090)
	mkPod("bare", "n1", "10.9.0.1")
	mkPod("far", "n2", "10.9.0.2", 80)
	mkPod("pending", "", "", 80)
	mkPod("closed", "n1", "10.9.0.3", 80)

	svcs := h.cs.CoreV1().Services("default")
	mkSvc := func(name string, ports ...corev1.ServicePort) {
		t.Helper()
		if _, err := svcs.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: ports}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkSvc("web", corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
		corev1.ServicePort{Name: "tls", Port: 443, TargetPort: intstr.FromInt32(8443)})
	mkSvc("empty", corev1.ServicePort{Port: 80})
	mkSvc("unready", corev1.ServicePort{Port: 80})
	podRef := func(name string) *corev1.ObjectReference {
		return &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: name}
	}
	slices := h.cs.DiscoveryV1().EndpointSlices("default")
	for _, sl := range []*discoveryv1.EndpointSlice{{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)},
			{Name: ptr.To("tls"), Port: ptr.To[int32](8443)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.9.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, TargetRef: podRef("web")},
			{Addresses: []string{"10.9.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}, TargetRef: podRef("web-old")},
		},
	}, {
		ObjectMeta:  metav1.ObjectMeta{Name: "unready-1", Labels: map[string]string{discoveryv1.LabelServiceName: "unready"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(""), Port: ptr.To[int32](80)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.9.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}, TargetRef: podRef("closed")},
		},
	}} {
		if _, err := slices.Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	type result struct {
		code   int
		body   string
		header http.Header
	}
	send := func(method, path, body string) result {
		t.Helper()
		req, err := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer good")
		client := h.srv.Client()
		client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return result{resp.StatusCode, string(b), resp.Header}
	}
	const ns = "/api/v1/namespaces/default"
	for _, c := range []struct {
		method, path string
		code         int
		want         string // a part of the body
		dialed       string // node/addr dialed, when one is
	}{
		// Pods, by name (first declared port), name:port and
		// https:name:port.
		{"GET", ns + "/pods/web/proxy/echo?x=1&y=2", 200,
			`GET /echo?x=1&y=2 tls=false auth="" fwd-uri="/api/v1/namespaces/default/pods/web/proxy/echo"`, "n1/10.9.0.1:8080"},
		{"GET", ns + "/pods/web:8080/proxy/a/b/", 200, `GET /a/b/? tls=false`, "n1/10.9.0.1:8080"},
		{"GET", ns + "/pods/https:web:8443/proxy/x", 200, `GET /x? tls=true`, "n1/10.9.0.1:8443"},
		{"GET", ns + "/pods/bare/proxy/", 200, `GET /? tls=false`, "n1/10.9.0.1:80"},
		{"POST", ns + "/pods/web/proxy/submit", 200, `POST /submit? tls=false auth="" fwd-uri="/api/v1/namespaces/default/pods/web/proxy/submit" body="payload"`, ""},
		{"PUT", ns + "/pods/web/proxy/p", 200, `PUT /p?`, ""},
		{"PATCH", ns + "/pods/web/proxy/p", 200, `PATCH /p?`, ""},
		{"DELETE", ns + "/pods/web/proxy/p", 200, `DELETE /p?`, ""},
		{"OPTIONS", ns + "/pods/web/proxy/p", 200, `OPTIONS /p?`, ""},
		{"HEAD", ns + "/pods/web/proxy/p", 200, ``, ""},
		// Errors.
		{"GET", ns + "/pods/nope/proxy/", 404, `pods \"nope\" not found`, ""},
		{"GET", ns + "/pods/pending/proxy/", 400, `address not allowed`, ""},
		{"GET", ns + "/pods/ftp:web:21/proxy/", 400, `invalid pod request \"ftp:web:21\"`, ""},
		{"GET", ns + "/pods/far/proxy/", 503, `error trying to reach service: node \"n2\" is not connected to the hub`, "n2/10.9.0.2:80"},
		{"GET", ns + "/pods/closed/proxy/", 503, `error trying to reach service: dial tcp 10.9.0.3:80: connect: connection refused`, ""},
		{"TRACE", ns + "/pods/web/proxy/", 405, ``, ""},
		// Services, by port name, port number and scheme.
		{"GET", ns + "/services/web:http/proxy/s", 200, `GET /s? tls=false`, "n1/10.9.0.1:8080"},
		{"GET", ns + "/services/web:80/proxy/s", 200, `fwd-uri="/api/v1/namespaces/default/services/web:80/proxy/s"`, "n1/10.9.0.1:8080"},
		{"GET", ns + "/services/https:web:443/proxy/s", 200, `GET /s? tls=true`, "n1/10.9.0.1:8443"},
		{"GET", ns + "/services/https:web:tls/proxy/s", 200, `GET /s? tls=true`, "n1/10.9.0.1:8443"},
		{"GET", ns + "/services/nope:80/proxy/", 404, `services \"nope\" not found`, ""},
		{"GET", ns + "/services/web:81/proxy/", 503, `no service port 81 found for service \"web\"`, ""},
		{"GET", ns + "/services/web:other/proxy/", 503, `no endpoints available for service \"web:other\"`, ""},
		{"GET", ns + "/services/empty/proxy/", 503, `no endpoints available for service \"empty\"`, ""},
		{"GET", ns + "/services/unready:80/proxy/", 503, `no endpoints available for service \"unready\"`, ""},
	} {
		mu.Lock()
		dialed = nil
		mu.Unlock()
		body := ""
		if c.method == "POST" {
			body = "payload"
		}
		res := send(c.method, c.path, body)
		if res.code != c.code || !strings.Contains(res.body, c.want) {
			t.Errorf("%s %s: %d %s, want %d with %s", c.method, c.path, res.code, res.body, c.code, c.want)
		}
		mu.Lock()
		if c.dialed != "" && (len(dialed) != 1 || dialed[0] != c.dialed) {
			t.Errorf("%s %s dialed %v, want %s", c.method, c.path, dialed, c.dialed)
		}
		mu.Unlock()
	}

	// An empty path redirects to "/", and a redirect of the pod's own
	// comes back pointing through the proxy.
	if res := send("GET", ns+"/pods/web/proxy?a=b", ""); res.code != http.StatusMovedPermanently ||
		res.header.Get("Location") != ns+"/pods/web/proxy/?a=b" {
		t.Errorf("GET pods/web/proxy: %d Location %q", res.code, res.header.Get("Location"))
	}
	if res := send("GET", ns+"/services/web:http/proxy/moved", ""); res.code != http.StatusFound ||
		res.header.Get("Location") != ns+"/services/web:http/proxy/elsewhere" {
		t.Errorf("a redirect through services/web:http/proxy: %d Location %q", res.code, res.header.Get("Location"))
	}

	// Authorization sees the proxy subresource with the method's verb.
	for method, verb := range map[string]string{"GET": "get", "POST": "create", "PUT": "update", "DELETE": "delete", "OPTIONS": "options"} {
		send(method, ns+"/services/web:80/proxy/a", "")
		authz.mu.Lock()
		at := authz.last
		authz.mu.Unlock()
		if at.Verb != verb || at.Kind != "services" || at.Subresource != "proxy" || at.Name != "web:80" || at.Namespace != "default" {
			t.Errorf("%s services/web:80/proxy authorized as %+v", method, at)
		}
	}
}
