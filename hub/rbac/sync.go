package rbac

import (
	"context"
	"fmt"
	"sync"
	"time"

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
// ends: for each kind a list, then a watch from its revision, and again
// after a watch ends.
func (a *Authorizer) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, res := range watched {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := kindOf(res)
			for ctx.Err() == nil {
				if err := a.follow(ctx, k); err != nil && ctx.Err() == nil {
					a.cfg.Logger.Warn("rbac authorizer: watch ended; starting again", "resource", res, "err", err)
					select {
					case <-ctx.Done():
					case <-time.After(time.Second):
					}
				}
			}
		}()
	}
	wg.Wait()
}

func (a *Authorizer) follow(ctx context.Context, k *registry.Kind) error {
	obj, err := a.cfg.Storage.List(ctx, k, "", storage.ListOptions{})
	if err != nil {
		return fmt.Errorf("list %s: %w", k.Resource, err)
	}
	rv, err := a.replace(k.Resource, obj)
	if err != nil {
		return err
	}
	// The index keeps the rules and subjects it reads, never the
	// objects, and changes neither: it may share the decoded changes
	// with the other watches.
	w, err := a.cfg.Storage.Watch(ctx, k, "", storage.WatchOptions{ResourceVersion: rv, Shared: true})
	if err != nil {
		return fmt.Errorf("watch %s: %w", k.Resource, err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("watch %s: closed", k.Resource)
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				a.mu.Lock()
				a.idx.set(ev.Object)
				a.mu.Unlock()
			case watch.Deleted:
				a.mu.Lock()
				a.idx.remove(ev.Object)
				a.mu.Unlock()
			case watch.Error:
				return fmt.Errorf("watch %s: %v", k.Resource, ev.Object)
			}
		}
	}
}

// replace puts a list's objects in place of those of its kind and
// returns the list's resourceVersion.
func (a *Authorizer) replace(resource string, list runtime.Object) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	x := a.idx
	var rv string
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
		rv = l.ResourceVersion
	case *rbacv1.ClusterRoleList:
		for _, s := range x.cluster {
			if s.exists {
				x.removeRole(true, "", s.name)
			}
		}
		for i := range l.Items {
			x.set(&l.Items[i])
		}
		rv = l.ResourceVersion
	case *rbacv1.RoleBindingList:
		for k := range x.bindings {
			if k.namespace != "" {
				x.removeBinding(k.namespace, k.name)
			}
		}
		for i := range l.Items {
			x.set(&l.Items[i])
		}
		rv = l.ResourceVersion
	case *rbacv1.ClusterRoleBindingList:
		for k := range x.bindings {
			if k.namespace == "" {
				x.removeBinding("", k.name)
			}
		}
		for i := range l.Items {
			x.set(&l.Items[i])
		}
		rv = l.ResourceVersion
	default:
		return "", fmt.Errorf("list %s: unexpected %T", resource, list)
	}
	a.listed[resource] = true
	if len(a.listed) == len(watched) {
		a.syncOnce.Do(func() { close(a.synced) })
	}
	return rv, nil
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
