package rbac

import (
	"context"
	"fmt"
	"sync"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

const (
	resRoles               = "roles"
	resClusterRoles        = "clusterroles"
	resRoleBindings        = "rolebindings"
	resClusterRoleBindings = "clusterrolebindings"
)

var watched = []string{resRoles, resClusterRoles, resRoleBindings, resClusterRoleBindings}

func kindOf(resource string) *registry.Kind {
	k := registry.Lookup(schema.GroupVersionResource{Group: rbacv1.GroupName, Version: "v1", Resource: resource})
	if k == nil {
		panic("rbac: kind not served: " + resource)
	}
	return k
}

// Run keeps the authorizer's view of roles and bindings current until ctx
// ends, following each kind (see storage.Follow). The index keeps the
// rules and subjects it reads, never the objects, and changes neither: it
// shares the watches' objects.
func (a *Authorizer) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, res := range watched {
		wg.Add(1)
		go func() {
			defer wg.Done()
			storage.Follow(ctx, a.cfg.Storage, kindOf(res), "", storage.FollowOptions{Shared: true, Logger: a.cfg.Logger},
				storage.FollowFuncs{
					ReplaceFunc: func(list runtime.Object) error { return a.replace(res, list) },
					ApplyFunc:   a.apply,
				})
		}()
	}
	wg.Wait()
}

// apply records a change of one RBAC object.
func (a *Authorizer) apply(ev watch.EventType, obj runtime.Object) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ev == watch.Deleted {
		a.idx.remove(obj)
		return
	}
	a.idx.set(obj)
}

// replace puts a list's objects in place of those of its kind.
func (a *Authorizer) replace(resource string, list runtime.Object) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	x := a.idx
	switch l := list.(type) {
	case *rbacv1.RoleList:
		for _, s := range x.roles {
			if s.exists {
				x.removeRole(false, s.namespace, s.name)
			}
		}
		for i := range l.Items {
			x.set(&l.Items[i])
		}
	case *rbacv1.ClusterRoleList:
		for _, s := range x.cluster {
			if s.exists {
				x.removeRole(true, "", s.name)
			}
		}
		for i := range l.Items {
			x.set(&l.Items[i])
		}
	case *rbacv1.RoleBindingList:
		for k := range x.bindings {
			if k.namespace != "" {
				x.removeBinding(k.namespace, k.name)
			}
		}
		for i := range l.Items {
			x.set(&l.Items[i])
		}
	case *rbacv1.ClusterRoleBindingList:
		for k := range x.bindings {
			if k.namespace == "" {
				x.removeBinding("", k.name)
			}
		}
		for i := range l.Items {
			x.set(&l.Items[i])
		}
	default:
		return fmt.Errorf("list %s: unexpected %T", resource, list)
	}
	a.listed[resource] = true
	if len(a.listed) == len(watched) {
		a.syncOnce.Do(func() { close(a.synced) })
	}
	return nil
}

// set adds or replaces one RBAC object.
func (x *index) set(obj runtime.Object) {
	switch o := obj.(type) {
	case *rbacv1.Role:
		x.setRole(false, o.Namespace, o.Name, o.Rules)
	case *rbacv1.ClusterRole:
		x.setRole(true, "", o.Name, o.Rules)
	case *rbacv1.RoleBinding:
		x.setBinding(o.Namespace, o.Name, o.RoleRef, o.Subjects)
	case *rbacv1.ClusterRoleBinding:
		x.setBinding("", o.Name, o.RoleRef, o.Subjects)
	}
}

// remove forgets one RBAC object.
func (x *index) remove(obj runtime.Object) {
	switch o := obj.(type) {
	case *rbacv1.Role:
		x.removeRole(false, o.Namespace, o.Name)
	case *rbacv1.ClusterRole:
		x.removeRole(true, "", o.Name)
	case *rbacv1.RoleBinding:
		x.removeBinding(o.Namespace, o.Name)
	case *rbacv1.ClusterRoleBinding:
		x.removeBinding("", o.Name)
	}
}
