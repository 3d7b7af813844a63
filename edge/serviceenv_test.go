package edge

import (
	"errors"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edge/staticpods"
)

func testService(ns, name, ip string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{ClusterIP: ip, Ports: ports},
	}
}

// TestServiceEnv checks the kubelet's Service variables: the concept
// page's redis-master example gives its seven variables, named ports add
// theirs, headless Services and other namespaces give none, the master
// Service's come always, and enableServiceLinks: false keeps only those.
func TestServiceEnv(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "p"}}
	master := testService("default", "kubernetes", "10.0.0.1", corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP})
	redis := testService("shop", "redis-master", "10.0.0.11", corev1.ServicePort{Port: 6379, Protocol: corev1.ProtocolTCP})
	web := testService("shop", "web-front", "10.0.0.12",
		corev1.ServicePort{Name: "http", Port: 80},
		corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	headless := testService("shop", "db", corev1.ClusterIPNone, corev1.ServicePort{Port: 5432})
	unset := testService("shop", "pending", "", corev1.ServicePort{Port: 1})
	other := testService("elsewhere", "cache", "10.0.0.13", corev1.ServicePort{Port: 11211})

	got := ServiceEnv(pod, []*corev1.Service{redis})
	want := map[string]string{
		"REDIS_MASTER_SERVICE_HOST":        "10.0.0.11",
		"REDIS_MASTER_SERVICE_PORT":        "6379",
		"REDIS_MASTER_PORT":                "tcp://10.0.0.11:6379",
		"REDIS_MASTER_PORT_6379_TCP":       "tcp://10.0.0.11:6379",
		"REDIS_MASTER_PORT_6379_TCP_PROTO": "tcp",
		"REDIS_MASTER_PORT_6379_TCP_PORT":  "6379",
		"REDIS_MASTER_PORT_6379_TCP_ADDR":  "10.0.0.11",
	}
	if !maps.Equal(got, want) {
		t.Errorf("redis-master: got %v, want the concept page's seven variables %v", got, want)
	}

	kube := map[string]string{
		"KUBERNETES_SERVICE_HOST":       "10.0.0.1",
		"KUBERNETES_SERVICE_PORT":       "443",
		"KUBERNETES_SERVICE_PORT_HTTPS": "443",
		"KUBERNETES_PORT":               "tcp://10.0.0.1:443",
		"KUBERNETES_PORT_443_TCP":       "tcp://10.0.0.1:443",
		"KUBERNETES_PORT_443_TCP_PROTO": "tcp",
		"KUBERNETES_PORT_443_TCP_PORT":  "443",
		"KUBERNETES_PORT_443_TCP_ADDR":  "10.0.0.1",
	}
	all := []*corev1.Service{master, redis, web, headless, unset, other}
	got = ServiceEnv(pod, all)
	for k, v := range kube {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for k, v := range map[string]string{
		"REDIS_MASTER_SERVICE_HOST":   "10.0.0.11",
		"WEB_FRONT_SERVICE_HOST":      "10.0.0.12",
		"WEB_FRONT_SERVICE_PORT":      "80",
		"WEB_FRONT_SERVICE_PORT_HTTP": "80",
		"WEB_FRONT_SERVICE_PORT_DNS":  "53",
		"WEB_FRONT_PORT":              "tcp://10.0.0.12:80",
		"WEB_FRONT_PORT_53_UDP":       "udp://10.0.0.12:53",
		"WEB_FRONT_PORT_53_UDP_PROTO": "udp",
		"WEB_FRONT_PORT_53_UDP_ADDR":  "10.0.0.12",
		"WEB_FRONT_PORT_80_TCP_PORT":  "80",
	} {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for _, k := range []string{"DB_SERVICE_HOST", "PENDING_SERVICE_HOST", "CACHE_SERVICE_HOST"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s set: headless, IP-less and other namespaces' Services give no variables", k)
		}
	}
	if n := len(got); n != len(kube)+7+13 {
		t.Errorf("%d variables, want %d: %v", n, len(kube)+7+13, got)
	}

	off := false
	pod.Spec.EnableServiceLinks = &off
	if got := ServiceEnv(pod, all); !maps.Equal(got, kube) {
		t.Errorf("enableServiceLinks false: got %v, want only %v", got, kube)
	}

	// A pod of the default namespace without links still gets the
	// master Service; with links, a Service of its own namespace named
	// kubernetes replaces it.
	pod.Namespace = "default"
	if got := ServiceEnv(pod, all); !maps.Equal(got, kube) {
		t.Errorf("default namespace without links: got %v", got)
	}
	pod.Namespace = "shop"
	on := true
	pod.Spec.EnableServiceLinks = &on
	own := testService("shop", "kubernetes", "10.0.0.99", corev1.ServicePort{Port: 8443})
	if got := ServiceEnv(pod, []*corev1.Service{master, own}); got["KUBERNETES_SERVICE_HOST"] != "10.0.0.99" {
		t.Errorf("own kubernetes Service: KUBERNETES_SERVICE_HOST = %q", got["KUBERNETES_SERVICE_HOST"])
	}
	if got := ServiceEnv(pod, []*corev1.Service{own, master}); got["KUBERNETES_SERVICE_HOST"] != "10.0.0.99" {
		t.Errorf("own kubernetes Service listed first: KUBERNETES_SERVICE_HOST = %q", got["KUBERNETES_SERVICE_HOST"])
	}
}

// syncedCtrl is a controller that only says whether it synced.
type syncedCtrl struct {
	cache.Controller
	synced bool
}

func (c syncedCtrl) HasSynced() bool { return c.synced }

// TestAgentServiceEnv checks that pods of the API wait for the Service
// list with the kubelet's error, while static pods start without it.
func TestAgentServiceEnv(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	store.Add(testService("default", "kubernetes", "10.0.0.1", corev1.ServicePort{Name: "https", Port: 443}))
	a := &Agent{services: &serviceWatch{services: store, ctrls: []cache.Controller{syncedCtrl{}}}}
	src := agentSources{a: a}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"}}
	_, err := src.ServiceEnv(pod)
	if err == nil || !errors.Is(err, ErrSourceNotReady) || err.Error() != "services have not yet been read at least once, cannot construct envvars" {
		t.Errorf("unsynced: %v", err)
	}
	static := pod.DeepCopy()
	static.Annotations = map[string]string{staticpods.AnnConfigSource: "file"}
	if env, err := src.ServiceEnv(static); err != nil || env["KUBERNETES_SERVICE_HOST"] != "10.0.0.1" {
		t.Errorf("static pod before the sync: %v, %v", env, err)
	}
	a.services.ctrls[0] = syncedCtrl{synced: true}
	if env, err := src.ServiceEnv(pod); err != nil || env["KUBERNETES_SERVICE_PORT"] != "443" {
		t.Errorf("synced: %v, %v", env, err)
	}
}
