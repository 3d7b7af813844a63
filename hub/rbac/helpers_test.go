package rbac

import (
	"io"
	"log/slog"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fixture returns an authorizer whose view holds objs, without storage.
func fixture(objs ...runtime.Object) *Authorizer {
	a := New(Config{Logger: quiet})
	for _, o := range objs {
		a.idx.set(o)
	}
	return a
}

func rule(verbs, groups, resources []string, names ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{Verbs: verbs, APIGroups: groups, Resources: resources, ResourceNames: names}
}

func urlRule(verbs []string, urls ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{Verbs: verbs, NonResourceURLs: urls}
}

func l(s ...string) []string { return s }

func role(ns, name string, rules ...rbacv1.PolicyRule) *rbacv1.Role {
	return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: rules}
}

func clusterRole(name string, rules ...rbacv1.PolicyRule) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
}

func ref(kind, name string) rbacv1.RoleRef {
	return rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: name}
}

func roleBinding(ns, name string, r rbacv1.RoleRef, subjects ...rbacv1.Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, RoleRef: r, Subjects: subjects}
}

func clusterRoleBinding(name string, r rbacv1.RoleRef, subjects ...rbacv1.Subject) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, RoleRef: r, Subjects: subjects}
}

func userSubject(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
}

func groupSubject(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: name}
}

func saSubject(ns, name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}
}

func user(name string, groups ...string) *auth.User {
	return &auth.User{Name: name, Groups: append(groups, auth.GroupAuthenticated)}
}

// res is a resource request: verb, group, resource[/subresource], namespace, name.
func res(verb, group, resource, ns, name string) apiserver.Attributes {
	at := apiserver.Attributes{Verb: verb, Resource: true, Group: group, Version: "v1", Namespace: ns, Name: name, Kind: resource}
	for i := range resource {
		if resource[i] == '/' {
			at.Kind, at.Subresource = resource[:i], resource[i+1:]
			break
		}
	}
	return at
}

func path(verb, p string) apiserver.Attributes {
	return apiserver.Attributes{Verb: verb, Path: p}
}

type errString string

func (e errString) Error() string { return string(e) }

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func nsObj(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}
