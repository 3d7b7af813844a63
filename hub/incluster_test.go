package hub_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/join"
	"github.com/tether-edge/tether/tunnel"
)

// nodeIdentity is a node's credentials, obtained as an agent obtains them:
// a bootstrap token from `tether token create`, then a join.
type nodeIdentity struct {
	name             string
	cert, key, caPEM []byte
}

func joinNode(t *testing.T, h *hubtest.Hub, name string) *nodeIdentity {
	t.Helper()
	out, err := exec.Command(h.Bin, "token", "create", "--kubeconfig", h.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("tether token create: %v", err)
	}
	tok, err := join.ParseToken(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	key, err := join.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := join.NewCSR(key, name)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := join.Join(t.Context(), "https://"+h.Addr, tok, join.Request{Node: name, CSR: csr})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := join.MarshalKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &nodeIdentity{name: name, cert: resp.Certificate, key: keyPEM, caPEM: resp.CA}
}

func (n *nodeIdentity) roots(t *testing.T) *x509.CertPool {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(n.caPEM) {
		t.Fatal("no CA certificate")
	}
	return pool
}

// client is a client of the API port with the node's certificate.
func (n *nodeIdentity) client(t *testing.T, h *hubtest.Hub) *kubernetes.Clientset {
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: "https://" + h.Addr,
		TLSClientConfig: rest.TLSClientConfig{CAData: n.caPEM, CertData: n.cert, KeyData: n.key}})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// createPods creates service accounts and pods bound to nodes, as an
// admin: name -> {node, account}; it returns the pods' UIDs.
func createPods(t *testing.T, cs kubernetes.Interface, accounts []string, pods map[string][2]string) map[string]string {
	t.Helper()
	ctx := t.Context()
	for _, sa := range accounts {
		if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	uids := map[string]string{}
	for name, p := range pods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: p[0], ServiceAccountName: p[1],
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		out, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[name] = string(out.UID)
	}
	return uids
}

func boundTo(pod, uid string) *authenticationv1.TokenRequest {
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3607))}}
	if pod != "" {
		tr.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod, UID: types.UID(uid)}
	}
	return tr
}

// TestNodeRequestsPodTokens: a node gets a token of its pod's service
// account bound to that pod, and no token for another node's pod, an
// unbound one, or an account none of its pods uses.
func TestNodeRequestsPodTokens(t *testing.T) {
	h := hubtest.Start(t, "--disable-scheduler")
	admin := clientFor(t, h)
	uids := createPods(t, admin, []string{"robot", "other"}, map[string][2]string{
		"mine": {"n1", "robot"}, "theirs": {"n2", "robot"}, "elsewhere": {"n2", "other"}})
	node := joinNode(t, h, "n1").client(t, h)
	ctx := t.Context()

	var tr *authenticationv1.TokenRequest
	waitFor(t, "the node authorizer to learn of the pods", func() bool {
		var err error
		tr, err = node.CoreV1().ServiceAccounts("default").CreateToken(ctx, "robot", boundTo("mine", uids["mine"]), metav1.CreateOptions{})
		return err == nil
	})
	parts := strings.Split(tr.Status.Token, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q is not a JWT", tr.Status.Token)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Aud []string `json:"aud"`
		Sub string   `json:"sub"`
		Exp int64    `json:"exp"`
		Iat int64    `json:"iat"`
		K8s struct {
			Namespace      string            `json:"namespace"`
			Pod            map[string]string `json:"pod"`
			ServiceAccount map[string]string `json:"serviceaccount"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	if len(claims.Aud) != 1 || claims.Aud[0] != "https://kubernetes.default.svc.cluster.local" || claims.Sub != "system:serviceaccount:default:robot" ||
		claims.K8s.Namespace != "default" || claims.K8s.Pod["name"] != "mine" || claims.K8s.Pod["uid"] != uids["mine"] ||
		claims.K8s.ServiceAccount["name"] != "robot" || claims.Exp-claims.Iat != 3607 ||
		!tr.Status.ExpirationTimestamp.Time.Equal(time.Unix(claims.Exp, 0)) {
		t.Errorf("token claims %s, expiry %v", payload, tr.Status.ExpirationTimestamp)
	}

	for _, c := range []struct {
		name, sa string
		tr       *authenticationv1.TokenRequest
		want     string
	}{
		{"another node's pod", "robot", boundTo("theirs", uids["theirs"]), `serviceaccounts "robot" is forbidden: node requested token bound to a pod scheduled on a different node`},
		{"unbound", "robot", boundTo("", ""), `serviceaccounts "robot" is forbidden: node requested token not bound to a pod`},
		{"an account none of its pods uses", "other", boundTo("mine", uids["mine"]),
			`serviceaccounts "other" is forbidden: User "system:node:n1" cannot create resource "serviceaccounts/token" in API group "" in the namespace "default": no relationship found between node 'n1' and this object`},
	} {
		_, err := node.CoreV1().ServiceAccounts("default").CreateToken(ctx, c.sa, c.tr, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || err.Error() != c.want {
			t.Errorf("%s: %v, want 403 %q", c.name, err, c.want)
		}
	}
}

// TestRelayedPodConnections: a stream an edge opens that starts with a
// TLS handshake is a pod's connection to the kubernetes Service, relayed:
// the hub terminates its TLS as the API port does (valid for the Service's
// names and cluster IP, HTTP/2) and serves it with the pod's credentials,
// never the node's. Plain streams stay the node's own API requests.
func TestRelayedPodConnections(t *testing.T) {
	h := hubtest.Start(t, "--disable-scheduler")
	admin := clientFor(t, h)
	uids := createPods(t, admin, []string{"robot"}, map[string][2]string{"mine": {"n1", "robot"}, "theirs": {"n2", "robot"}})
	// The pod's ServiceAccount reads its namespace, as an operator would
	// let it under RBAC.
	mustKubectl(t, h, "create", "rolebinding", "robot-view", "-n", "default", "--clusterrole=view", "--serviceaccount=default:robot")
	id := joinNode(t, h, "n1")
	roots := id.roots(t)
	pair, err := tls.X509KeyPair(id.cert, id.key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tc, err := tunnel.NewClient(tunnel.ClientConfig{
		Addr:  h.Addr,
		TLS:   &tls.Config{ServerName: "127.0.0.1", RootCAs: roots, Certificates: []tls.Certificate{pair}},
		Hello: func() tunnel.Hello { return tunnel.Hello{Node: "n1"} },
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = tc.Run(ctx) }()
	if err := tc.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	var tr *authenticationv1.TokenRequest
	waitFor(t, "a token for the pod", func() bool {
		tr, err = id.client(t, h).CoreV1().ServiceAccounts("default").CreateToken(ctx, "robot", boundTo("mine", uids["mine"]), metav1.CreateOptions{})
		return err == nil
	})

	// What a pod's client-go does through the relay: TLS verified with
	// kube-root-ca.crt, by the Service's DNS name or its cluster IP.
	relayed := func(serverName string) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			ForceAttemptHTTP2: true,
			TLSClientConfig:   &tls.Config{ServerName: serverName, RootCAs: roots},
			DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				c, err := tc.DialContext(ctx, "tcp", "10.0.0.1:443")
				if err != nil {
					return nil, err
				}
				tlsConn := tls.Client(c, &tls.Config{ServerName: serverName, RootCAs: roots, NextProtos: []string{"h2", "http/1.1"}})
				if err := tlsConn.HandshakeContext(ctx); err != nil {
					c.Close()
					return nil, err
				}
				return tlsConn, nil
			},
		}}
	}
	get := func(c *http.Client, url, token string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	for _, name := range []string{"kubernetes.default.svc", "10.0.0.1"} {
		c := relayed(name)
		resp, body := get(c, "https://"+name+"/api/v1/namespaces/default/pods", tr.Status.Token)
		if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 || !strings.Contains(body, `"mine"`) {
			t.Errorf("relayed as %s with the pod's token: %s %s: %.200s", name, resp.Proto, resp.Status, body)
		}
		// RBAC decides for the pod's token: view does not read Secrets.
		if resp, body := get(c, "https://"+name+"/api/v1/namespaces/default/secrets", tr.Status.Token); resp.StatusCode != http.StatusForbidden {
			t.Errorf("relayed as %s, listing secrets with the pod's token: %s %.200s", name, resp.Status, body)
		}
		// Without credentials the relayed connection is nobody, least
		// of all the node that relayed it.
		if resp, body := get(c, "https://"+name+"/api/v1/namespaces/default/pods/mine", ""); resp.StatusCode == http.StatusOK {
			t.Errorf("relayed as %s without a token: %s %.200s", name, resp.Status, body)
		}
		c.CloseIdleConnections()
	}

	// Plain streams are the node's own requests, authorized as the node.
	plain := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: tc.DialContext}}
	if resp, body := get(plain, "http://hub/api/v1/namespaces/default/pods/mine", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("node's own pod over a plain stream: %s %.200s", resp.Status, body)
	}
	if resp, body := get(plain, "http://hub/api/v1/namespaces/default/pods/theirs", ""); resp.StatusCode != http.StatusForbidden ||
		!strings.Contains(body, `User \"system:node:n1\"`) {
		t.Errorf("another node's pod over a plain stream: %s %.200s", resp.Status, body)
	}

	metrics, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(metrics), "\ntether_tunnel_relayed_api_connections_total 2\n") {
		t.Errorf("metrics lack two relayed connections:\n%s", grepLines(string(metrics), "tether_tunnel_relayed"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
