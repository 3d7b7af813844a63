package metrics

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// The core kinds the metrics are of.
var (
	nodesKind = mustKind(schema.GroupVersionResource{Version: "v1", Resource: "nodes"})
	podsKind  = mustKind(schema.GroupVersionResource{Version: "v1", Resource: "pods"})
)

func mustKind(gvr schema.GroupVersionResource) *registry.Kind {
	k := registry.Lookup(gvr)
	if k == nil {
		panic("metrics: kind not served: " + gvr.String())
	}
	return k
}

// The group-resources the listers metrics-server reads Nodes and Pods
// with name in their NotFound errors.
var (
	nodeListerGR = schema.GroupResource{Resource: "node"}
	podListerGR  = schema.GroupResource{Resource: "pod"}
)

// Serve returns api with the kinds of [Kinds] answered from st: get and
// list of NodeMetrics and PodMetrics, built from the Nodes and Pods api
// holds and the samples st keeps. Every other kind goes to api untouched.
func (st *Store) Serve(api storage.API) storage.API {
	return &metricsAPI{API: api, st: st}
}

// metricsAPI is the storage the API server uses when it serves the
// metrics API.
type metricsAPI struct {
	storage.API
	st *Store
}

func isNodeMetrics(k *registry.Kind) bool { return k.GroupVersionResource() == nodeMetricsResource }
func isPodMetrics(k *registry.Kind) bool  { return k.GroupVersionResource() == podMetricsResource }

// Get implements storage.API.
func (a *metricsAPI) Get(ctx context.Context, k *registry.Kind, namespace, name string) (runtime.Object, error) {
	switch {
	case isNodeMetrics(k):
		obj, err := a.API.Get(ctx, nodesKind, "", name)
		if apierrors.IsNotFound(err) {
			return nil, apierrors.NewNotFound(nodeListerGR, name)
		}
		if err != nil {
			return nil, fmt.Errorf("get node: %w", err)
		}
		m, ok := a.nodeMetrics(obj.(*corev1.Node), time.Now())
		if !ok {
			return nil, apierrors.NewNotFound(nodeMetricsGR, name)
		}
		return m, nil
	case isPodMetrics(k):
		obj, err := a.API.Get(ctx, podsKind, namespace, name)
		if apierrors.IsNotFound(err) {
			return nil, apierrors.NewNotFound(podListerGR, name)
		}
		if err != nil {
			return nil, fmt.Errorf("get pod: %w", err)
		}
		m, ok := a.podMetrics(obj.(*corev1.Pod), time.Now())
		if !ok {
			return nil, apierrors.NewNotFound(podMetricsGR, namespace+"/"+name)
		}
		return m, nil
	}
	return a.API.Get(ctx, k, namespace, name)
}

// List implements storage.API. Paging is not offered, as metrics-server
// offers none: the list holds every match.
func (a *metricsAPI) List(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (runtime.Object, error) {
	if !isNodeMetrics(k) && !isPodMetrics(k) {
		return a.API.List(ctx, k, namespace, opts)
	}
	base := storage.ListOptions{Label: opts.Label}
	now := time.Now()
	if isNodeMetrics(k) {
		obj, err := a.API.List(ctx, nodesKind, "", base)
		if err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		out := &metricsv1beta1.NodeMetricsList{Items: []metricsv1beta1.NodeMetrics{}}
		for i := range obj.(*corev1.NodeList).Items {
			n := &obj.(*corev1.NodeList).Items[i]
			if !fieldsMatch(opts.Field, &n.ObjectMeta) {
				continue
			}
			if m, ok := a.nodeMetrics(n, now); ok {
				out.Items = append(out.Items, *m)
			}
		}
		slices.SortFunc(out.Items, func(a, b metricsv1beta1.NodeMetrics) int { return strings.Compare(a.Name, b.Name) })
		return out, nil
	}
	obj, err := a.API.List(ctx, podsKind, namespace, base)
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	out := &metricsv1beta1.PodMetricsList{Items: []metricsv1beta1.PodMetrics{}}
	for i := range obj.(*corev1.PodList).Items {
		p := &obj.(*corev1.PodList).Items[i]
		if !fieldsMatch(opts.Field, &p.ObjectMeta) {
			continue
		}
		if m, ok := a.podMetrics(p, now); ok {
			out.Items = append(out.Items, *m)
		}
	}
	slices.SortFunc(out.Items, func(a, b metricsv1beta1.PodMetrics) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// ListJSON answers plain JSON lists from the store's bytes where the
// wrapped storage can, except for the metrics kinds.
func (a *metricsAPI) ListJSON(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (*storage.JSONList, bool, error) {
	jl, ok := a.API.(interface {
		ListJSON(context.Context, *registry.Kind, string, storage.ListOptions) (*storage.JSONList, bool, error)
	})
	if !ok || isNodeMetrics(k) || isPodMetrics(k) {
		return nil, false, nil
	}
	return jl.ListJSON(ctx, k, namespace, opts)
}

// ProtoItem passes a watch event's protobuf item on to the wrapped
// storage (storage.Storage.ProtoItem), except for the metrics kinds.
func (a *metricsAPI) ProtoItem(k *registry.Kind, obj runtime.Object) ([]byte, bool) {
	pi, ok := a.API.(interface {
		ProtoItem(*registry.Kind, runtime.Object) ([]byte, bool)
	})
	if !ok || isNodeMetrics(k) || isPodMetrics(k) {
		return nil, false
	}
	return pi.ProtoItem(k, obj)
}

// ListProtobuf answers plain protobuf lists from the wrapped storage's
// item encodings where it can, except for the metrics kinds.
func (a *metricsAPI) ListProtobuf(ctx context.Context, k *registry.Kind, namespace string, opts storage.ListOptions) (*storage.ProtoList, bool, error) {
	pl, ok := a.API.(interface {
		ListProtobuf(context.Context, *registry.Kind, string, storage.ListOptions) (*storage.ProtoList, bool, error)
	})
	if !ok || isNodeMetrics(k) || isPodMetrics(k) {
		return nil, false, nil
	}
	return pl.ListProtobuf(ctx, k, namespace, opts)
}

// fieldsMatch applies a field selector to the object metadata fields, as
// metrics-server does (metadata.name, metadata.namespace).
func fieldsMatch(sel fields.Selector, m *metav1.ObjectMeta) bool {
	if sel == nil || sel.Empty() {
		return true
	}
	set := fields.Set{"metadata.name": m.Name}
	if m.Namespace != "" {
		set["metadata.namespace"] = m.Namespace
	}
	return sel.Matches(set)
}

// nodeMetrics is the NodeMetrics of n, if its node has a fresh sample.
func (a *metricsAPI) nodeMetrics(n *corev1.Node, now time.Time) (*metricsv1beta1.NodeMetrics, bool) {
	u, ok := a.st.Node(n.Name)
	if !ok {
		return nil, false
	}
	return &metricsv1beta1.NodeMetrics{
		TypeMeta:   metav1.TypeMeta{Kind: "NodeMetrics", APIVersion: groupVersion.String()},
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels, CreationTimestamp: metav1.NewTime(now)},
		Timestamp:  metav1.NewTime(u.Time),
		Window:     metav1.Duration{Duration: u.Window},
		Usage:      resources(u.Usage.CPUNanoCores, u.Usage.MemoryWorkingSetBytes),
	}, true
}

// podMetrics is the PodMetrics of p, if p is Running and its node's
// fresh sample holds it.
func (a *metricsAPI) podMetrics(p *corev1.Pod, now time.Time) (*metricsv1beta1.PodMetrics, bool) {
	if p.Status.Phase != corev1.PodRunning || p.Spec.NodeName == "" {
		return nil, false
	}
	u, ok := a.st.Pod(p.Spec.NodeName, p.Namespace, p.Name)
	if !ok {
		return nil, false
	}
	m := &metricsv1beta1.PodMetrics{
		TypeMeta:   metav1.TypeMeta{Kind: "PodMetrics", APIVersion: groupVersion.String()},
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, CreationTimestamp: metav1.NewTime(now)},
		Timestamp:  metav1.NewTime(u.Time),
		Window:     metav1.Duration{Duration: u.Window},
		Containers: make([]metricsv1beta1.ContainerMetrics, len(u.Containers)),
	}
	for i, c := range u.Containers {
		m.Containers[i] = metricsv1beta1.ContainerMetrics{Name: c.Name, Usage: resources(c.Usage.CPUNanoCores, c.Usage.MemoryWorkingSetBytes)}
	}
	return m, true
}
