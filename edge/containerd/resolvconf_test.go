package containerd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
)

// TestResolvConfClusterFirst checks the resolv.conf the runtime writes for
// pods: ClusterFirst pods (and ClusterFirstWithHostNet ones on the host
// network) name the agent's DNS address with the cluster search path and
// ndots:5; Default and hostNetwork ClusterFirst pods get the node's.
func TestResolvConfClusterFirst(t *testing.T) {
	host := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(host, []byte("# node\nnameserver 192.0.2.53\nsearch corp.example\noptions edns0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := func(policy corev1.DNSPolicy, hostNet bool) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
			Spec:       corev1.PodSpec{DNSPolicy: policy, HostNetwork: hostNet},
		}
	}
	clusterFirst := "search shop.svc.cluster.local svc.cluster.local cluster.local corp.example\n" +
		"nameserver " + edge.DefaultDNSAddr + "\n" +
		"options ndots:5\n"
	nodeDefault := "search corp.example\nnameserver 192.0.2.53\noptions edns0\n"
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"ClusterFirst", pod(corev1.DNSClusterFirst, false), clusterFirst},
		{"unset policy", pod("", false), clusterFirst},
		{"ClusterFirstWithHostNet", pod(corev1.DNSClusterFirstWithHostNet, true), clusterFirst},
		{"ClusterFirst on the host network", pod(corev1.DNSClusterFirst, true), nodeDefault},
		{"Default", pod(corev1.DNSDefault, false), nodeDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolvConfFor(tc.pod, []string{edge.DefaultDNSAddr}, "cluster.local", host)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("resolv.conf:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}

	// Another cluster domain and an override of the name servers.
	got, err := resolvConfFor(pod(corev1.DNSClusterFirst, false), []string{"10.96.0.10"}, "edge.internal", host)
	if err != nil {
		t.Fatal(err)
	}
	want := "search shop.svc.edge.internal svc.edge.internal edge.internal corp.example\nnameserver 10.96.0.10\noptions ndots:5\n"
	if got != want {
		t.Errorf("resolv.conf with --cluster-dns 10.96.0.10 --cluster-domain edge.internal:\n%s\nwant:\n%s", got, want)
	}

	// The runtime's method uses its configuration.
	r := &Runtime{cfg: Config{ClusterDNS: []string{edge.DefaultDNSAddr}, ClusterDomain: "cluster.local"}}
	got, err = r.resolvConf(pod(corev1.DNSClusterFirst, false))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"nameserver " + edge.DefaultDNSAddr + "\n", "search shop.svc.cluster.local svc.cluster.local cluster.local", "options ndots:5\n"} {
		if !strings.Contains(got, line) {
			t.Errorf("Runtime.resolvConf lacks %q:\n%s", line, got)
		}
	}

	if _, err := resolvConfFor(pod(corev1.DNSClusterFirst, false), []string{"not-an-ip"}, "cluster.local", host); err == nil {
		t.Error("a cluster DNS address that is not an IP was accepted")
	}
}

// TestResolvConfDNSConfig: dnsPolicy None with the concept pages' dnsConfig
// gives exactly that resolv.conf; with another policy the dnsConfig is
// merged into the policy's, duplicates removed and options replaced by
// name.
func TestResolvConfDNSConfig(t *testing.T) {
	host := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(host, []byte("nameserver 192.0.2.53\nsearch corp.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	two := "2"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "dns-example", Namespace: "default"},
		Spec: corev1.PodSpec{DNSPolicy: corev1.DNSNone, DNSConfig: &corev1.PodDNSConfig{
			Nameservers: []string{"1.2.3.4"},
			Searches:    []string{"ns1.svc.cluster.local", "my.dns.search.suffix"},
			Options:     []corev1.PodDNSConfigOption{{Name: "ndots", Value: &two}, {Name: "edns0"}},
		}},
	}
	got, err := resolvConfFor(pod, []string{edge.DefaultDNSAddr}, "cluster.local", host)
	if err != nil {
		t.Fatal(err)
	}
	want := "search ns1.svc.cluster.local my.dns.search.suffix\nnameserver 1.2.3.4\noptions ndots:2 edns0\n"
	if got != want {
		t.Errorf("dnsPolicy None:\n%s\nwant:\n%s", got, want)
	}

	pod.Spec.DNSPolicy = corev1.DNSClusterFirst
	pod.Spec.DNSConfig.Searches = []string{"svc.cluster.local", "my.dns.search.suffix"}
	got, err = resolvConfFor(pod, []string{edge.DefaultDNSAddr}, "cluster.local", host)
	if err != nil {
		t.Fatal(err)
	}
	want = "search default.svc.cluster.local svc.cluster.local cluster.local corp.example my.dns.search.suffix\n" +
		"nameserver " + edge.DefaultDNSAddr + "\nnameserver 1.2.3.4\noptions ndots:2 edns0\n"
	if got != want {
		t.Errorf("ClusterFirst with dnsConfig:\n%s\nwant:\n%s", got, want)
	}

	pod.Spec.DNSPolicy = corev1.DNSNone
	pod.Spec.DNSConfig.Nameservers = nil
	if _, err := resolvConfFor(pod, nil, "cluster.local", host); err == nil {
		t.Error("dnsPolicy None without nameservers was accepted")
	}
}
