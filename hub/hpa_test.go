package hub_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

const hpaReplicaSet = `apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: frontend, labels: {tier: frontend}}
spec:
  replicas: 3
  selector: {matchLabels: {tier: frontend}}
  template:
    metadata: {labels: {tier: frontend}}
    spec: {containers: [{name: php-redis, image: us-docker.pkg.dev/google-samples/containers/gke/gb-frontend:v5}]}
`

const hpaV2Manifest = `apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: full}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 2
  maxReplicas: 10
  metrics:
  - type: Resource
    resource: {name: memory, target: {type: AverageValue, averageValue: 100Mi}}
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 60}}
  behavior:
    scaleDown:
      stabilizationWindowSeconds: 120
      policies: [{type: Pods, value: 1, periodSeconds: 60}]
`

const hpaV1Manifest = `apiVersion: autoscaling/v1
kind: HorizontalPodAutoscaler
metadata: {name: plain}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  maxReplicas: 3
`

// hpaGizmos is a custom resource without a scale subresource.
const hpaGizmos = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gizmos.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gizmos, singular: gizmo, kind: Gizmo, listKind: GizmoList}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`

// TestHorizontalPodAutoscalerAPI drives autoscaling/v2 and autoscaling/v1
// HorizontalPodAutoscalers through a real hub with a real kubectl: kubectl
// autoscale, the table, describe, explain, conversion between the
// versions, defaults, the status subresource and refused writes.
func TestHorizontalPodAutoscalerAPI(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h.MustRun("create", "deployment", "web", "--image=nginx")
	apply := func(t *testing.T, manifest string) string {
		t.Helper()
		out, err := h.RunInput(ctx, manifest, nil, "apply", "-f", "-")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	row := func(t *testing.T, name string) string {
		t.Helper()
		for _, l := range strings.Split(h.MustRun("get", "hpa"), "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[0] == name {
				// Leave out AGE.
				return strings.Join(f[:len(f)-1], " ")
			}
		}
		t.Fatalf("no row for %s", name)
		return ""
	}
	getV2 := func(t *testing.T, name string) *autoscalingv2.HorizontalPodAutoscaler {
		t.Helper()
		o, err := cs.AutoscalingV2().HorizontalPodAutoscalers("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}

	t.Run("autoscale deployment", func(t *testing.T) {
		out := h.MustRun("autoscale", "deployment", "web", "--min=1", "--max=4", "--cpu-percent=50")
		if strings.TrimSpace(out) != "horizontalpodautoscaler.autoscaling/web autoscaled" {
			t.Errorf("autoscale printed %q", out)
		}
		header := strings.Join(strings.Fields(strings.SplitN(h.MustRun("get", "hpa"), "\n", 2)[0]), " ")
		if header != "NAME REFERENCE TARGETS MINPODS MAXPODS REPLICAS AGE" {
			t.Errorf("header %q", header)
		}
		if got, want := row(t, "web"), "web Deployment/web cpu: <unknown>/50% 1 4 0"; got != want {
			t.Errorf("row %q, want %q", got, want)
		}
	})

	t.Run("autoscale replicaset", func(t *testing.T) {
		apply(t, hpaReplicaSet)
		h.MustRun("autoscale", "rs", "frontend", "--max=10", "--min=3", "--cpu-percent=50")
		if got, want := row(t, "frontend"), "frontend ReplicaSet/frontend cpu: <unknown>/50% 3 10 0"; got != want {
			t.Errorf("row %q, want %q", got, want)
		}
		hpa := getV2(t, "frontend")
		if ref := hpa.Spec.ScaleTargetRef; ref.APIVersion != "apps/v1" || ref.Kind != "ReplicaSet" {
			t.Errorf("scaleTargetRef %+v", ref)
		}
	})

	t.Run("v1 view of a v2 object", func(t *testing.T) {
		raw := h.MustRun("get", "--raw", "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers/web")
		var v1 autoscalingv1.HorizontalPodAutoscaler
		if err := json.Unmarshal([]byte(raw), &v1); err != nil {
			t.Fatal(err)
		}
		if v1.APIVersion != "autoscaling/v1" || v1.Spec.TargetCPUUtilizationPercentage == nil || *v1.Spec.TargetCPUUtilizationPercentage != 50 ||
			v1.Spec.MaxReplicas != 4 || v1.Spec.MinReplicas == nil || *v1.Spec.MinReplicas != 1 || len(v1.Annotations) != 0 {
			t.Errorf("v1 view: %s", raw)
		}
		list := h.MustRun("get", "hpa.v1.autoscaling")
		if !strings.Contains(list, "cpu: <unknown>/50%") {
			t.Errorf("v1 table:\n%s", list)
		}
	})

	t.Run("v1 create read back as v2 with defaults", func(t *testing.T) {
		apply(t, hpaV1Manifest)
		got := getV2(t, "plain")
		want := autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"},
			MinReplicas:    hpaPtr[int32](1), MaxReplicas: 3,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
				Name: "cpu", Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: hpaPtr[int32](80)}}}},
		}
		if !reflect.DeepEqual(got.Spec, want) {
			t.Errorf("spec %+v, want %+v", got.Spec, want)
		}
		if out := apply(t, hpaV1Manifest); !strings.Contains(out, "unchanged") {
			t.Errorf("second apply: %s", out)
		}
	})

	t.Run("v2 behavior defaults and v1 round trip", func(t *testing.T) {
		apply(t, hpaV2Manifest)
		b := getV2(t, "full").Spec.Behavior
		up, down := b.ScaleUp, b.ScaleDown
		if up == nil || *up.StabilizationWindowSeconds != 0 || *up.SelectPolicy != autoscalingv2.MaxChangePolicySelect ||
			!reflect.DeepEqual(up.Policies, []autoscalingv2.HPAScalingPolicy{{Type: "Pods", Value: 4, PeriodSeconds: 15}, {Type: "Percent", Value: 100, PeriodSeconds: 15}}) {
			t.Errorf("scaleUp %+v", up)
		}
		if down == nil || *down.StabilizationWindowSeconds != 120 || *down.SelectPolicy != autoscalingv2.MaxChangePolicySelect ||
			!reflect.DeepEqual(down.Policies, []autoscalingv2.HPAScalingPolicy{{Type: "Pods", Value: 1, PeriodSeconds: 60}}) {
			t.Errorf("scaleDown %+v", down)
		}
		before := getV2(t, "full")
		// A client that knows only autoscaling/v1 reads and writes it
		// back: the memory metric and the behavior survive in annotations.
		v1, err := cs.AutoscalingV1().HorizontalPodAutoscalers("default").Get(ctx, "full", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if *v1.Spec.TargetCPUUtilizationPercentage != 60 || !strings.Contains(v1.Annotations["autoscaling.alpha.kubernetes.io/metrics"], "memory") ||
			v1.Annotations["autoscaling.alpha.kubernetes.io/behavior"] == "" {
			t.Errorf("v1 view: %+v", v1)
		}
		v1.Spec.MaxReplicas = 11
		if _, err := cs.AutoscalingV1().HorizontalPodAutoscalers("default").Update(ctx, v1, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		after := getV2(t, "full")
		before.Spec.MaxReplicas = 11
		if !reflect.DeepEqual(after.Spec, before.Spec) || len(after.Annotations) != len(before.Annotations) {
			t.Errorf("after a v1 update: %+v, want %+v", after.Spec, before.Spec)
		}
		if after.Generation != before.Generation+1 {
			t.Errorf("generation %d after %d", after.Generation, before.Generation)
		}
	})

	t.Run("v1 watch sees v2 writes", func(t *testing.T) {
		w, err := cs.AutoscalingV1().HorizontalPodAutoscalers("default").Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=plain"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		h.MustRun("patch", "hpa", "plain", "--type=merge", "-p", `{"spec":{"maxReplicas":7}}`)
		timeout := time.After(10 * time.Second)
		for {
			select {
			case ev := <-w.ResultChan():
				if o, ok := ev.Object.(*autoscalingv1.HorizontalPodAutoscaler); ok && o.Spec.MaxReplicas == 7 {
					if p := o.Spec.TargetCPUUtilizationPercentage; p == nil || *p != 80 {
						t.Errorf("watched object %+v", o.Spec)
					}
					return
				}
			case <-timeout:
				t.Fatal("no v1 watch event for a v2 patch")
			}
		}
	})

	t.Run("edit with patch", func(t *testing.T) {
		h.MustRun("patch", "hpa", "web", "--type=merge", "-p", `{"spec":{"maxReplicas":6}}`)
		h.MustRun("patch", "hpa", "web", "--type=json", "-p", `[{"op":"replace","path":"/spec/minReplicas","value":2}]`)
		if got, want := row(t, "web"), "web Deployment/web cpu: <unknown>/50% 2 6 0"; got != want {
			t.Errorf("row %q, want %q", got, want)
		}
	})

	t.Run("status subresource", func(t *testing.T) {
		h.MustRun("patch", "hpa", "full", "--subresource=status", "--type=merge", "-p", `{"status":{"currentReplicas":3,"desiredReplicas":3,
			"currentMetrics":[{"type":"Resource","resource":{"name":"memory","current":{"averageValue":"50Mi"}}},
			{"type":"Resource","resource":{"name":"cpu","current":{"averageUtilization":40,"averageValue":"100m"}}}]}}`)
		if got, want := row(t, "full"), "full Deployment/web memory: 50Mi/100Mi, cpu: 40%/60% 2 11 3"; got != want {
			t.Errorf("row %q, want %q", got, want)
		}
		v1, err := cs.AutoscalingV1().HorizontalPodAutoscalers("default").Get(ctx, "full", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p := v1.Status.CurrentCPUUtilizationPercentage; p == nil || *p != 40 || v1.Status.CurrentReplicas != 3 {
			t.Errorf("v1 status %+v", v1.Status)
		}
		// The main resource keeps the stored status, in either version.
		h.MustRun("patch", "hpa", "full", "--type=merge", "-p", `{"status":{"currentReplicas":9}}`)
		v1.Annotations["autoscaling.alpha.kubernetes.io/current-metrics"] = "[]"
		v1.Status.CurrentReplicas = 7
		if _, err := cs.AutoscalingV1().HorizontalPodAutoscalers("default").Update(ctx, v1, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if got := getV2(t, "full").Status; got.CurrentReplicas != 3 || len(got.CurrentMetrics) != 2 {
			t.Errorf("status after main resource writes: %+v", got)
		}
		// A bad status write is refused.
		_, err = h.Run("patch", "hpa", "full", "--subresource=status", "--type=merge", "-p", `{"status":{"desiredReplicas":-1}}`)
		if err == nil || !strings.Contains(err.Error(), "status.desiredReplicas: Invalid value: -1: must be greater than or equal to 0") {
			t.Errorf("negative desiredReplicas: %v", err)
		}
	})

	t.Run("describe and explain", func(t *testing.T) {
		out := h.MustRun("describe", "hpa", "web")
		for _, want := range []string{"Reference:", "Deployment/web", "resource cpu on pods  (as a percentage of request):  <unknown> / 50%", "Min replicas:", "Max replicas:"} {
			if !strings.Contains(out, want) {
				t.Errorf("describe lacks %q:\n%s", want, out)
			}
		}
		out = h.MustRun("explain", "hpa.spec.behavior.scaleUp")
		if !strings.Contains(out, "KIND:       HorizontalPodAutoscaler") || !strings.Contains(out, "VERSION:    v2") || !strings.Contains(out, "stabilizationWindowSeconds") {
			t.Errorf("explain:\n%s", out)
		}
		out = h.MustRun("explain", "hpa.spec", "--api-version=autoscaling/v1")
		if !strings.Contains(out, "VERSION:    v1") || !strings.Contains(out, "targetCPUUtilizationPercentage") {
			t.Errorf("explain v1:\n%s", out)
		}
		out = h.MustRun("api-resources", "--api-group=autoscaling")
		if !strings.Contains(strings.Join(strings.Fields(out), " "), "horizontalpodautoscalers hpa autoscaling/v2 true HorizontalPodAutoscaler") {
			t.Errorf("api-resources:\n%s", out)
		}
	})

	t.Run("view and edit roles", func(t *testing.T) {
		// The roles view and edit aggregate (the aggregation controller
		// does not run here).
		h.MustRun("create", "rolebinding", "hpa-view", "--clusterrole=system:aggregate-to-view", "--serviceaccount=default:viewer")
		h.MustRun("create", "rolebinding", "hpa-edit", "--clusterrole=system:aggregate-to-edit", "--serviceaccount=default:editor")
		for _, c := range []struct{ who, verb, res, want string }{
			{"viewer", "get", "hpa", "yes"}, {"viewer", "get", "horizontalpodautoscalers/status", "yes"}, {"viewer", "create", "hpa", "no"},
			{"editor", "create", "hpa", "yes"}, {"editor", "delete", "hpa", "yes"},
		} {
			out, _ := h.Run("auth", "can-i", c.verb, c.res, "--as=system:serviceaccount:default:"+c.who)
			if strings.TrimSpace(out) != c.want {
				t.Errorf("%s can-i %s %s: %q, want %s", c.who, c.verb, c.res, out, c.want)
			}
		}
	})

	t.Run("invalid", func(t *testing.T) {
		apply(t, hpaGizmos)
		h.MustRun("apply", "-f", "testdata/crd/widgets.yaml")
		hpaWaitCRDs(t, h, "gizmos.example.com", "widgets.example.com")
		base := func(mut func(*autoscalingv2.HorizontalPodAutoscalerSpec)) *autoscalingv2.HorizontalPodAutoscaler {
			o := &autoscalingv2.HorizontalPodAutoscaler{
				ObjectMeta: metav1.ObjectMeta{Name: "bad"},
				Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
					ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"},
					MaxReplicas:    3,
				},
			}
			mut(&o.Spec)
			return o
		}
		ref := func(apiVersion, kind string) func(*autoscalingv2.HorizontalPodAutoscalerSpec) {
			return func(s *autoscalingv2.HorizontalPodAutoscalerSpec) {
				s.ScaleTargetRef.APIVersion, s.ScaleTargetRef.Kind = apiVersion, kind
			}
		}
		cases := []struct {
			name   string
			mut    func(*autoscalingv2.HorizontalPodAutoscalerSpec)
			causes []string // field: message
		}{
			{"min above max", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) { s.MinReplicas = hpaPtr[int32](5) },
				[]string{"spec.maxReplicas: Invalid value: 3: must be greater than or equal to `minReplicas`"}},
			{"min zero", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) { s.MinReplicas = hpaPtr[int32](0) },
				[]string{"spec.minReplicas: Invalid value: 0: must be greater than or equal to 1",
					"spec.metrics: Forbidden: must specify at least one Object or External metric to support scaling to zero replicas"}},
			{"unknown metric type", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) {
				s.Metrics = []autoscalingv2.MetricSpec{{Type: "Bogus"}}
			}, []string{`spec.metrics[0].type: Unsupported value: "Bogus": supported values: "ContainerResource", "External", "Object", "Pods", "Resource"`}},
			{"bad target type", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) {
				s.Metrics = []autoscalingv2.MetricSpec{{Type: "Resource", Resource: &autoscalingv2.ResourceMetricSource{Name: "cpu",
					Target: autoscalingv2.MetricTarget{Type: "Percent", AverageUtilization: hpaPtr[int32](0)}}}}
			}, []string{`spec.metrics[0].resource.target.type: Invalid value: "Percent": must be either Utilization, Value, or AverageValue`,
				"spec.metrics[0].resource.target.averageUtilization: Invalid value: 0: must be greater than 0"}},
			{"behavior bounds", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) {
				s.Behavior = &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleUp: &autoscalingv2.HPAScalingRules{
					StabilizationWindowSeconds: hpaPtr[int32](3601), Policies: []autoscalingv2.HPAScalingPolicy{{Type: "Pods", Value: 0, PeriodSeconds: 1801}}}}
			}, []string{"spec.behavior.scaleUp.stabilizationWindowSeconds: Invalid value: 3601: must be less than or equal to 3600",
				"spec.behavior.scaleUp.policies[0].value: Invalid value: 0: must be greater than zero",
				"spec.behavior.scaleUp.policies[0].periodSeconds: Invalid value: 1801: must be less than or equal to 1800"}},
			{"missing name", func(s *autoscalingv2.HorizontalPodAutoscalerSpec) { s.ScaleTargetRef.Name = "" },
				[]string{"spec.scaleTargetRef.name: Required value"}},
			{"config map", ref("v1", "ConfigMap"),
				[]string{`spec.scaleTargetRef.kind: Invalid value: "ConfigMap": ConfigMap has no scale subresource and cannot be autoscaled`}},
			{"pod", ref("v1", "Pod"),
				[]string{`spec.scaleTargetRef.kind: Invalid value: "Pod": Pod has no scale subresource and cannot be autoscaled`}},
			{"daemon set", ref("apps/v1", "DaemonSet"),
				[]string{`spec.scaleTargetRef.kind: Invalid value: "DaemonSet": DaemonSet.apps has no scale subresource and cannot be autoscaled`}},
			{"custom resource without scale", ref("example.com/v1", "Gizmo"),
				[]string{`spec.scaleTargetRef.kind: Invalid value: "Gizmo": Gizmo.example.com has no scale subresource and cannot be autoscaled`}},
		}
		for _, c := range cases {
			_, err := cs.AutoscalingV2().HorizontalPodAutoscalers("default").Create(ctx, base(c.mut), metav1.CreateOptions{})
			if got := hpaCauses(t, err); !reflect.DeepEqual(got, hpaSorted(c.causes)) {
				t.Errorf("%s: causes %q, want %q", c.name, got, c.causes)
			}
			if _, err := cs.AutoscalingV2().HorizontalPodAutoscalers("default").Get(ctx, "bad", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s: stored anyway (%v)", c.name, err)
			}
		}
		// The same rules through autoscaling/v1, with v2's field paths as
		// kube-apiserver reports them.
		_, err := cs.AutoscalingV1().HorizontalPodAutoscalers("default").Create(ctx, &autoscalingv1.HorizontalPodAutoscaler{
			ObjectMeta: metav1.ObjectMeta{Name: "bad"},
			Spec: autoscalingv1.HorizontalPodAutoscalerSpec{ScaleTargetRef: autoscalingv1.CrossVersionObjectReference{Kind: "StatefulSet", Name: "db", APIVersion: "apps/v1"},
				MinReplicas: hpaPtr[int32](4), MaxReplicas: 2, TargetCPUUtilizationPercentage: hpaPtr[int32](0)},
		}, metav1.CreateOptions{})
		want := hpaSorted([]string{"spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`",
			"spec.metrics[0].resource.target.averageUtilization: Invalid value: 0: must be greater than 0"})
		if got := hpaCauses(t, err); !reflect.DeepEqual(got, want) {
			t.Errorf("v1: causes %q, want %q", got, want)
		}
		// Scalable kinds, and kinds the hub does not serve (yet), pass.
		for i, r := range [][2]string{{"apps/v1", "StatefulSet"}, {"v1", "ReplicationController"}, {"example.com/v1", "Widget"}, {"example.org/v1", "Later"}} {
			o := base(ref(r[0], r[1]))
			o.Name = "ok" + string(rune('a'+i))
			if _, err := cs.AutoscalingV2().HorizontalPodAutoscalers("default").Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Errorf("%s %s: %v", r[0], r[1], err)
			}
		}
		// A bad update changes nothing.
		before := getV2(t, "web")
		_, err = h.Run("patch", "hpa", "web", "--type=merge", "-p", `{"spec":{"maxReplicas":0,"scaleTargetRef":{"kind":"ConfigMap","apiVersion":"v1"}}}`)
		if err == nil || !strings.Contains(err.Error(), "spec.maxReplicas: Invalid value: 0: must be greater than 0") ||
			!strings.Contains(err.Error(), `spec.scaleTargetRef.kind: Invalid value: "ConfigMap"`) {
			t.Errorf("bad patch: %v", err)
		}
		if after := getV2(t, "web"); after.ResourceVersion != before.ResourceVersion {
			t.Errorf("bad patch changed the object: %+v", after.Spec)
		}
	})
}

// hpaCauses returns the "field: message" of a 422's causes, sorted.
func hpaCauses(t *testing.T, err error) []string {
	t.Helper()
	var se apierrors.APIStatus
	if !errors.As(err, &se) || se.Status().Code != 422 || se.Status().Reason != metav1.StatusReasonInvalid || se.Status().Details == nil {
		t.Errorf("want a 422 Invalid, got %v", err)
		return nil
	}
	var out []string
	for _, c := range se.Status().Details.Causes {
		out = append(out, c.Field+": "+c.Message)
	}
	return hpaSorted(out)
}

func hpaSorted(s []string) []string {
	s = append([]string(nil), s...)
	sort.Strings(s)
	return s
}

func hpaPtr[T any](v T) *T { return &v }

// hpaWaitCRDs waits until every named CustomResourceDefinition is
// Established.
func hpaWaitCRDs(t *testing.T, h *hubtest.Hub, crds ...string) {
	t.Helper()
	for _, c := range crds {
		if _, err := h.Run("wait", "--for=condition=Established", "--timeout=30s", "crd/"+c); err != nil {
			t.Fatal(err)
		}
	}
	// Discovery and the registry follow the CRD shortly after.
	time.Sleep(200 * time.Millisecond)
}
