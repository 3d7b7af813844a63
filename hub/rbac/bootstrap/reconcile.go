package bootstrap

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-helpers/auth/rbac/reconciliation"
)

// Reconcile writes the default policy through client, which must be
// allowed to write RBAC objects and ServiceAccounts (an admin). Missing
// ClusterRoles and ClusterRoleBindings are created; existing ones get the
// rules, aggregation selectors, subjects, labels and annotations they lack,
// unless annotated rbac.authorization.kubernetes.io/autoupdate: "false".
// Nothing is removed. The controllers' ServiceAccounts are created in
// kube-system if missing.
func Reconcile(ctx context.Context, client kubernetes.Interface) error {
	var errs []error
	for _, r := range ClusterRoles() {
		opts := reconciliation.ReconcileRoleOptions{
			Role:    reconciliation.ClusterRoleRuleOwner{ClusterRole: r.DeepCopy()},
			Client:  reconciliation.ClusterRoleModifier{Client: client.RbacV1().ClusterRoles()},
			Confirm: true,
		}
		if _, err := opts.Run(); err != nil {
			errs = append(errs, fmt.Errorf("reconcile clusterrole %s: %w", r.Name, err))
		}
	}
	for _, b := range ClusterRoleBindings() {
		opts := reconciliation.ReconcileRoleBindingOptions{
			RoleBinding: reconciliation.ClusterRoleBindingAdapter{ClusterRoleBinding: b.DeepCopy()},
			Client:      reconciliation.ClusterRoleBindingClientAdapter{Client: client.RbacV1().ClusterRoleBindings()},
			Confirm:     true,
		}
		if _, err := opts.Run(); err != nil {
			errs = append(errs, fmt.Errorf("reconcile clusterrolebinding %s: %w", b.Name, err))
		}
	}
	for _, c := range Controllers() {
		if err := ensureAccount(ctx, client, c.Account); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ensureAccount creates a controller's ServiceAccount if it is missing.
func ensureAccount(ctx context.Context, client kubernetes.Interface, name string) error {
	api := client.CoreV1().ServiceAccounts(SystemNamespace)
	if _, err := api.Get(ctx, name, metav1.GetOptions{}); err == nil || !apierrors.IsNotFound(err) {
		if err != nil {
			return fmt.Errorf("get serviceaccount %s/%s: %w", SystemNamespace, name, err)
		}
		return nil
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: SystemNamespace}}
	if _, err := api.Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create serviceaccount %s/%s: %w", SystemNamespace, name, err)
	}
	return nil
}

// ControllerUser returns the user name a controller acting as the
// ServiceAccount account authenticates as, and its groups.
func ControllerUser(account string) (string, []string) {
	return "system:serviceaccount:" + SystemNamespace + ":" + account,
		[]string{"system:serviceaccounts", "system:serviceaccounts:" + SystemNamespace, "system:authenticated"}
}
