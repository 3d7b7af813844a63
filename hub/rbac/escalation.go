package rbac

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/component-helpers/auth/rbac/validation"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// Admitter returns the escalation prevention of role and binding writes,
// as upstream's RBAC storage does it: a user may create or update a Role
// or ClusterRole only if they hold every permission it grants, in its
// namespace (or cluster-wide), or may escalate roles; setting or removing
// an aggregationRule needs everything on everything; a RoleBinding or
// ClusterRoleBinding only if they may bind the role it references, or
// hold all of that role's permissions in the binding's namespace (a role
// that does not exist is then NotFound). Members of system:masters, and
// writes without a user (the hub's own), are not checked. The value also
// implements storage.UpdateAdmitter.
func (a *Authorizer) Admitter() storage.Admitter { return admitter{a} }

type admitter struct{ a *Authorizer }

var _ storage.UpdateAdmitter = admitter{}

// AdmitCreate implements storage.Admitter.
func (ad admitter) AdmitCreate(ctx context.Context, k *registry.Kind, obj runtime.Object, _ bool) (func(), error) {
	return nil, ad.check(ctx, k, obj, nil)
}

// AdmitUpdate implements storage.UpdateAdmitter.
func (ad admitter) AdmitUpdate(ctx context.Context, k *registry.Kind, obj, old runtime.Object, _ bool) error {
	return ad.check(ctx, k, obj, old)
}

func (ad admitter) check(ctx context.Context, k *registry.Kind, obj, old runtime.Object) error {
	if k.GVK.Group != rbacv1.GroupName {
		return nil
	}
	u, ok := auth.UserFrom(ctx)
	if !ok || u == nil || u.InGroup(pki.AdminGroup) {
		return nil
	}
	if old != nil && onlyGCFields(obj, old) {
		return nil
	}
	// The escalate check names the object only on updates: a create's
	// URL carries no name, and upstream asks with the URL's.
	name := ""
	if old != nil {
		if m, err := meta.Accessor(old); err == nil {
			name = m.GetName()
		}
	}
	switch o := obj.(type) {
	case *rbacv1.Role:
		if ad.mayEscalate(u, resRoles, o.Namespace, name) {
			return nil
		}
		return ad.confirm(u, resRoles, o.Namespace, o.Name, o.Rules)
	case *rbacv1.ClusterRole:
		if ad.mayEscalate(u, resClusterRoles, "", name) {
			return nil
		}
		if err := ad.confirm(u, resClusterRoles, "", o.Name, o.Rules); err != nil {
			return err
		}
		was, _ := old.(*rbacv1.ClusterRole)
		if aggregated(o) || aggregated(was) {
			if err := ad.confirm(u, resClusterRoles, "", o.Name, fullAuthority); err != nil {
				return apierrors.NewForbidden(rbacResource(resClusterRoles), o.Name, errors.New("must have cluster-admin privileges to use the aggregationRule"))
			}
		}
	case *rbacv1.RoleBinding:
		return ad.checkBinding(ctx, u, resRoleBindings, o.Namespace, o.Name, o.RoleRef)
	case *rbacv1.ClusterRoleBinding:
		return ad.checkBinding(ctx, u, resClusterRoleBindings, "", o.Name, o.RoleRef)
	}
	return nil
}

func rbacResource(resource string) schema.GroupResource {
	return schema.GroupResource{Group: rbacv1.GroupName, Resource: resource}
}

func aggregated(r *rbacv1.ClusterRole) bool {
	return r != nil && r.AggregationRule != nil && len(r.AggregationRule.ClusterRoleSelectors) > 0
}

// mayEscalate reports whether u may escalate roles or clusterroles.
func (ad admitter) mayEscalate(u *auth.User, resource, namespace, name string) bool {
	return ad.a.Authorize(u, apiserver.Attributes{
		Verb: "escalate", Resource: true, Group: rbacv1.GroupName, Version: "*",
		Kind: resource, Namespace: namespace, Name: name,
	}) == nil
}

// checkBinding lets u write a binding to ref in namespace ("" for a
// ClusterRoleBinding) when u may bind the role or holds its rules.
func (ad admitter) checkBinding(ctx context.Context, u *auth.User, resource, namespace, name string, ref rbacv1.RoleRef) error {
	at := apiserver.Attributes{Verb: "bind", Resource: true, Group: ref.APIGroup, Namespace: namespace, Name: ref.Name}
	switch ref.Kind {
	case "ClusterRole":
		at.Kind = resClusterRoles
	case "Role":
		at.Kind = resRoles
	}
	if at.Kind != "" && ad.a.Authorize(u, at) == nil {
		return nil
	}
	rules, err := ad.roleRules(ctx, ref, namespace)
	if err != nil {
		return err
	}
	return ad.confirm(u, resource, namespace, name, rules)
}

// roleRules reads the rules of a referenced role from storage, as
// upstream's registry does: a missing role is NotFound.
func (ad admitter) roleRules(ctx context.Context, ref rbacv1.RoleRef, namespace string) ([]rbacv1.PolicyRule, error) {
	switch ref.Kind {
	case "Role":
		obj, err := ad.a.cfg.Storage.Get(ctx, kindOf(resRoles), namespace, ref.Name)
		if err != nil {
			return nil, err
		}
		return obj.(*rbacv1.Role).Rules, nil
	case "ClusterRole":
		obj, err := ad.a.cfg.Storage.Get(ctx, kindOf(resClusterRoles), "", ref.Name)
		if err != nil {
			return nil, err
		}
		return obj.(*rbacv1.ClusterRole).Rules, nil
	}
	return nil, fmt.Errorf("unsupported role reference kind: %q", ref.Kind)
}

// confirm refuses, with upstream's message, rules that u does not hold in
// namespace.
func (ad admitter) confirm(u *auth.User, resource, namespace, name string, rules []rbacv1.PolicyRule) error {
	owner, missing := ad.a.rulesFor(u, namespace)
	covered, lacking := validation.Covers(owner, rules)
	if covered {
		return nil
	}
	descs := sets.New[string]()
	for _, r := range compactRules(lacking) {
		descs.Insert(compactString(r))
	}
	msg := fmt.Sprintf("user %q (groups=%q) is attempting to grant RBAC permissions not currently held:\n%s",
		u.Name, u.Groups, strings.Join(sets.List(descs), "\n"))
	if len(missing) > 0 {
		msg += fmt.Sprintf("; resolution errors: %v", []error{notFound(missing, true)})
	}
	return apierrors.NewForbidden(rbacResource(resource), name, errors.New(msg))
}

// onlyGCFields reports whether an update changes nothing but owner
// references and finalizers, which the garbage collector may always do.
func onlyGCFields(obj, old runtime.Object) bool {
	c := obj.DeepCopyObject()
	cm, err := meta.Accessor(c)
	if err != nil {
		return false
	}
	om, err := meta.Accessor(old)
	if err != nil {
		return false
	}
	c.GetObjectKind().SetGroupVersionKind(old.GetObjectKind().GroupVersionKind())
	cm.SetOwnerReferences(om.GetOwnerReferences())
	cm.SetFinalizers(om.GetFinalizers())
	cm.SetResourceVersion(om.GetResourceVersion())
	cm.SetManagedFields(om.GetManagedFields())
	cm.SetGeneration(om.GetGeneration())
	return apiequality.Semantic.DeepEqual(c, old)
}

// simpleKey identifies a rule of one group, one resource and at most one
// resource name.
type simpleKey struct {
	group, resource string
	named           bool
	name            string
}

// compactRules merges the rules that differ only in their verbs and
// name one group and one resource (and at most one resource name), as
// the breakdown of a Covers check produces them.
func compactRules(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	out := make([]rbacv1.PolicyRule, 0, len(rules))
	simple := map[simpleKey]*rbacv1.PolicyRule{}
	var order []simpleKey
	for _, r := range rules {
		k, ok := simpleRule(&r)
		if !ok {
			out = append(out, r)
			continue
		}
		if have, ok := simple[k]; ok {
			for _, v := range r.Verbs {
				if !sets.New(have.Verbs...).Has(v) {
					have.Verbs = append(have.Verbs, v)
				}
			}
			continue
		}
		simple[k] = r.DeepCopy()
		order = append(order, k)
	}
	for _, k := range order {
		out = append(out, *simple[k])
	}
	return out
}

func simpleRule(r *rbacv1.PolicyRule) (simpleKey, bool) {
	if len(r.ResourceNames) > 1 || len(r.NonResourceURLs) > 0 || len(r.APIGroups) != 1 || len(r.Resources) != 1 {
		return simpleKey{}, false
	}
	only := rbacv1.PolicyRule{APIGroups: r.APIGroups, Resources: r.Resources, Verbs: r.Verbs, ResourceNames: r.ResourceNames}
	if !reflect.DeepEqual(&only, r) {
		return simpleKey{}, false
	}
	k := simpleKey{group: r.APIGroups[0], resource: r.Resources[0]}
	if len(r.ResourceNames) == 1 {
		k.named, k.name = true, r.ResourceNames[0]
	}
	return k, true
}

// compactString is the short form of a rule in escalation messages:
// {APIGroups:["apps"], Resources:["deployments"], Verbs:["get"]}.
func compactString(r rbacv1.PolicyRule) string {
	var parts []string
	add := func(label string, v []string) {
		if len(v) > 0 {
			parts = append(parts, fmt.Sprintf("%s:%q", label, v))
		}
	}
	add("APIGroups", r.APIGroups)
	add("Resources", r.Resources)
	add("NonResourceURLs", r.NonResourceURLs)
	add("ResourceNames", r.ResourceNames)
	add("Verbs", r.Verbs)
	return "{" + strings.Join(parts, ", ") + "}"
}
