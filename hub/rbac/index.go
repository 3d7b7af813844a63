package rbac

import (
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
)

// roleSlot holds the rules of one Role or ClusterRole. Bindings point at
// the slot of the role they reference whether or not it exists, so that a
// role's creation, change or removal reaches every binding at once.
type roleSlot struct {
	cluster         bool // a ClusterRole
	namespace, name string
	exists          bool
	rules           []rbacv1.PolicyRule
	refs            int // bindings pointing here
}

// binding is one RoleBinding (namespace set) or ClusterRoleBinding.
type binding struct {
	namespace, name string
	role            *roleSlot
	users, groups   []string // names the index files this binding under
}

// subjectBindings are the bindings naming one user or group.
type subjectBindings struct {
	cluster []*binding
	byNS    map[string][]*binding
}

type nsName struct{ namespace, name string }

// index is the authorizer's view of RBAC objects. Callers hold mu.
type index struct {
	roles    map[nsName]*roleSlot // Roles' slots
	cluster  map[string]*roleSlot // ClusterRoles' slots
	bindings map[nsName]*binding  // ClusterRoleBindings have namespace ""
	users    map[string]*subjectBindings
	groups   map[string]*subjectBindings
	// gen counts changes of bindings, which invalidate user views.
	gen uint64
}

func newIndex() *index {
	return &index{
		roles:    map[nsName]*roleSlot{},
		cluster:  map[string]*roleSlot{},
		bindings: map[nsName]*binding{},
		users:    map[string]*subjectBindings{},
		groups:   map[string]*subjectBindings{},
	}
}

// slot returns the slot of a role, creating an empty one if needed.
func (x *index) slot(cluster bool, namespace, name string) *roleSlot {
	if cluster {
		s := x.cluster[name]
		if s == nil {
			s = &roleSlot{cluster: true, name: name}
			x.cluster[name] = s
		}
		return s
	}
	k := nsName{namespace, name}
	s := x.roles[k]
	if s == nil {
		s = &roleSlot{namespace: namespace, name: name}
		x.roles[k] = s
	}
	return s
}

// release forgets a slot nothing needs any more.
func (x *index) release(s *roleSlot) {
	if s.exists || s.refs > 0 {
		return
	}
	if s.cluster {
		delete(x.cluster, s.name)
	} else {
		delete(x.roles, nsName{s.namespace, s.name})
	}
}

func (x *index) setRole(cluster bool, namespace, name string, rules []rbacv1.PolicyRule) {
	s := x.slot(cluster, namespace, name)
	s.exists = true
	s.rules = rules
}

func (x *index) removeRole(cluster bool, namespace, name string) {
	s := x.slot(cluster, namespace, name)
	s.exists = false
	s.rules = nil
	x.release(s)
}

// saUser is the user name a service account authenticates as.
func saUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// setBinding files a RoleBinding (namespace != "") or ClusterRoleBinding
// under each subject it names, as upstream's appliesTo reads subjects: a
// ServiceAccount without a namespace is one of the RoleBinding's
// namespace, and applies to nobody in a ClusterRoleBinding.
func (x *index) setBinding(namespace, name string, ref rbacv1.RoleRef, subjects []rbacv1.Subject) {
	x.removeBinding(namespace, name)
	x.gen++
	b := &binding{namespace: namespace, name: name}
	switch ref.Kind {
	case "ClusterRole":
		b.role = x.slot(true, "", ref.Name)
	default:
		// A Role in a ClusterRoleBinding is invalid; it is looked for
		// in namespace "" and never found, as upstream.
		b.role = x.slot(false, namespace, ref.Name)
	}
	b.role.refs++
	for _, s := range subjects {
		switch s.Kind {
		case rbacv1.UserKind:
			b.users = appendNew(b.users, s.Name)
		case rbacv1.GroupKind:
			b.groups = appendNew(b.groups, s.Name)
		case rbacv1.ServiceAccountKind:
			ns := s.Namespace
			if ns == "" {
				ns = namespace
			}
			if ns != "" {
				b.users = appendNew(b.users, saUser(ns, s.Name))
			}
		}
	}
	for _, u := range b.users {
		x.file(x.users, u, b)
	}
	for _, g := range b.groups {
		x.file(x.groups, g, b)
	}
	x.bindings[nsName{namespace, name}] = b
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

func (x *index) file(m map[string]*subjectBindings, subject string, b *binding) {
	sb := m[subject]
	if sb == nil {
		sb = &subjectBindings{}
		m[subject] = sb
	}
	if b.namespace == "" {
		sb.cluster = append(sb.cluster, b)
		return
	}
	if sb.byNS == nil {
		sb.byNS = map[string][]*binding{}
	}
	sb.byNS[b.namespace] = append(sb.byNS[b.namespace], b)
}

func (x *index) unfile(m map[string]*subjectBindings, subject string, b *binding) {
	sb := m[subject]
	if sb == nil {
		return
	}
	drop := func(list []*binding) []*binding {
		if i := slices.Index(list, b); i >= 0 {
			list = slices.Delete(list, i, i+1)
		}
		return list
	}
	if b.namespace == "" {
		sb.cluster = drop(sb.cluster)
	} else {
		if l := drop(sb.byNS[b.namespace]); len(l) > 0 {
			sb.byNS[b.namespace] = l
		} else {
			delete(sb.byNS, b.namespace)
		}
	}
	if len(sb.cluster) == 0 && len(sb.byNS) == 0 {
		delete(m, subject)
	}
}

func (x *index) removeBinding(namespace, name string) {
	k := nsName{namespace, name}
	b := x.bindings[k]
	if b == nil {
		return
	}
	delete(x.bindings, k)
	x.gen++
	for _, u := range b.users {
		x.unfile(x.users, u, b)
	}
	for _, g := range b.groups {
		x.unfile(x.groups, g, b)
	}
	b.role.refs--
	x.release(b.role)
}

// visit calls f for each binding that applies to the user in namespace:
// ClusterRoleBindings first, then the namespace's RoleBindings (none for
// namespace ""), as upstream's rule resolver. A binding naming the user
// more than once is visited more than once. f returns false to stop.
func (x *index) visit(name string, groups []string, namespace string, f func(*binding) bool) {
	var buf [8]*subjectBindings
	sbs := buf[:0]
	if sb := x.users[name]; sb != nil {
		sbs = append(sbs, sb)
	}
	for _, g := range groups {
		if sb := x.groups[g]; sb != nil {
			sbs = append(sbs, sb)
		}
	}
	for _, sb := range sbs {
		for _, b := range sb.cluster {
			if !f(b) {
				return
			}
		}
	}
	if namespace == "" {
		return
	}
	for _, sb := range sbs {
		for _, b := range sb.byNS[namespace] {
			if !f(b) {
				return
			}
		}
	}
}
