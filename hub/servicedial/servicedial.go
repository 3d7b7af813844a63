// Package servicedial reaches a Service's backends from the hub: it picks
// a ready endpoint of a Service port from the Service's EndpointSlices and
// connects to it through the tunnel of the node its pod runs on, so a
// Service whose pods run on an edge answers the hub as if it were local.
// services/proxy, admission webhooks and aggregated APIs use it.
package servicedial

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// Dialer connects to Services' endpoints. Its zero value is not usable:
// Storage and DialPod must be set.
type Dialer struct {
	// Storage is where Services, EndpointSlices and Pods are read.
	Storage storage.API
	// DialPod opens a connection to addr (a pod's IP:port) from node,
	// normally a stream through the node's tunnel (apiserver.PodDialer).
	DialPod func(ctx context.Context, node, addr string) (net.Conn, error)

	once                            sync.Once
	serviceKind, sliceKind, podKind *registry.Kind
}

func (d *Dialer) kinds() (svc, slice, pod *registry.Kind) {
	d.once.Do(func() {
		for _, k := range registry.All() {
			switch k.GroupVersionResource() {
			case corev1.SchemeGroupVersion.WithResource("services"):
				d.serviceKind = k
			case discoveryv1.SchemeGroupVersion.WithResource("endpointslices"):
				d.sliceKind = k
			case corev1.SchemeGroupVersion.WithResource("pods"):
				d.podKind = k
			}
		}
	})
	return d.serviceKind, d.sliceKind, d.podKind
}

// DialService connects to a ready endpoint of Service namespace/name on
// port (the Service's port number), through the tunnel of the endpoint's
// node. A missing Service, a port the Service does not declare and a
// Service without ready endpoints are errors that say so (Kubernetes
// Status errors). An ExternalName Service is dialed at its external name.
func (d *Dialer) DialService(ctx context.Context, namespace, name string, port int32) (net.Conn, error) {
	svcKind, _, _ := d.kinds()
	obj, err := d.Storage.Get(ctx, svcKind, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("get service %s/%s: %w", namespace, name, err)
	}
	svc := obj.(*corev1.Service)
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		var nd net.Dialer
		c, err := nd.DialContext(ctx, "tcp", net.JoinHostPort(svc.Spec.ExternalName, strconv.Itoa(int(port))))
		if err != nil {
			return nil, fmt.Errorf("dial service %s/%s: %w", namespace, name, err)
		}
		return c, nil
	}
	portName, found := "", false
	for _, p := range svc.Spec.Ports {
		if p.Port == port {
			portName, found = p.Name, true
			break
		}
	}
	if !found {
		return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("no service port %d found for service %q", port, name))
	}
	node, addr, err := d.Endpoint(ctx, namespace, name, portName)
	if err != nil {
		return nil, err
	}
	if d.DialPod == nil {
		return nil, fmt.Errorf("dial service %s/%s: node %q cannot be reached without a tunnel server", namespace, name, node)
	}
	c, err := d.DialPod(ctx, node, addr)
	if err != nil {
		return nil, fmt.Errorf("dial service %s/%s endpoint %s on node %q: %w", namespace, name, addr, node, err)
	}
	return c, nil
}

// Endpoint returns a ready endpoint (IP:port) of the port named port of
// Service namespace/service, picked at random, and the node of its pod.
// Only endpoints that are pods of the namespace with that address are
// taken, as upstream only proxies to pods. The error is a 503 Status:
// "no endpoints available for service" naming the Service when it has no
// ready endpoint at all, or the Service and the port when none serves it.
func (d *Dialer) Endpoint(ctx context.Context, namespace, service, port string) (node, addr string, err error) {
	_, sliceKind, podKind := d.kinds()
	sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: service})
	obj, err := d.Storage.List(ctx, sliceKind, namespace, storage.ListOptions{Label: sel})
	if err != nil {
		return "", "", fmt.Errorf("list endpoints of service %s/%s: %w", namespace, service, err)
	}
	type candidate struct {
		ip, pod string
		port    int32
	}
	var cands []candidate
	anyReady := false
	for _, sl := range obj.(*discoveryv1.EndpointSliceList).Items {
		var ready []discoveryv1.Endpoint
		for _, ep := range sl.Endpoints {
			if (ep.Conditions.Ready == nil || *ep.Conditions.Ready) && len(ep.Addresses) > 0 {
				ready = append(ready, ep)
			}
		}
		anyReady = anyReady || len(ready) > 0
		for _, p := range sl.Ports {
			pn := ""
			if p.Name != nil {
				pn = *p.Name
			}
			if pn != port || p.Port == nil {
				continue
			}
			for _, ep := range ready {
				if ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" ||
					ep.TargetRef.Namespace != "" && ep.TargetRef.Namespace != namespace {
					continue
				}
				cands = append(cands, candidate{ip: ep.Addresses[0], pod: ep.TargetRef.Name, port: *p.Port})
			}
		}
	}
	if !anyReady {
		return "", "", apierrors.NewServiceUnavailable(fmt.Sprintf("no endpoints available for service %q", service))
	}
	rand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	for _, c := range cands {
		obj, err := d.Storage.Get(ctx, podKind, namespace, c.pod)
		if err != nil {
			continue
		}
		pod := obj.(*corev1.Pod)
		if pod.Spec.NodeName == "" || !podHasIP(pod, c.ip) {
			continue
		}
		return pod.Spec.NodeName, net.JoinHostPort(c.ip, strconv.Itoa(int(c.port))), nil
	}
	id := service
	if port != "" {
		id += ":" + port
	}
	return "", "", apierrors.NewServiceUnavailable(fmt.Sprintf("no endpoints available for service %q", id))
}

func podHasIP(pod *corev1.Pod, ip string) bool {
	for _, p := range pod.Status.PodIPs {
		if p.IP == ip {
			return true
		}
	}
	return pod.Status.PodIP == ip
}
