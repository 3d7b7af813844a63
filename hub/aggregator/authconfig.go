package aggregator

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/pki"
)

// Names of what extension API servers read to trust the hub, as
// kube-apiserver publishes them.
const (
	AuthenticationConfigMap = "extension-apiserver-authentication"
	AuthenticationReader    = "extension-apiserver-authentication-reader"
)

// authenticationData is the content of
// kube-system/extension-apiserver-authentication: the cluster CA for
// client certificates, and the request-header CA, allowed names and
// header names for front-proxy requests.
func authenticationData(clusterCA, frontProxyCA []byte) map[string]string {
	list := func(v ...string) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	d := map[string]string{
		"requestheader-client-ca-file":       string(frontProxyCA),
		"requestheader-allowed-names":        list(pki.FrontProxyClientName),
		"requestheader-username-headers":     list(headerUser),
		"requestheader-uid-headers":          list(headerUID),
		"requestheader-group-headers":        list(headerGroup),
		"requestheader-extra-headers-prefix": list(headerExtraPrefix),
	}
	if len(clusterCA) > 0 {
		d["client-ca-file"] = string(clusterCA)
	}
	return d
}

// publishAuthentication writes the ConfigMap and the Role that lets
// extension API servers read it.
func (a *Aggregator) publishAuthentication(ctx context.Context) error {
	data := authenticationData(a.cfg.ClusterCAPEM, a.cfg.FrontProxy.CAPEM)
	cms := a.kube.CoreV1().ConfigMaps(metav1.NamespaceSystem)
	cur, err := cms.Get(ctx, AuthenticationConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: AuthenticationConfigMap, Namespace: metav1.NamespaceSystem}, Data: data}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create %s: %w", AuthenticationConfigMap, err)
		}
	case err != nil:
		return fmt.Errorf("get %s: %w", AuthenticationConfigMap, err)
	case !maps.Equal(cur.Data, data):
		cur.Data = data
		if _, err := cms.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update %s: %w", AuthenticationConfigMap, err)
		}
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: AuthenticationReader, Namespace: metav1.NamespaceSystem,
			Labels: map[string]string{"kubernetes.io/bootstrapping": "rbac-defaults"}},
		Rules: []rbacv1.PolicyRule{{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{""},
			Resources: []string{"configmaps"}, ResourceNames: []string{AuthenticationConfigMap}}},
	}
	if _, err := a.kube.RbacV1().Roles(metav1.NamespaceSystem).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create role %s: %w", AuthenticationReader, err)
	}
	return nil
}
