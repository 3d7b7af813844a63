package statefulset_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
	"github.com/tether-edge/tether/controllers/statefulset"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-statefulset"}

func start(t *testing.T) *kittest.Env {
	t.Helper()
	e := kittest.Start(t, hubArgs, 2)
	f := e.Factory()
	c, err := statefulset.New(statefulset.Config{Client: e.ControllerClient(t, "statefulset"), Informers: f, Workers: 2, Logger: e.Log})
	if err != nil {
		t.Fatal(err)
	}
	provision(t, e, f)
	e.Run(t, f, c)
	return e
}

// provision binds every new claim to a new hostPath volume at once, as an
// Immediate-binding provisioner would: the hub serves no StorageClasses
// and runs no volume binder, and the scheduler refuses pods whose claims
// are unbound.
func provision(t *testing.T, e *kittest.Env, f informers.SharedInformerFactory) {
	_, _ = f.Core().V1().PersistentVolumeClaims().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			c := obj.(*corev1.PersistentVolumeClaim)
			if c.Spec.VolumeName != "" {
				return
			}
			ctx := context.Background()
			pv := &corev1.PersistentVolume{
				ObjectMeta: metav1.ObjectMeta{Name: "pv-" + c.Name + "-" + string(c.UID)[:8]},
				Spec: corev1.PersistentVolumeSpec{
					Capacity:    c.Spec.Resources.Requests,
					AccessModes: c.Spec.AccessModes,
					ClaimRef:    &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: c.Namespace, Name: c.Name, UID: c.UID},
					PersistentVolumeSource: corev1.PersistentVolumeSource{
						HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/" + c.Name},
					},
					PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				},
			}
			if _, err := e.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
				t.Logf("provision %s: %v", c.Name, err)
				return
			}
			patch := []byte(`{"spec":{"volumeName":"` + pv.Name + `"}}`)
			if _, err := e.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Logf("bind %s: %v", c.Name, err)
			}
		},
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("unexpected error: %v", err))
	}
	return v
}

func web(n int32) *appsv1.StatefulSet {
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To(n),
			ServiceName: "nginx",
			Selector:    &metav1.LabelSelector{MatchLabels: map[string]string{"app": "nginx"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "nginx"}},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](10),
					Containers: []corev1.Container{{Name: "nginx", Image: "registry.k8s.io/nginx-slim:0.8",
						VolumeMounts: []corev1.VolumeMount{{Name: "www", MountPath: "/usr/share/nginx/html"}}}},
				},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "www"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				},
			}},
		},
	}
}

// recorder notes, for each pod creation and deletion start, which pods
// were ready at that moment.
type recorder struct {
	mu      sync.Mutex
	ready   map[string]bool
	created []string
	readyAt map[string][]string // pod → pods ready when it was created
	deleted []string
}

func record(t *testing.T, e *kittest.Env) *recorder {
	r := &recorder{ready: map[string]bool{}, readyAt: map[string][]string{}}
	f := e.Factory()
	readyList := func() []string {
		var out []string
		for p, ok := range r.ready {
			if ok {
				out = append(out, p)
			}
		}
		slices.Sort(out)
		return out
	}
	_, _ = f.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			p := obj.(*corev1.Pod)
			r.mu.Lock()
			defer r.mu.Unlock()
			r.created = append(r.created, p.Name)
			r.readyAt[p.Name] = readyList()
			r.ready[p.Name] = kit.IsPodReady(p)
		},
		UpdateFunc: func(oldObj, cur any) {
			o, p := oldObj.(*corev1.Pod), cur.(*corev1.Pod)
			r.mu.Lock()
			defer r.mu.Unlock()
			if o.DeletionTimestamp == nil && p.DeletionTimestamp != nil {
				r.deleted = append(r.deleted, p.Name)
			}
			r.ready[p.Name] = kit.IsPodReady(p) && p.DeletionTimestamp == nil
		},
		DeleteFunc: func(obj any) {
			if p, ok := kit.Tombstone(obj).(*corev1.Pod); ok {
				r.mu.Lock()
				delete(r.ready, p.Name)
				r.mu.Unlock()
			}
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	return r
}

func (r *recorder) snapshot() (created, deleted []string, readyAt map[string][]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.created), slices.Clone(r.deleted), r.readyAt
}

func images(t *testing.T, e *kittest.Env) map[string]string {
	t.Helper()
	list := must(e.Client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=nginx"}))
	out := map[string]string{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = p.Spec.Containers[0].Image
		}
	}
	return out
}

// TestStatefulSet follows the StatefulSet concept page: ordered creation
// with stable names, hostnames and claims, reverse scale-down leaving the
// claims, a partitioned rolling update, rollout status, history and undo,
// and OnDelete.
func TestStatefulSet(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	api := e.Client.AppsV1().StatefulSets("default")
	r := record(t, e)

	e.ApplyObject(t, web(3))
	e.Kubectl(t, "rollout", "status", "statefulset/web", "--timeout=60s")
	created, _, readyAt := r.snapshot()
	if want := []string{"web-0", "web-1", "web-2"}; !slices.Equal(created, want) {
		t.Errorf("creation order %v, want %v", created, want)
	}
	for i, name := range []string{"web-1", "web-2"} {
		if !slices.Contains(readyAt[name], fmt.Sprintf("web-%d", i)) {
			t.Errorf("%s created while web-%d was not ready (ready: %v)", name, i, readyAt[name])
		}
	}
	for i := range 3 {
		p := must(e.Client.CoreV1().Pods("default").Get(ctx, fmt.Sprintf("web-%d", i), metav1.GetOptions{}))
		if p.Spec.Hostname != p.Name || p.Spec.Subdomain != "nginx" ||
			p.Labels[statefulset.PodNameLabel] != p.Name || p.Labels[statefulset.PodIndexLabel] != fmt.Sprint(i) ||
			p.Labels[appsv1.ControllerRevisionHashLabelKey] == "" {
			t.Errorf("pod %s: hostname %q subdomain %q labels %v", p.Name, p.Spec.Hostname, p.Spec.Subdomain, p.Labels)
		}
		claim := fmt.Sprintf("www-web-%d", i)
		if _, err := e.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, claim, metav1.GetOptions{}); err != nil {
			t.Errorf("claim %s: %v", claim, err)
		}
		found := false
		for _, v := range p.Spec.Volumes {
			found = found || (v.Name == "www" && v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim)
		}
		if !found {
			t.Errorf("pod %s does not mount claim %s: %+v", p.Name, claim, p.Spec.Volumes)
		}
	}

	// A deleted pod comes back with the same name.
	old := must(e.Client.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{}))
	must(struct{}{}, e.Client.CoreV1().Pods("default").Delete(ctx, "web-1", metav1.DeleteOptions{}))
	kittest.WaitFor(t, "web-1 recreated", 60*time.Second, func() (bool, error) {
		p, err := e.Client.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
		return err == nil && p.UID != old.UID && kit.IsPodReady(p), err
	})

	// Scale to 1: web-2 goes first, then web-1; the claims stay.
	e.Kubectl(t, "scale", "statefulset/web", "--replicas=1")
	kittest.WaitFor(t, "scaled to 1", 60*time.Second, func() (bool, error) {
		im := images(t, e)
		return len(im) == 1 && im["web-0"] != "", nil
	})
	_, deleted, _ := r.snapshot()
	if i, j := slices.Index(deleted, "web-2"), lastIndex(deleted, "web-1"); i < 0 || j < i {
		t.Errorf("deletion order %v, want web-2 before web-1", deleted)
	}
	claims := must(e.Client.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{}))
	if len(claims.Items) != 3 {
		t.Errorf("%d claims after scale-down, want 3 kept", len(claims.Items))
	}
	e.Kubectl(t, "scale", "statefulset/web", "--replicas=3")
	e.Kubectl(t, "rollout", "status", "statefulset/web", "--timeout=60s")

	// Partitioned update: only ordinals ≥ 2 change.
	e.Kubectl(t, "patch", "statefulset/web", "-p", `{"spec":{"updateStrategy":{"type":"RollingUpdate","rollingUpdate":{"partition":2}}}}`)
	e.Kubectl(t, "set", "image", "statefulset/web", "nginx=registry.k8s.io/nginx-slim:0.9")
	e.Kubectl(t, "rollout", "status", "statefulset/web", "--timeout=60s")
	kittest.WaitFor(t, "partitioned update", 60*time.Second, func() (bool, error) {
		im := images(t, e)
		return im["web-2"] == "registry.k8s.io/nginx-slim:0.9" && im["web-1"] == "registry.k8s.io/nginx-slim:0.8" &&
			im["web-0"] == "registry.k8s.io/nginx-slim:0.8", fmt.Errorf("images %v", im)
	})
	// A pod below the partition comes back at the old version.
	must(struct{}{}, e.Client.CoreV1().Pods("default").Delete(ctx, "web-0", metav1.DeleteOptions{}))
	time.Sleep(time.Second)
	kittest.WaitFor(t, "web-0 back at the old version", 60*time.Second, func() (bool, error) {
		p, err := e.Client.CoreV1().Pods("default").Get(ctx, "web-0", metav1.GetOptions{})
		return err == nil && p.DeletionTimestamp == nil && kit.IsPodReady(p) && p.Spec.Containers[0].Image == "registry.k8s.io/nginx-slim:0.8", err
	})
	// Partition 0 finishes the rollout, from the highest ordinal.
	e.Kubectl(t, "patch", "statefulset/web", "-p", `{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}`)
	e.Kubectl(t, "rollout", "status", "statefulset/web", "--timeout=90s")
	kittest.WaitFor(t, "all updated", 60*time.Second, func() (bool, error) {
		im := images(t, e)
		for _, v := range im {
			if v != "registry.k8s.io/nginx-slim:0.9" {
				return false, fmt.Errorf("images %v", im)
			}
		}
		return len(im) == 3, nil
	})
	set := must(api.Get(ctx, "web", metav1.GetOptions{}))
	if set.Status.CurrentRevision != set.Status.UpdateRevision || set.Status.UpdatedReplicas != 3 || set.Status.CurrentReplicas != 3 || set.Status.ReadyReplicas != 3 {
		t.Errorf("status after the rollout: %+v", set.Status)
	}

	// History and undo.
	out := e.Kubectl(t, "rollout", "history", "statefulset/web")
	if !strings.Contains(out, "1 ") || !strings.Contains(out, "2 ") {
		t.Errorf("rollout history:\n%s", out)
	}
	e.Kubectl(t, "rollout", "undo", "statefulset/web")
	e.Kubectl(t, "rollout", "status", "statefulset/web", "--timeout=90s")
	kittest.WaitFor(t, "undone", 60*time.Second, func() (bool, error) {
		im := images(t, e)
		for _, v := range im {
			if v != "registry.k8s.io/nginx-slim:0.8" {
				return false, fmt.Errorf("images %v", im)
			}
		}
		return len(im) == 3, nil
	})

	// OnDelete: a template change touches nothing until a pod is deleted.
	e.Kubectl(t, "patch", "statefulset/web", "--type=json", "-p", `[{"op":"replace","path":"/spec/updateStrategy","value":{"type":"OnDelete"}}]`)
	e.Kubectl(t, "set", "image", "statefulset/web", "nginx=registry.k8s.io/nginx-slim:1.0")
	time.Sleep(2 * time.Second)
	if im := images(t, e); im["web-2"] != "registry.k8s.io/nginx-slim:0.8" {
		t.Errorf("OnDelete updated a pod by itself: %v", im)
	}
	must(struct{}{}, e.Client.CoreV1().Pods("default").Delete(ctx, "web-1", metav1.DeleteOptions{}))
	kittest.WaitFor(t, "web-1 recreated at the new version", 60*time.Second, func() (bool, error) {
		im := images(t, e)
		return im["web-1"] == "registry.k8s.io/nginx-slim:1.0" && im["web-2"] == "registry.k8s.io/nginx-slim:0.8", fmt.Errorf("images %v", im)
	})
}

// TestStatefulSetParallelAndRetention checks Parallel pod management and
// the whenScaled: Delete claim retention policy.
func TestStatefulSetParallelAndRetention(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	s := web(3)
	s.Spec.PodManagementPolicy = appsv1.ParallelPodManagement
	s.Spec.PersistentVolumeClaimRetentionPolicy = &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
		WhenDeleted: appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
		WhenScaled:  appsv1.DeletePersistentVolumeClaimRetentionPolicyType,
	}
	e.ApplyObject(t, s)
	e.Kubectl(t, "rollout", "status", "statefulset/web", "--timeout=60s")
	e.Kubectl(t, "scale", "statefulset/web", "--replicas=1")
	kittest.WaitFor(t, "claims of scaled-away pods deleted", 60*time.Second, func() (bool, error) {
		claims, err := e.Client.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		var names []string
		for _, c := range claims.Items {
			if c.DeletionTimestamp == nil {
				names = append(names, c.Name)
			}
		}
		return slices.Equal(names, []string{"www-web-0"}), fmt.Errorf("claims %v", names)
	})
}

func lastIndex(s []string, v string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == v {
			return i
		}
	}
	return -1
}
