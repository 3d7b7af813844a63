package storage

//lint:file-ignore SA1019 the kubernetes Service keeps its core/v1 Endpoints, as upstream writes them

import (
	"context"
	"fmt"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// BootstrapConfig describes the objects every cluster starts with.
type BootstrapConfig struct {
	// AdvertiseAddress is the IP the kubernetes Service's endpoints point
	// to; required.
	AdvertiseAddress string
	// Port is the port the API server listens on; zero means 6443.
	Port int32
	// ServiceIP is the cluster IP of the kubernetes Service; empty means
	// 10.0.0.1.
	ServiceIP string
}

// bootstrapManager is the field manager recorded for bootstrap writes.
const bootstrapManager = "kube-apiserver"

// Bootstrap creates the namespaces, the kubernetes Service with its
// Endpoints and EndpointSlice, the system PriorityClasses and, in a cluster
// without StorageClasses, the local-path one if they are missing, and
// points the endpoints at the configured address. It is safe to call at
// every start.
func (s *Storage) Bootstrap(ctx context.Context, cfg BootstrapConfig) error {
	if err := s.bootstrapSystem(ctx, cfg); err != nil {
		return err
	}
	return s.bootstrapDefaults(ctx)
}

// KeepBootstrapped recreates the system namespaces and the kubernetes
// Service with its endpoints whenever they are missing, checking every
// interval until ctx ends, as kube-apiserver's own controllers do: the
// kubernetes Service, which may be deleted, comes back without a restart.
// Zero interval means 10 seconds.
func (s *Storage) KeepBootstrapped(ctx context.Context, cfg BootstrapConfig, interval time.Duration) {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.bootstrapSystem(ctx, cfg); err != nil && ctx.Err() == nil {
			s.log.Warn("bootstrap: recreate system objects", "error", err)
		}
	}
}

// bootstrapSystem ensures what the API server itself keeps: the system
// namespaces and the kubernetes Service with its endpoints.
func (s *Storage) bootstrapSystem(ctx context.Context, cfg BootstrapConfig) error {
	ip := net.ParseIP(cfg.AdvertiseAddress)
	if ip == nil {
		return fmt.Errorf("bootstrap: advertise address %q is not an IP", cfg.AdvertiseAddress)
	}
	if cfg.Port == 0 {
		cfg.Port = 6443
	}
	if cfg.ServiceIP == "" {
		cfg.ServiceIP = "10.0.0.1"
	}
	for _, ns := range []string{metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease} {
		if err := s.ensure(ctx, "", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, nil); err != nil {
			return err
		}
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{"component": "apiserver", "provider": "kubernetes"}},
		Spec: corev1.ServiceSpec{
			Type:            corev1.ServiceTypeClusterIP,
			ClusterIP:       cfg.ServiceIP,
			ClusterIPs:      []string{cfg.ServiceIP},
			SessionAffinity: corev1.ServiceAffinityNone,
			Ports: []corev1.ServicePort{{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443,
				TargetPort: intstr.FromInt32(cfg.Port)}},
		},
	}
	if err := s.ensure(ctx, metav1.NamespaceDefault, svc, nil); err != nil {
		return err
	}
	family := discoveryv1.AddressTypeIPv4
	if ip.To4() == nil {
		family = discoveryv1.AddressTypeIPv6
	}
	addr := ip.String()
	ep := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{"endpointslice.kubernetes.io/skip-mirror": "true"}},
		Subsets: []corev1.EndpointSubset{{
			Addresses: []corev1.EndpointAddress{{IP: addr}},
			Ports:     []corev1.EndpointPort{{Name: "https", Port: cfg.Port, Protocol: corev1.ProtocolTCP}},
		}},
	}
	if err := s.ensure(ctx, metav1.NamespaceDefault, ep, func(cur runtime.Object) bool {
		c := cur.(*corev1.Endpoints)
		if apiequality.Semantic.DeepEqual(c.Subsets, ep.Subsets) {
			return false
		}
		c.Subsets = ep.Subsets
		return true
	}); err != nil {
		return err
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "tether-hub"}},
		AddressType: family,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(cfg.Port), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if err := s.ensure(ctx, metav1.NamespaceDefault, slice, func(cur runtime.Object) bool {
		c := cur.(*discoveryv1.EndpointSlice)
		if c.AddressType == slice.AddressType && apiequality.Semantic.DeepEqual(c.Endpoints, slice.Endpoints) &&
			apiequality.Semantic.DeepEqual(c.Ports, slice.Ports) {
			return false
		}
		c.AddressType, c.Endpoints, c.Ports = slice.AddressType, slice.Endpoints, slice.Ports
		return true
	}); err != nil {
		return err
	}
	return nil
}

// bootstrapDefaults creates the objects a new cluster starts with that
// users may remove for good: the system PriorityClasses and a default
// StorageClass.
func (s *Storage) bootstrapDefaults(ctx context.Context) error {
	// A cluster without StorageClasses gets tether's local-path class as
	// its default, as k3s clusters get theirs: claims without a class are
	// provisioned on the node of their first pod. A cluster whose classes
	// were all removed gets it back at the next start.
	if classes, err := s.listRaw(ctx, "storageclasses.storage.k8s.io", ""); err == nil && len(classes) == 0 {
		sc := &storagev1.StorageClass{
			ObjectMeta: metav1.ObjectMeta{Name: "local-path",
				Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
			Provisioner:       "tether.io/local-path",
			ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimDelete),
			VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		}
		if err := s.ensure(ctx, "", sc, nil); err != nil {
			return err
		}
	}
	for _, pc := range []*schedulingv1.PriorityClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "system-cluster-critical"}, Value: 2000000000,
			Description: "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary."},
		{ObjectMeta: metav1.ObjectMeta{Name: "system-node-critical"}, Value: 2000001000,
			Description: "Used for system critical pods that must not be moved from their current node."},
	} {
		if err := s.ensure(ctx, "", pc, nil); err != nil {
			return err
		}
	}
	return nil
}

// bootstrapRaceWait is how long ensure retries a create that failed while
// another hub may be creating the same object.
const bootstrapRaceWait = 10 * time.Second

// ensure creates obj unless it exists; if it exists and fix is set, fix
// edits the stored object and reports whether it changed.
func (s *Storage) ensure(ctx context.Context, namespace string, obj runtime.Object, fix func(cur runtime.Object) bool) error {
	gvks, _, err := s.scheme.ObjectKinds(obj)
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	k := s.view().byGVK[gvks[0]]
	if k == nil {
		s.log.Warn("bootstrap object of a kind that is not served", "kind", gvks[0].String())
		return nil
	}
	obj.GetObjectKind().SetGroupVersionKind(k.GVK)
	name := obj.(metav1.Object).GetName()
	// Most objects are there: look before trying a create, which would
	// run admission. Hubs starting together on one store bootstrap at
	// once: a create can then fail on what the other hub's create holds
	// (the kubernetes Service's address claimed, its object not yet
	// written), so a failed create is retried for a while as long as the
	// object does not appear.
	deadline := time.Now().Add(bootstrapRaceWait)
	for {
		if _, err := s.st.Get(ctx, s.key(k, namespace, name)); err == nil {
			break
		}
		_, err = s.Create(ctx, k, namespace, obj.DeepCopyObject(), Options{FieldManager: bootstrapManager})
		if err == nil {
			s.log.Info("bootstrap created", "kind", k.GVK.Kind, "namespace", namespace, "name", name)
			return nil
		}
		if apierrors.IsAlreadyExists(err) {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("bootstrap %s %s: %w", k.Resource, name, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	if fix == nil {
		return nil
	}
	_, err = s.GuaranteedUpdate(ctx, k, namespace, name, Options{FieldManager: bootstrapManager}, func(cur runtime.Object) (runtime.Object, error) {
		fix(cur)
		return cur, nil
	})
	if err != nil {
		return fmt.Errorf("bootstrap update %s %s: %w", k.Resource, name, err)
	}
	return nil
}
