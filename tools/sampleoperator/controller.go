package main

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// finalizer holds a Shelf until the operator has seen it deleted.
const finalizer = "sample.tether.dev/cleanup"

// reconciler keeps each Shelf's ConfigMap and status current.
type reconciler struct {
	client client.Client
	scheme *runtime.Scheme
}

// Reconcile brings one Shelf's ConfigMap, finalizer and status in line
// with its spec.
func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	var shelf Shelf
	if err := r.client.Get(ctx, req.NamespacedName, &shelf); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !shelf.DeletionTimestamp.IsZero() {
		if controllerutil.RemoveFinalizer(&shelf, finalizer) {
			logger.Info("releasing deleted shelf")
			if err := r.client.Update(ctx, &shelf); err != nil {
				return ctrl.Result{}, fmt.Errorf("remove finalizer: %w", err)
			}
		}
		return ctrl.Result{}, nil
	}
	if controllerutil.AddFinalizer(&shelf, finalizer) {
		if err := r.client.Update(ctx, &shelf); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: shelf.Namespace, Name: shelf.Name + "-books"}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.client, cm, func() error {
		cm.Data = map[string]string{"books": strconv.Itoa(int(shelf.Spec.Books)), "color": shelf.Spec.Color}
		return controllerutil.SetControllerReference(&shelf, cm, r.scheme)
	}); err != nil {
		return ctrl.Result{}, fmt.Errorf("write configmap: %w", err)
	}

	shelf.Status.ObservedGeneration = shelf.Generation
	shelf.Status.ConfigMap = cm.Name
	meta.SetStatusCondition(&shelf.Status.Conditions, metav1.Condition{
		Type:               "Ready",
		Status:             metav1.ConditionTrue,
		ObservedGeneration: shelf.Generation,
		Reason:             "ConfigMapWritten",
		Message:            fmt.Sprintf("configmap %s holds %d books", cm.Name, shelf.Spec.Books),
	})
	if err := r.client.Status().Update(ctx, &shelf); err != nil {
		return ctrl.Result{}, fmt.Errorf("write status: %w", err)
	}
	return ctrl.Result{}, nil
}
