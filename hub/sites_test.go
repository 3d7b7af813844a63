package hub_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/sitedigest"
	"github.com/tether-edge/tether/tunnel"
)

// connectTunnel runs a tunnel client with the node's credentials until
// the test ends.
func connectTunnel(t *testing.T, h *hubtest.Hub, id *nodeIdentity) *tunnel.Client {
	t.Helper()
	pair, err := tls.X509KeyPair(id.cert, id.key)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tunnel.NewClient(tunnel.ClientConfig{
		Addr:  h.Addr,
		TLS:   &tls.Config{ServerName: "127.0.0.1", RootCAs: id.roots(t), Certificates: []tls.Certificate{pair}},
		Hello: func() tunnel.Hello { return tunnel.Hello{Node: id.name} },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = tc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if err := tc.WaitConnected(t.Context()); err != nil {
		t.Fatal(err)
	}
	return tc
}

// TestSiteDigestsOverTunnel: the hub takes a site digest a node of the
// site reports over its tunnel, refuses one about a site from a node of
// another, and counts both on /metrics.
func TestSiteDigestsOverTunnel(t *testing.T) {
	h := hubtest.Start(t, "--disable-scheduler")
	admin := clientFor(t, h)
	ctx := t.Context()
	for name, zone := range map[string]string{"a1": "site-a", "a2": "site-a", "b1": "site-b"} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: zone}}}
		if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	d := sitedigest.Digest{Site: "site-a", Members: []sitedigest.Member{
		{Node: "a1", State: sitedigest.Alive, Incarnation: 1},
		{Node: "a2", State: sitedigest.Dead, Incarnation: 2},
	}}
	payload, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	a1 := connectTunnel(t, h, joinNode(t, h, "a1"))
	b1 := connectTunnel(t, h, joinNode(t, h, "b1"))
	a1.Report(payload)
	b1.Report(payload)

	metric := func() string {
		m, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return grepLines(string(m), "tether_site_digests_total{")
	}
	want := "tether_site_digests_total{result=\"accepted\"} 1\n" +
		"tether_site_digests_total{result=\"duplicate\"} 0\n" +
		"tether_site_digests_total{result=\"rejected\"} 1"
	var got string
	waitFor(t, "both digests counted", func() bool { got = metric(); return got == want })
	// The node still reporting the same view costs the hub nothing.
	a1.Report(payload)
	b1.Report(append(payload[:len(payload):len(payload)], 0))
	waitFor(t, "the repeat and a bad digest counted", func() bool {
		got = metric()
		return strings.Contains(got, `duplicate"} 1`) && strings.Contains(got, `rejected"} 2`)
	})
}

// TestSiteKeySecrets: the hub gives every site a gossip key Secret, and a
// node reads its own site's and not another's.
func TestSiteKeySecrets(t *testing.T) {
	h := hubtest.Start(t, "--disable-scheduler")
	admin := clientFor(t, h)
	ctx := t.Context()
	for name, zone := range map[string]string{"a1": "site-a", "b1": "site-b"} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: zone}}}
		if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	secrets := admin.CoreV1().Secrets(sitedigest.KeySecretNamespace)
	for _, site := range []string{"site-a", "site-b"} {
		waitFor(t, site+"'s key secret", func() bool {
			s, err := secrets.Get(ctx, sitedigest.KeySecretName(site), metav1.GetOptions{})
			return err == nil && s.Type == sitedigest.KeySecretType && len(s.Data[sitedigest.KeySecretKey]) == 32
		})
	}
	a1 := joinNode(t, h, "a1").client(t, h).CoreV1().Secrets(sitedigest.KeySecretNamespace)
	if _, err := a1.Get(ctx, sitedigest.KeySecretName("site-a"), metav1.GetOptions{}); err != nil {
		t.Errorf("a1 reads its site's keys: %v", err)
	}
	if _, err := a1.Get(ctx, sitedigest.KeySecretName("site-b"), metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a1 reads site-b's keys: %v, want 403", err)
	}
}
