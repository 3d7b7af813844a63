package rbac

import (
	"slices"

	"github.com/tether-edge/tether/hub/auth"
)

const (
	// maxViewNames bounds the user names with cached views; past it the
	// cache starts afresh.
	maxViewNames = 8192
	// viewsPerName bounds the group sets cached per user name (a user
	// may present different groups, e.g. through impersonation).
	viewsPerName = 4
	// maxEmptyNamespaces bounds the namespaces a view remembers that it
	// has no bindings in, so that requests for made-up namespaces do not
	// grow the cache.
	maxEmptyNamespaces = 256
)

// userView caches, for one user with one set of groups, the subjects'
// entries of the index and the roles their bindings reference, each role
// once: the cluster's at once, a namespace's on first use. A decision
// then costs two lookups however many groups the user has, and reads
// each role once however many bindings grant it. A view belongs to one
// generation of the index's bindings; role changes reach it through the
// role slots.
type userView struct {
	gen     uint64
	groups  []string
	sbs     []*subjectBindings
	cluster []*roleSlot
	// guarded by Authorizer.viewMu
	ns    map[string][]*roleSlot
	empty int
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

// rolesFor returns the view of u, and the roles bound to u in namespace
// (unless namespace is ""), building what is missing. The caller holds
// a.mu for reading.
func (a *Authorizer) rolesFor(u *auth.User, namespace string) (*userView, []*roleSlot) {
	gen := a.idx.gen
	a.viewMu.RLock()
	var v *userView
	for _, o := range a.views[u.Name] {
		if o.gen == gen && slices.Equal(o.groups, u.Groups) {
			v = o
			break
		}
	}
	var list []*roleSlot
	have := namespace == ""
	if v != nil && !have {
		list, have = v.ns[namespace]
	}
	a.viewMu.RUnlock()
	if v != nil && have {
		return v, list
	}
	if v == nil {
		v = a.idx.buildView(u.Name, u.Groups)
		a.viewMu.Lock()
		if len(a.views) >= maxViewNames {
			a.views = map[string][]*userView{}
		}
		views := []*userView{v}
		for _, o := range a.views[u.Name] {
			if o.gen == gen && len(views) < viewsPerName {
				views = append(views, o)
			}
		}
		a.views[u.Name] = views
		a.viewMu.Unlock()
		if namespace == "" {
			return v, nil
		}
	}
	for _, sb := range v.sbs {
		list = addRoles(list, sb.byNS[namespace])
	}
	// A role bound both cluster-wide and in the namespace is read once.
	list = slices.DeleteFunc(list, func(s *roleSlot) bool { return slices.Contains(v.cluster, s) })
	a.viewMu.Lock()
	if len(list) > 0 || v.empty < maxEmptyNamespaces {
		if len(list) == 0 {
			v.empty++
		}
		v.ns[namespace] = list
	}
	a.viewMu.Unlock()
	return v, list
}

func (x *index) buildView(name string, groups []string) *userView {
	v := &userView{gen: x.gen, groups: slices.Clone(groups), ns: map[string][]*roleSlot{}}
	add := func(sb *subjectBindings) {
		if sb == nil {
			return
		}
		v.sbs = append(v.sbs, sb)
		v.cluster = addRoles(v.cluster, sb.cluster)
	}
	add(x.users[name])
	for _, g := range groups {
		add(x.groups[g])
	}
	return v
}
