package controllers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/hub/rbac/bootstrap"
)

// underTest are the controllers of this package; hubArgs turn off the
// hub's own copies of them, which run in the test process instead.
var (
	underTest = []string{"garbagecollector", "namespace"}
	hubArgs   = []string{"--controllers=*,-garbagecollector,-namespace"}
)

// env is a hub with the controllers running against it.
type env struct {
	h    *hubtest.Hub
	kube kubernetes.Interface
	m    *Manager
}

func start(t *testing.T) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a hub process")
	}
	h := hubtest.Start(t, hubArgs...)
	rc, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	level := slog.LevelInfo
	if os.Getenv("TETHER_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
	// The controllers act as they do in the hub: the manager as
	// system:kube-controller-manager, each controller as its own
	// ServiceAccount, held to their RBAC roles.
	as := func(user string, groups ...string) *rest.Config {
		c, err := clientcmd.BuildConfigFromFlags("", h.UserKubeconfig(user, groups...))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	perController := func(name string) *rest.Config {
		user, groups := bootstrap.ControllerUser(bootstrap.AccountFor(name))
		return as(user, groups...)
	}
	m, err := New(Config{RestConfig: as(bootstrap.ControllerManagerUser, "system:authenticated"), ClientConfig: perController,
		Logger: log, Workers: 2, DiscoveryPeriod: 2 * time.Second, Controllers: underTest})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("controllers did not stop within 20s")
		}
	})
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return &env{h: h, kube: kube, m: m}
}

// testWriter sends log lines to the test log while the test runs.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // a log after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s (last error: %v)", what, last)
}

func ownerRef(apiVersion, kind, name string, uid types.UID, block bool) metav1.OwnerReference {
	r := metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid}
	if block {
		r.BlockOwnerDeletion = ptr.To(true)
	}
	return r
}

func (e *env) namespace(t *testing.T, name string) {
	t.Helper()
	_, err := e.kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func (e *env) configMap(t *testing.T, ns, name string, fins []string, refs ...metav1.OwnerReference) *corev1.ConfigMap {
	t.Helper()
	cm, err := e.kube.CoreV1().ConfigMaps(ns).Create(context.Background(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: refs, Finalizers: fins},
		Data:       map[string]string{"k": "v"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

func podTemplate(app string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
}

func (e *env) deployment(t *testing.T, ns, name string) *appsv1.Deployment {
	t.Helper()
	d, err := e.kube.AppsV1().Deployments(ns).Create(context.Background(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](0),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: podTemplate(name),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (e *env) replicaSet(t *testing.T, ns, name string, refs ...metav1.OwnerReference) *appsv1.ReplicaSet {
	t.Helper()
	rs, err := e.kube.AppsV1().ReplicaSets(ns).Create(context.Background(), &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: refs},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To[int32](0),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: podTemplate(name),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func gone(err error) (bool, error) {
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err == nil {
		return false, errors.New("still exists")
	}
	return false, err
}

func (e *env) configMapGone(ns, name string) func() (bool, error) {
	return func() (bool, error) {
		_, err := e.kube.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
		return gone(err)
	}
}

func (e *env) replicaSetGone(ns, name string) func() (bool, error) {
	return func() (bool, error) {
		_, err := e.kube.AppsV1().ReplicaSets(ns).Get(context.Background(), name, metav1.GetOptions{})
		return gone(err)
	}
}

func (e *env) deploymentGone(ns, name string) func() (bool, error) {
	return func() (bool, error) {
		_, err := e.kube.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
		return gone(err)
	}
}

const timeout = 30 * time.Second

// defineKind serves a namespaced custom resource of group gc.example.com,
// version v1, with any content, named after singular.
func (e *env) defineKind(t *testing.T, singular, kind string) {
	t.Helper()
	crd := fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: %[1]ss.gc.example.com}
spec:
  group: gc.example.com
  scope: Namespaced
  names: {plural: %[1]ss, singular: %[1]s, kind: %[2]s}
  versions:
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
`, singular, kind)
	if out, err := e.h.RunInput(context.Background(), crd, nil, "apply", "-f", "-"); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
}

func TestControllers(t *testing.T) {
	e := start(t)
	ctx := context.Background()

	t.Run("Background", func(t *testing.T) {
		e.namespace(t, "bg")
		rs := e.replicaSet(t, "bg", "owner")
		other := e.replicaSet(t, "bg", "other")
		e.configMap(t, "bg", "dep", nil, ownerRef("apps/v1", "ReplicaSet", "owner", rs.UID, false))
		// Same name, other UID: the owner is not there.
		e.configMap(t, "bg", "wrong-uid", nil, ownerRef("apps/v1", "ReplicaSet", "other", "0a0a0a0a-0000-0000-0000-000000000000", false))
		// One owner left: it stays, without the reference to the gone one.
		e.configMap(t, "bg", "two-owners", nil,
			ownerRef("apps/v1", "ReplicaSet", "owner", rs.UID, false),
			ownerRef("apps/v1", "ReplicaSet", "other", other.UID, false))
		e.configMap(t, "bg", "kept", nil, ownerRef("apps/v1", "ReplicaSet", "other", other.UID, false))
		// An owner of a kind the hub does not serve is never taken as gone.
		e.configMap(t, "bg", "unknown-kind", nil, ownerRef("example.com/v1", "Widget", "w", "0b0b0b0b-0000-0000-0000-000000000000", false))

		waitFor(t, "configmap with a wrong owner UID deleted", timeout, e.configMapGone("bg", "wrong-uid"))
		e.h.MustRun("delete", "-n", "bg", "replicaset", "owner")
		waitFor(t, "dependent deleted", timeout, e.configMapGone("bg", "dep"))
		waitFor(t, "reference to the deleted owner removed", timeout, func() (bool, error) {
			cm, err := e.kube.CoreV1().ConfigMaps("bg").Get(ctx, "two-owners", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return len(cm.OwnerReferences) == 1 && cm.OwnerReferences[0].UID == other.UID, fmt.Errorf("owners %v", cm.OwnerReferences)
		})
		time.Sleep(time.Second)
		if _, err := e.kube.CoreV1().ConfigMaps("bg").Get(ctx, "kept", metav1.GetOptions{}); err != nil {
			t.Fatalf("dependent of a live owner: %v", err)
		}
		if _, err := e.kube.CoreV1().ConfigMaps("bg").Get(ctx, "unknown-kind", metav1.GetOptions{}); err != nil {
			t.Fatalf("dependent of an owner of an unserved kind: %v", err)
		}
	})

	t.Run("ClusterScopedOwner", func(t *testing.T) {
		e.namespace(t, "cluster-owner")
		cr, err := e.kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gc-owner"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		e.configMap(t, "cluster-owner", "dep", nil, ownerRef("rbac.authorization.k8s.io/v1", "ClusterRole", "gc-owner", cr.UID, false))
		time.Sleep(time.Second)
		if _, err := e.kube.CoreV1().ConfigMaps("cluster-owner").Get(ctx, "dep", metav1.GetOptions{}); err != nil {
			t.Fatalf("dependent of a live cluster-scoped owner: %v", err)
		}
		e.h.MustRun("delete", "clusterrole", "gc-owner")
		waitFor(t, "dependent of a cluster-scoped owner deleted", timeout, e.configMapGone("cluster-owner", "dep"))
	})

	t.Run("NamespacedOwnerElsewhere", func(t *testing.T) {
		e.namespace(t, "ns-a")
		e.namespace(t, "ns-b")
		rs := e.replicaSet(t, "ns-a", "owner")
		// A namespaced owner owns nothing outside its namespace.
		e.configMap(t, "ns-b", "dep", nil, ownerRef("apps/v1", "ReplicaSet", "owner", rs.UID, false))
		waitFor(t, "dependent in another namespace deleted", timeout, e.configMapGone("ns-b", "dep"))
		if _, err := e.kube.AppsV1().ReplicaSets("ns-a").Get(ctx, "owner", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Foreground", func(t *testing.T) {
		e.namespace(t, "fg")
		d := e.deployment(t, "fg", "web")
		rs := e.replicaSet(t, "fg", "web-1", ownerRef("apps/v1", "Deployment", "web", d.UID, true))
		// The grandchild holds on with a finalizer of its own.
		e.configMap(t, "fg", "held", []string{"example.com/hold"}, ownerRef("apps/v1", "ReplicaSet", "web-1", rs.UID, true))
		e.configMap(t, "fg", "loose", nil, ownerRef("apps/v1", "Deployment", "web", d.UID, false))

		fg := metav1.DeletePropagationForeground
		if err := e.kube.AppsV1().Deployments("fg").Delete(ctx, "web", metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "grandchild being deleted", timeout, func() (bool, error) {
			cm, err := e.kube.CoreV1().ConfigMaps("fg").Get(ctx, "held", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return cm.DeletionTimestamp != nil, nil
		})
		waitFor(t, "non-blocking dependent deleted", timeout, e.configMapGone("fg", "loose"))
		time.Sleep(time.Second)
		got, err := e.kube.AppsV1().Deployments("fg").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("owner went before its dependents: %v", err)
		}
		if got.DeletionTimestamp == nil || !strings.Contains(strings.Join(got.Finalizers, ","), metav1.FinalizerDeleteDependents) {
			t.Fatalf("owner not being deleted in the foreground: %+v", got.ObjectMeta)
		}
		rsNow, err := e.kube.AppsV1().ReplicaSets("fg").Get(ctx, "web-1", metav1.GetOptions{})
		if err != nil || rsNow.DeletionTimestamp == nil {
			t.Fatalf("child not being deleted in the foreground: %v %+v", err, rsNow)
		}

		// Release the grandchild: the whole tree goes, bottom up.
		e.h.MustRun("patch", "-n", "fg", "configmap", "held", "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
		waitFor(t, "grandchild deleted", timeout, e.configMapGone("fg", "held"))
		waitFor(t, "child deleted", timeout, e.replicaSetGone("fg", "web-1"))
		waitFor(t, "owner deleted", timeout, e.deploymentGone("fg", "web"))
	})

	t.Run("KubectlForeground", func(t *testing.T) {
		e.namespace(t, "kfg")
		d := e.deployment(t, "kfg", "web")
		rs := e.replicaSet(t, "kfg", "web-1", ownerRef("apps/v1", "Deployment", "web", d.UID, true))
		e.configMap(t, "kfg", "cm", nil, ownerRef("apps/v1", "ReplicaSet", "web-1", rs.UID, true))
		e.h.MustRun("delete", "-n", "kfg", "deploy", "web", "--cascade=foreground")
		for _, check := range []func() (bool, error){e.deploymentGone("kfg", "web"), e.replicaSetGone("kfg", "web-1"), e.configMapGone("kfg", "cm")} {
			if ok, err := check(); !ok {
				t.Fatalf("after kubectl returned: %v", err)
			}
		}
	})

	t.Run("Orphan", func(t *testing.T) {
		e.namespace(t, "orphan")
		d := e.deployment(t, "orphan", "web")
		e.replicaSet(t, "orphan", "web-1", ownerRef("apps/v1", "Deployment", "web", d.UID, true))
		other := e.deployment(t, "orphan", "other")
		e.replicaSet(t, "orphan", "web-2",
			ownerRef("apps/v1", "Deployment", "web", d.UID, true),
			ownerRef("apps/v1", "Deployment", "other", other.UID, false))
		e.h.MustRun("delete", "-n", "orphan", "deploy", "web", "--cascade=orphan")
		if ok, err := e.deploymentGone("orphan", "web")(); !ok {
			t.Fatalf("owner after kubectl returned: %v", err)
		}
		rs1, err := e.kube.AppsV1().ReplicaSets("orphan").Get(ctx, "web-1", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("orphaned dependent: %v", err)
		}
		if len(rs1.OwnerReferences) != 0 {
			t.Fatalf("orphaned dependent keeps owners %v", rs1.OwnerReferences)
		}
		rs2, err := e.kube.AppsV1().ReplicaSets("orphan").Get(ctx, "web-2", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("orphaned dependent: %v", err)
		}
		if len(rs2.OwnerReferences) != 1 || rs2.OwnerReferences[0].UID != other.UID {
			t.Fatalf("orphaned dependent has owners %v, want only the other", rs2.OwnerReferences)
		}
		time.Sleep(time.Second)
		if _, err := e.kube.AppsV1().ReplicaSets("orphan").Get(ctx, "web-1", metav1.GetOptions{}); err != nil {
			t.Fatalf("orphaned dependent deleted later: %v", err)
		}
	})

	t.Run("Namespace", func(t *testing.T) {
		e.namespace(t, "doomed")
		e.configMap(t, "doomed", "cm", nil)
		e.deployment(t, "doomed", "web")
		if _, err := e.kube.CoreV1().Secrets("doomed").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.kube.CoreV1().Pods("doomed").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p"},
			Spec:       podTemplate("p").Spec,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// A pod on a node is deleted gracefully: it stays until its node
		// agent confirms, here played by the test.
		if _, err := e.kube.CoreV1().Pods("doomed").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "running"},
			Spec:       func() corev1.PodSpec { s := podTemplate("p").Spec; s.NodeName = "edge-1"; return s }(),
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Content held by a finalizer keeps the namespace until released.
		e.configMap(t, "doomed", "held", []string{"example.com/hold"})

		if err := e.kube.CoreV1().Namespaces().Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "content deleted", timeout, func() (bool, error) {
			cms, err := e.kube.CoreV1().ConfigMaps("doomed").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			pods, err := e.kube.CoreV1().Pods("doomed").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			deps, err := e.kube.AppsV1().Deployments("doomed").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			terminating := len(pods.Items) == 1 && pods.Items[0].Name == "running" && pods.Items[0].DeletionTimestamp != nil
			return len(cms.Items) == 1 && cms.Items[0].Name == "held" && terminating && len(deps.Items) == 0,
				fmt.Errorf("%d configmaps, %d pods, %d deployments", len(cms.Items), len(pods.Items), len(deps.Items))
		})
		e.h.MustRun("delete", "-n", "doomed", "pod", "running", "--grace-period=0", "--force")
		waitFor(t, "conditions report the remaining finalizer", timeout, func() (bool, error) {
			ns, err := e.kube.CoreV1().Namespaces().Get(ctx, "doomed", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range ns.Status.Conditions {
				if c.Type == corev1.NamespaceFinalizersRemaining && c.Status == corev1.ConditionTrue {
					return ns.Status.Phase == corev1.NamespaceTerminating, nil
				}
			}
			return false, fmt.Errorf("conditions %+v", ns.Status.Conditions)
		})
		e.h.MustRun("patch", "-n", "doomed", "configmap", "held", "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
		waitFor(t, "namespace deleted", timeout, func() (bool, error) {
			_, err := e.kube.CoreV1().Namespaces().Get(ctx, "doomed", metav1.GetOptions{})
			return gone(err)
		})
	})

	t.Run("KubectlDeleteNamespace", func(t *testing.T) {
		e.namespace(t, "kdoomed")
		e.configMap(t, "kdoomed", "cm", nil)
		e.replicaSet(t, "kdoomed", "rs")
		e.h.MustRun("delete", "namespace", "kdoomed")
		if _, err := e.kube.CoreV1().Namespaces().Get(ctx, "kdoomed", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("namespace after kubectl returned: %v", err)
		}
	})

	t.Run("OwnerKindServedLater", func(t *testing.T) {
		// A dependent whose owner's kind is not served yet is kept, and
		// looked at again once it is: the owner is not there, so it goes.
		e.namespace(t, "later")
		e.configMap(t, "later", "dep", nil, ownerRef("gc.example.com/v1", "Sprocket", "s", "0c0c0c0c-0000-0000-0000-000000000000", false))
		time.Sleep(time.Second)
		if _, err := e.kube.CoreV1().ConfigMaps("later").Get(ctx, "dep", metav1.GetOptions{}); err != nil {
			t.Fatalf("dependent of an owner of an unserved kind: %v", err)
		}
		e.defineKind(t, "sprocket", "Sprocket")
		waitFor(t, "dependent of an absent owner of a newly served kind deleted", timeout, e.configMapGone("later", "dep"))
	})

	t.Run("DeletedResourceUnwatched", func(t *testing.T) {
		gr := schema.GroupResource{Group: "gc.example.com", Resource: "gadgets"}
		e.defineKind(t, "gadget", "Gadget")
		var w *watchedResource
		waitFor(t, "an informer of the custom resource", timeout, func() (bool, error) {
			w = e.m.watchedFor(gr)
			return w != nil && w.informer.HasSynced(), nil
		})
		e.h.MustRun("delete", "crd", "gadgets.gc.example.com")
		waitFor(t, "the informer of the deleted resource dropped", timeout, func() (bool, error) {
			return e.m.watchedFor(gr) == nil, nil
		})
		waitFor(t, "the dropped informer stopped", timeout, func() (bool, error) {
			return w.informer.IsStopped(), nil
		})
		if e.m.watchedFor(schema.GroupResource{Resource: "configmaps"}) == nil {
			t.Errorf("configmaps no longer watched")
		}
	})
}
