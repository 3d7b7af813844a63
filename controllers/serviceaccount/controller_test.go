package serviceaccount

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-serviceaccount"}

func TestNamespaceStockAgainstHub(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a hub process")
	}
	h, rc, kube := kittest.Hub(t, hubArgs)
	ca := rc.CAData
	if len(ca) == 0 {
		t.Fatal("admin kubeconfig has no CA data")
	}
	factory := informers.NewSharedInformerFactory(kube, 0)
	c, err := New(Config{Client: kube, Informers: factory, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), RootCA: ca})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		factory.Shutdown()
	}()

	stocked := func(ns string) func() (bool, error) {
		return func() (bool, error) {
			if _, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, DefaultServiceAccount, metav1.GetOptions{}); err != nil {
				return false, err
			}
			cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, RootCAConfigMap, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return cm.Data[RootCAKey] == string(ca), fmt.Errorf("ca.crt differs")
		}
	}
	// Namespaces that existed before the controller started.
	for _, ns := range []string{"default", "kube-system"} {
		kittest.WaitFor(t, "existing namespace "+ns+" stocked", 10*time.Second, stocked(ns))
	}

	h.MustRun("create", "namespace", "shop")
	kittest.WaitFor(t, "new namespace stocked", 5*time.Second, stocked("shop"))
	out := h.MustRun("get", "serviceaccount", "default", "-n", "shop", "-o", "name")
	if out != "serviceaccount/default\n" {
		t.Errorf("kubectl get serviceaccount: %q", out)
	}

	h.MustRun("delete", "configmap", RootCAConfigMap, "-n", "shop")
	h.MustRun("delete", "serviceaccount", "default", "-n", "shop")
	kittest.WaitFor(t, "deleted objects recreated", 5*time.Second, stocked("shop"))

	h.MustRun("patch", "configmap", RootCAConfigMap, "-n", "shop", "--type=merge", "-p", `{"data":{"ca.crt":"tampered"}}`)
	kittest.WaitFor(t, "changed configmap restored", 5*time.Second, stocked("shop"))

	// A terminating namespace gets nothing back and goes away.
	h.MustRun("delete", "namespace", "shop", "--wait=false")
	kittest.WaitFor(t, "namespace deleted", 60*time.Second, func() (bool, error) {
		_, err := kube.CoreV1().Namespaces().Get(ctx, "shop", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if _, err := kube.CoreV1().ServiceAccounts("shop").Get(ctx, DefaultServiceAccount, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("default service account of a deleted namespace: %v", err)
	}
}
