package endpoints

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
)

// mirrored lists the mirrored slices of a Service, each as
// "type addr/ready,… ports".
func mirrored(t *testing.T, e *kittest.Env, ns, svc string) ([]string, []discoveryv1.EndpointSlice) {
	t.Helper()
	l, err := e.Client.DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: LabelServiceName + "=" + svc + "," + LabelManagedBy + "=" + MirroringManagedByValue,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range l.Items {
		var eps, ports []string
		for _, ep := range s.Endpoints {
			eps = append(eps, fmt.Sprintf("%s/%v", strings.Join(ep.Addresses, "+"), ep.Conditions.Ready != nil && *ep.Conditions.Ready))
		}
		for _, p := range s.Ports {
			ports = append(ports, fmt.Sprintf("%s:%d/%s", *p.Name, *p.Port, *p.Protocol))
		}
		out = append(out, fmt.Sprintf("%s %s %s", s.AddressType, strings.Join(eps, ","), strings.Join(ports, ",")))
	}
	slices.Sort(out)
	return out, l.Items
}

func endpointsManifest(ns, name, labels, subsets string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Endpoints
metadata: {name: %s, namespace: %s, labels: {%s}}
subsets:
%s`, name, ns, labels, subsets)
}

// TestEndpointSliceMirroringAgainstHub writes a selector-less Service and
// its Endpoints with kubectl and follows the mirrored EndpointSlices: they
// appear with the Endpoints' addresses, readiness, ports and labels, follow
// its updates (an IPv6 address gets its own slice), and go when the
// Endpoints go, when the Service gets a selector, and for Endpoints
// labelled to skip mirroring. The hub's EndpointSlice controller runs
// alongside and leaves the mirrored slices alone.
func TestEndpointSliceMirroringAgainstHub(t *testing.T) {
	e := kittest.Start(t, []string{"--controllers=*,-endpointslice-mirroring"}, 0)
	f := e.Factory()
	m, err := NewMirroring(MirrorConfig{Client: e.ControllerClient(t, "endpointslice-mirroring"), Informers: f, Workers: 2, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	e.Run(t, f, m)
	ns := "ext"
	e.Kubectl(t, "create", "namespace", ns)
	e.Apply(t, service(ns, "db", false))

	start := time.Now()
	e.Apply(t, endpointsManifest(ns, "db", "team: a", `- addresses: [{ip: 10.1.0.1, nodeName: n1}, {ip: 10.1.0.2}]
  notReadyAddresses: [{ip: 10.1.0.3}]
  ports: [{name: http, port: 8080, protocol: TCP}]
`))
	want := []string{"IPv4 10.1.0.1/true,10.1.0.2/true,10.1.0.3/false http:8080/TCP"}
	kittest.WaitFor(t, "mirrored slice", 5*time.Second, func() (bool, error) {
		got, _ := mirrored(t, e, ns, "db")
		return slices.Equal(got, want), fmt.Errorf("slices %q", got)
	})
	t.Logf("mirrored after %v", time.Since(start).Round(time.Millisecond))
	_, items := mirrored(t, e, ns, "db")
	s := items[0]
	if s.Labels["team"] != "a" || !strings.HasPrefix(s.Name, "db-") || len(s.OwnerReferences) != 1 ||
		s.OwnerReferences[0].Kind != "Endpoints" || s.Endpoints[0].NodeName == nil || *s.Endpoints[0].NodeName != "n1" {
		t.Errorf("mirrored slice %s: labels %v owners %v node %v", s.Name, s.Labels, s.OwnerReferences, s.Endpoints[0].NodeName)
	}

	e.Apply(t, endpointsManifest(ns, "db", "team: a", `- addresses: [{ip: 10.1.0.4}, {ip: "fd00::4"}]
  ports: [{name: http, port: 9090, protocol: TCP}]
`))
	want = []string{"IPv4 10.1.0.4/true http:9090/TCP", "IPv6 fd00::4/true http:9090/TCP"}
	kittest.WaitFor(t, "mirrored slices updated", 5*time.Second, func() (bool, error) {
		got, _ := mirrored(t, e, ns, "db")
		return slices.Equal(got, want), fmt.Errorf("slices %q", got)
	})
	// Settled: nothing more is written.
	time.Sleep(500 * time.Millisecond)
	before := e.Writes(t, "endpointslices")
	time.Sleep(time.Second)
	if after := e.Writes(t, "endpointslices"); after != before {
		t.Errorf("%v endpoint slice writes while nothing changed", after-before)
	}
	// The EndpointSlice controller made no slice of its own.
	all, err := slicesOf(e.Client, ns, "db")
	if err != nil || len(all) != 2 {
		t.Errorf("slices of the Service: %d (%v)", len(all), err)
	}

	e.Kubectl(t, "-n", ns, "delete", "endpoints", "db")
	kittest.WaitFor(t, "mirrored slices deleted with the Endpoints", 5*time.Second, func() (bool, error) {
		got, _ := mirrored(t, e, ns, "db")
		return len(got) == 0, fmt.Errorf("slices %q", got)
	})

	// Endpoints labelled to skip mirroring are not mirrored, and lose
	// their slices when they get the label.
	e.Apply(t, service(ns, "skip", false))
	subsets := `- addresses: [{ip: 10.2.0.1}]
  ports: [{name: http, port: 80}]
`
	e.Apply(t, endpointsManifest(ns, "skip", "", subsets))
	kittest.WaitFor(t, "mirrored slice", 5*time.Second, func() (bool, error) {
		got, _ := mirrored(t, e, ns, "skip")
		return len(got) == 1, fmt.Errorf("slices %q", got)
	})
	e.Apply(t, endpointsManifest(ns, "skip", `endpointslice.kubernetes.io/skip-mirror: "true"`, subsets))
	kittest.WaitFor(t, "mirrored slice deleted for skip-mirror", 5*time.Second, func() (bool, error) {
		got, _ := mirrored(t, e, ns, "skip")
		return len(got) == 0, fmt.Errorf("slices %q", got)
	})

	// A Service that gets a selector is the EndpointSlice controller's.
	e.Apply(t, endpointsManifest(ns, "db", "", subsets))
	kittest.WaitFor(t, "mirrored slice", 5*time.Second, func() (bool, error) {
		got, _ := mirrored(t, e, ns, "db")
		return len(got) == 1, fmt.Errorf("slices %q", got)
	})
	e.Apply(t, service(ns, "db", true))
	kittest.WaitFor(t, "mirrored slice deleted when the Service got a selector", 5*time.Second, func() (bool, error) {
		got, _ := mirrored(t, e, ns, "db")
		return len(got) == 0, fmt.Errorf("slices %q", got)
	})
}
