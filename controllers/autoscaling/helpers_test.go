package autoscaling

import (
	"context"
	"fmt"
	"sync"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/scale"
	"k8s.io/client-go/tools/cache"
)

// t0 is the fake clock's start.
var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// fakeMetrics is a MetricsSource returning fixed samples by pod name.
type fakeMetrics struct {
	mu      sync.Mutex
	samples map[string]PodMetric
	err     error
	calls   int
}

func (f *fakeMetrics) set(samples map[string]PodMetric) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.samples = samples
}

func (f *fakeMetrics) ResourceMetric(_ context.Context, _ corev1.ResourceName, _ string, _ labels.Selector, _ string) (PodMetrics, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, time.Time{}, f.err
	}
	out := PodMetrics{}
	for k, v := range f.samples {
		out[k] = v
	}
	return out, t0, nil
}

// sample is a sample of v millicores taken at now over 30s.
func sample(v int64, now time.Time) PodMetric {
	return PodMetric{Value: v, Timestamp: now, Window: 30 * time.Second}
}

// podOpt changes a test pod.
type podOpt func(*corev1.Pod)

// testPod is a running pod of app=web on node n1, started ten minutes
// before t0 and ready since nine, with one container requesting 1 CPU and
// 1Gi.
func testPod(name string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{
			Name: "app",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi"),
			}},
		}}},
		Status: corev1.PodStatus{
			Phase:     corev1.PodRunning,
			StartTime: &metav1.Time{Time: t0.Add(-10 * time.Minute)},
			Conditions: []corev1.PodCondition{{
				Type: corev1.PodReady, Status: corev1.ConditionTrue,
				LastTransitionTime: metav1.Time{Time: t0.Add(-9 * time.Minute)},
			}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// unready makes a pod that started recently and is not ready yet.
func unready(p *corev1.Pod) {
	p.Status.StartTime = &metav1.Time{Time: t0.Add(-time.Minute)}
	p.Status.Conditions[0].Status = corev1.ConditionFalse
	p.Status.Conditions[0].LastTransitionTime = metav1.Time{Time: t0.Add(-time.Minute)}
}

func onNode(n string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }

func podLister(pods ...*corev1.Pod) (corelisters.PodLister, cache.Indexer) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, p := range pods {
		_ = idx.Add(p)
	}
	return corelisters.NewPodLister(idx), idx
}

// fakeScales is an in-memory /scale of targets, by namespace/name.
type fakeScales struct {
	mu      sync.Mutex
	scales  map[string]*autoscalingv1.Scale
	updates []int32
	failing error
}

func newFakeScales() *fakeScales { return &fakeScales{scales: map[string]*autoscalingv1.Scale{}} }

func (f *fakeScales) put(ns, name string, replicas int32, selector string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scales[ns+"/"+name] = &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       autoscalingv1.ScaleSpec{Replicas: replicas},
		Status:     autoscalingv1.ScaleStatus{Replicas: replicas, Selector: selector},
	}
}

func (f *fakeScales) replicas(ns, name string) int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.scales[ns+"/"+name].Spec.Replicas
}

func (f *fakeScales) Scales(ns string) scale.ScaleInterface { return fakeScaleNS{f, ns} }

type fakeScaleNS struct {
	f  *fakeScales
	ns string
}

func (s fakeScaleNS) Get(_ context.Context, gr schema.GroupResource, name string, _ metav1.GetOptions) (*autoscalingv1.Scale, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	sc, ok := s.f.scales[s.ns+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(gr, name)
	}
	return sc.DeepCopy(), nil
}

func (s fakeScaleNS) Update(_ context.Context, gr schema.GroupResource, sc *autoscalingv1.Scale, _ metav1.UpdateOptions) (*autoscalingv1.Scale, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if s.f.failing != nil {
		return nil, s.f.failing
	}
	cur, ok := s.f.scales[s.ns+"/"+sc.Name]
	if !ok {
		return nil, apierrors.NewNotFound(gr, sc.Name)
	}
	cur.Spec.Replicas = sc.Spec.Replicas
	cur.Status.Replicas = sc.Spec.Replicas
	s.f.updates = append(s.f.updates, sc.Spec.Replicas)
	return cur.DeepCopy(), nil
}

func (s fakeScaleNS) Patch(context.Context, schema.GroupVersionResource, string, types.PatchType, []byte, metav1.PatchOptions) (*autoscalingv1.Scale, error) {
	return nil, fmt.Errorf("patch not supported by the fake")
}
