package registry

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// memLister serves a fixed set of stored services.
type memLister struct {
	mu   sync.Mutex
	objs []runtime.Object
}

func (l *memLister) List(_ context.Context, resource, namespace string) ([]runtime.Object, error) {
	if resource != "services" {
		return nil, fmt.Errorf("unexpected resource %q", resource)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]runtime.Object(nil), l.objs...), nil
}

// newServices returns a fresh allocator of network n and the Service kind
// allocating from it.
func newServices(t *testing.T, n ServiceNetwork) (*serviceAllocator, *Kind) {
	t.Helper()
	n, err := n.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	a := newServiceAllocator(n)
	return a, newServiceKind(a)
}

func newService(name string, typ corev1.ServiceType) *corev1.Service {
	s := &corev1.Service{}
	s.Name, s.Namespace = name, "default"
	s.Spec.Type = typ
	s.Spec.Selector = map[string]string{"app": name}
	s.Spec.Ports = []corev1.ServicePort{{Port: 80}}
	defaultService(s)
	return s
}

func TestDefaultService(t *testing.T) {
	s := newService("web", "")
	if s.Spec.Type != corev1.ServiceTypeClusterIP || s.Spec.SessionAffinity != corev1.ServiceAffinityNone ||
		s.Spec.Ports[0].Protocol != corev1.ProtocolTCP || s.Spec.Ports[0].TargetPort != intstr.FromInt32(80) ||
		*s.Spec.IPFamilyPolicy != corev1.IPFamilyPolicySingleStack || !reflect.DeepEqual(s.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv4Protocol}) ||
		*s.Spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyCluster || s.Spec.ExternalTrafficPolicy != "" {
		t.Errorf("defaults: %+v", s.Spec)
	}
	np := newService("np", corev1.ServiceTypeLoadBalancer)
	if np.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyCluster || np.Spec.AllocateLoadBalancerNodePorts == nil || !*np.Spec.AllocateLoadBalancerNodePorts {
		t.Errorf("LoadBalancer defaults: %+v", np.Spec)
	}
	ci := newService("ci", "")
	ci.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	defaultService(ci)
	if *ci.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds != 10800 {
		t.Errorf("ClientIP timeout = %d", *ci.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds)
	}
	en := &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}}
	defaultService(en)
	if en.Spec.IPFamilyPolicy != nil || en.Spec.InternalTrafficPolicy != nil {
		t.Errorf("ExternalName got IP family or traffic policy: %+v", en.Spec)
	}
}

func TestValidateService(t *testing.T) {
	if errs := validateService(newService("web", "")); len(errs) > 0 {
		t.Fatalf("valid service: %v", errs)
	}
	tests := []struct {
		name   string
		mutate func(s *corev1.Service)
		typ    field.ErrorType
		path   string
	}{
		{"no ports", func(s *corev1.Service) { s.Spec.Ports = nil }, field.ErrorTypeRequired, "spec.ports"},
		{"unnamed ports", func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Port: 81, Protocol: "TCP", TargetPort: intstr.FromInt32(81)})
		}, field.ErrorTypeRequired, "spec.ports[0].name"},
		{"duplicate port names", func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Name: "a", Port: 80, Protocol: "TCP", TargetPort: intstr.FromInt32(80)}, {Name: "a", Port: 81, Protocol: "TCP", TargetPort: intstr.FromInt32(81)}}
		}, field.ErrorTypeDuplicate, "spec.ports[1].name"},
		{"port zero", func(s *corev1.Service) { s.Spec.Ports[0].Port = 0 }, field.ErrorTypeInvalid, "spec.ports[0].port"},
		{"bad protocol", func(s *corev1.Service) { s.Spec.Ports[0].Protocol = "HTTP" }, field.ErrorTypeNotSupported, "spec.ports[0].protocol"},
		{"bad type", func(s *corev1.Service) { s.Spec.Type = "Magic" }, field.ErrorTypeNotSupported, "spec.type"},
		{"nodePort on ClusterIP", func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 30080 }, field.ErrorTypeForbidden, "spec.ports[0].nodePort"},
		{"bad selector", func(s *corev1.Service) { s.Spec.Selector = map[string]string{"a": "b c"} }, field.ErrorTypeInvalid, "spec.selector"},
		{"bad session affinity", func(s *corev1.Service) { s.Spec.SessionAffinity = "Cookie" }, field.ErrorTypeNotSupported, "spec.sessionAffinity"},
		{"bad cluster IP", func(s *corev1.Service) { s.Spec.ClusterIP = "300.1.1.1"; s.Spec.ClusterIPs = nil }, field.ErrorTypeInvalid, "spec.clusterIPs[0]"},
		{"externalName missing", func(s *corev1.Service) {
			s.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, SessionAffinity: "None"}
		}, field.ErrorTypeRequired, "spec.externalName"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newService("web", "")
			tt.mutate(s)
			wantErr(t, validateService(s), tt.typ, tt.path)
		})
	}
	headless := newService("h", "")
	headless.Spec.ClusterIP = corev1.ClusterIPNone
	headless.Spec.Ports = nil
	if errs := validateService(headless); len(errs) > 0 {
		t.Errorf("headless without ports: %v", errs)
	}
	_, serviceKind := newServices(t, ServiceNetwork{})
	if errs := serviceKind.NameRule("Web", false); len(errs) == 0 {
		t.Error("upper-case service name accepted")
	}
	if errs := serviceKind.NameRule("1web", false); len(errs) == 0 {
		t.Error("service name starting with a digit accepted")
	}
	if errs := serviceKind.NameRule("web-", true); len(errs) > 0 {
		t.Errorf("generateName prefix rejected: %v", errs)
	}
}

func TestServiceAllocation(t *testing.T) {
	a, serviceKind := newServices(t, ServiceNetwork{})
	ctx := context.Background()
	stored := newService("kubernetes", "")
	stored.Spec.ClusterIP, stored.Spec.ClusterIPs = "10.0.0.1", []string{"10.0.0.1"}
	taken := newService("taken", corev1.ServiceTypeNodePort)
	taken.Spec.ClusterIP, taken.Spec.ClusterIPs = "10.0.5.5", []string{"10.0.5.5"}
	taken.Spec.Ports[0].NodePort = 30100
	l := &memLister{objs: []runtime.Object{stored, taken}}

	// Explicit requests.
	dns := newService("kube-dns", "")
	dns.Spec.ClusterIP = "10.0.0.10"
	if err := a.admitService(ctx, l, dns, nil); err != nil {
		t.Fatalf("explicit 10.0.0.10: %v", err)
	}
	if !reflect.DeepEqual(dns.Spec.ClusterIPs, []string{"10.0.0.10"}) {
		t.Errorf("clusterIPs = %v", dns.Spec.ClusterIPs)
	}
	errTests := []struct {
		ip, detail string
	}{
		{"10.0.5.5", "failed to allocate IP 10.0.5.5: provided IP is already allocated"},
		{"10.0.0.10", "failed to allocate IP 10.0.0.10: provided IP is already allocated"},
		{"192.168.0.1", "failed to allocate IP 192.168.0.1: the provided IP (192.168.0.1) is not in the valid range. The range of valid IPs is 10.0.0.0/16"},
	}
	for _, tt := range errTests {
		s := newService("x-"+tt.ip, "")
		s.Spec.ClusterIP = tt.ip
		err := a.admitService(ctx, l, s, nil)
		if !apierrors.IsInvalid(err) {
			t.Fatalf("%s: err = %v, want Invalid", tt.ip, err)
		}
		causes := err.(*apierrors.StatusError).ErrStatus.Details.Causes
		if len(causes) != 1 || causes[0].Message != "Invalid value: [\""+tt.ip+"\"]: "+tt.detail || causes[0].Field != "spec.clusterIPs" {
			t.Errorf("%s: causes = %+v", tt.ip, causes)
		}
	}

	// Automatic allocation avoids reserved and used addresses.
	cidr := netip.MustParsePrefix(DefaultServiceCIDR)
	for i := 0; i < 50; i++ {
		s := newService(fmt.Sprintf("auto-%d", i), "")
		if err := a.admitService(ctx, l, s, nil); err != nil {
			t.Fatal(err)
		}
		ip := netip.MustParseAddr(s.Spec.ClusterIP)
		if !cidr.Contains(ip) || ip.String() == "10.0.0.1" || ip.String() == "10.0.0.10" || ip.String() == "10.0.0.0" || ip.String() == "10.0.5.5" {
			t.Errorf("allocated %s", ip)
		}
	}

	// Node ports.
	np := newService("np", corev1.ServiceTypeNodePort)
	np.Spec.Ports = append(np.Spec.Ports, corev1.ServicePort{Name: "b", Port: 81, Protocol: "TCP", NodePort: 30200})
	np.Spec.Ports[0].Name = "a"
	if err := a.admitService(ctx, l, np, nil); err != nil {
		t.Fatal(err)
	}
	if p := np.Spec.Ports[0].NodePort; p < 30000 || p > 32767 || p == 30100 || p == 30200 {
		t.Errorf("node port %d", p)
	}
	if np.Spec.Ports[1].NodePort != 30200 {
		t.Errorf("requested node port changed to %d", np.Spec.Ports[1].NodePort)
	}
	for _, tt := range []struct {
		port   int32
		detail string
	}{
		{30100, "provided port is already allocated"},
		{30200, "provided port is already allocated"},
		{80, "provided port is not in the valid range. The range of valid ports is 30000-32767"},
	} {
		s := newService(fmt.Sprintf("np-%d", tt.port), corev1.ServiceTypeNodePort)
		s.Spec.Ports[0].NodePort = tt.port
		err := a.admitService(ctx, l, s, nil)
		if !apierrors.IsInvalid(err) {
			t.Fatalf("node port %d: err = %v", tt.port, err)
		}
		c := err.(*apierrors.StatusError).ErrStatus.Details.Causes[0]
		if c.Field != "spec.ports[0].nodePort" || c.Message != fmt.Sprintf("Invalid value: %d: %s", tt.port, tt.detail) {
			t.Errorf("node port %d: cause %+v", tt.port, c)
		}
	}

	// Only the configured family is served.
	v6 := newService("v6", "")
	v6.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	if err := a.admitService(ctx, l, v6, nil); !apierrors.IsInvalid(err) {
		t.Errorf("IPv6 family: err = %v", err)
	}
	dual := newService("dual", "")
	req := corev1.IPFamilyPolicyRequireDualStack
	dual.Spec.IPFamilyPolicy = &req
	if err := a.admitService(ctx, l, dual, nil); !apierrors.IsInvalid(err) {
		t.Errorf("RequireDualStack: err = %v", err)
	}

	// Headless and ExternalName get nothing.
	h := newService("headless", "")
	h.Spec.ClusterIP = corev1.ClusterIPNone
	if err := a.admitService(ctx, l, h, nil); err != nil || h.Spec.ClusterIP != "None" {
		t.Errorf("headless: %v %q", err, h.Spec.ClusterIP)
	}
	en := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "en", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}}
	if err := a.admitService(ctx, l, en, nil); err != nil || en.Spec.ClusterIP != "" {
		t.Errorf("ExternalName: %v %q", err, en.Spec.ClusterIP)
	}

	// Update keeps allocations and may not change the cluster IP.
	upd := np.DeepCopy()
	upd.Spec.ClusterIP, upd.Spec.ClusterIPs = "", nil
	upd.Spec.Ports[0].NodePort = 0
	serviceKind.PrepareForUpdate(upd, np)
	if upd.Spec.ClusterIP != np.Spec.ClusterIP || upd.Spec.Ports[0].NodePort != np.Spec.Ports[0].NodePort {
		t.Errorf("update lost allocations: %+v", upd.Spec)
	}
	if err := a.admitService(ctx, l, upd, np); err != nil {
		t.Errorf("update admit: %v", err)
	}
	moved := np.DeepCopy()
	moved.Spec.ClusterIP, moved.Spec.ClusterIPs = "10.0.9.9", []string{"10.0.9.9"}
	wantErr(t, serviceKind.ValidateUpdate(moved, np), field.ErrorTypeInvalid, "spec.clusterIPs[0]")

	// Release frees the address for others.
	serviceKind.Release(ctx, l, dns)
	again := newService("dns2", "")
	again.Spec.ClusterIP = "10.0.0.10"
	if err := a.admitService(ctx, l, again, nil); err != nil {
		t.Errorf("after release: %v", err)
	}
}

func TestServiceAllocationConcurrent(t *testing.T) {
	a, _ := newServices(t, ServiceNetwork{})
	l := &memLister{}
	const n = 100
	var wg sync.WaitGroup
	ips := make([]string, n)
	ports := make([]int32, n)
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s := newService(fmt.Sprintf("s%d", i), corev1.ServiceTypeNodePort)
			errs[i] = a.admitService(context.Background(), l, s, nil)
			ips[i], ports[i] = s.Spec.ClusterIP, s.Spec.Ports[0].NodePort
		}(i)
	}
	wg.Wait()
	seenIP := map[string]bool{}
	seenPort := map[int32]bool{}
	for i := 0; i < n; i++ {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if seenIP[ips[i]] || seenPort[ports[i]] {
			t.Fatalf("duplicate allocation %s / %d", ips[i], ports[i])
		}
		seenIP[ips[i]], seenPort[ports[i]] = true, true
	}
}

func TestServiceNetworkConfig(t *testing.T) {
	a, _ := newServices(t, ServiceNetwork{CIDR: netip.MustParsePrefix("10.0.0.0/29"), NodePortFirst: 31000, NodePortLast: 31001})
	l := &memLister{}
	// A /29 has hosts .1-.6; .1 is kept, leaving five (.10 is outside it).
	for i := 0; i < 5; i++ {
		s := newService(fmt.Sprintf("c%d", i), "")
		if err := a.admitService(context.Background(), l, s, nil); err != nil {
			t.Fatalf("service %d: %v", i, err)
		}
	}
	if err := a.admitService(context.Background(), l, newService("full", ""), nil); !apierrors.IsInvalid(err) {
		t.Errorf("full range: err = %v", err)
	}
	if _, err := (ServiceNetwork{NodePortFirst: 5, NodePortLast: 1}).withDefaults(); err == nil {
		t.Error("inverted port range accepted")
	}
}

func TestServiceCells(t *testing.T) {
	_, serviceKind := newServices(t, ServiceNetwork{})
	now := time.Now()
	tests := []struct {
		name string
		svc  func() *corev1.Service
		want []any
	}{
		{"cluster IP", func() *corev1.Service {
			s := newService("web", "")
			s.Spec.ClusterIP = "10.0.0.20"
			return s
		}, []any{"web", "ClusterIP", "10.0.0.20", "<none>", "80/TCP", "<unknown>", "app=web"}},
		{"node port", func() *corev1.Service {
			s := newService("np", corev1.ServiceTypeNodePort)
			s.Spec.ClusterIP = "10.0.0.21"
			s.Spec.Ports[0].NodePort = 30080
			return s
		}, []any{"np", "NodePort", "10.0.0.21", "<none>", "80:30080/TCP", "<unknown>", "app=np"}},
		{"pending load balancer", func() *corev1.Service {
			s := newService("lb", corev1.ServiceTypeLoadBalancer)
			s.Spec.ClusterIP = "10.0.0.22"
			s.Spec.Ports[0].NodePort = 30081
			return s
		}, []any{"lb", "LoadBalancer", "10.0.0.22", "<pending>", "80:30081/TCP", "<unknown>", "app=lb"}},
		{"external name", func() *corev1.Service {
			return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "en"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}}
		}, []any{"en", "ExternalName", "<none>", "example.com", "<none>", "<unknown>", "<none>"}},
	}
	for _, tt := range tests {
		got := serviceKind.Cells(tt.svc(), now)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: cells = %#v, want %#v", tt.name, got, tt.want)
		}
	}
}
