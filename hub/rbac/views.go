package rbac

import (
	"slices"

	"github.com/tether-edge/tether/hub/auth"
)

const (
	// maxViews bounds the cached views; past it the cache starts afresh.
	maxViews = 16384
	// viewsPerKey bounds the group sets cached per user name and
	// namespace (a user may present different groups, e.g. through
	// impersonation).
	viewsPerKey = 4
)

// viewKey is a user name and the namespace of a request ("" for the
// cluster scope).
type viewKey struct{ name, namespace string }

// userView caches, for one user with one set of groups in one namespace,
// the roles that the bindings naming the user or a group reference, each
// once: cluster-wide and in the namespace. A decision then costs one
// lookup however many groups the user has, and reads each role once
// however many bindings grant it. A view belongs to one generation of
// the index's bindings; role changes reach it through the role slots.
type userView struct {
	gen     uint64
	groups  []string
	cluster []*roleSlot
	inNS    []*roleSlot
}

// rolesFor returns u's view in namespace, building it if needed. The
// caller holds a.mu for reading.
func (a *Authorizer) rolesFor(u *auth.User, namespace string) *userView {
	gen := a.idx.gen
	key := viewKey{u.Name, namespace}
	a.viewMu.RLock()
	for _, v := range a.views[key] {
		if v.gen == gen && slices.Equal(v.groups, u.Groups) {
			a.viewMu.RUnlock()
			return v
		}
	}
	a.viewMu.RUnlock()
	v := a.idx.buildView(u.Name, u.Groups, namespace)
	a.viewMu.Lock()
	if len(a.views) >= maxViews {
		a.views = map[viewKey][]*userView{}
	}
	views := []*userView{v}
	for _, o := range a.views[key] {
		if o.gen == gen && len(views) < viewsPerKey {
			views = append(views, o)
		}
	}
	a.views[key] = views
	a.viewMu.Unlock()
	return v
}

func (x *index) buildView(name string, groups []string, namespace string) *userView {
	v := &userView{gen: x.gen, groups: slices.Clone(groups)}
	add := func(sb *subjectBindings) {
		if sb == nil {
			return
		}
		v.cluster = addRoles(v.cluster, sb.cluster)
		if namespace != "" {
			v.inNS = addRoles(v.inNS, sb.byNS[namespace])
		}
	}
	add(x.users[name])
	for _, g := range groups {
		add(x.groups[g])
	}
	// A role bound both cluster-wide and in the namespace is read once.
	v.inNS = slices.DeleteFunc(v.inNS, func(s *roleSlot) bool { return slices.Contains(v.cluster, s) })
	return v
}

// addRoles appends the roles of bindings not in list yet.
func addRoles(list []*roleSlot, bindings []*binding) []*roleSlot {
	for _, b := range bindings {
		if !slices.Contains(list, b.role) {
			list = append(list, b.role)
		}
	}
	return list
}
