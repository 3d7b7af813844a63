// Package bootstrap holds tether's default RBAC policy, the ClusterRoles and
// ClusterRoleBindings every Kubernetes cluster starts with under their
// upstream names (cluster-admin, admin, edit, view, system:discovery, ...),
// the roles of the hub's own controllers and scheduler, and Reconcile, which
// writes that policy at every hub start the way kube-apiserver does: it
// creates what is missing and adds missing rules and subjects, but leaves
// alone objects annotated rbac.authorization.kubernetes.io/autoupdate:
// "false".
package bootstrap

import (
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/fleetapi"
	"github.com/tether-edge/tether/join"
)

const (
	// BootstrappingLabel marks the objects of the default policy, as
	// upstream marks them.
	BootstrappingLabel = "kubernetes.io/bootstrapping"
	// BootstrappingValue is the value of BootstrappingLabel.
	BootstrappingValue = "rbac-defaults"

	// Aggregation labels: ClusterRoles carrying them add their rules to
	// admin, edit and view.
	AggregateToAdmin = "rbac.authorization.k8s.io/aggregate-to-admin"
	AggregateToEdit  = "rbac.authorization.k8s.io/aggregate-to-edit"
	AggregateToView  = "rbac.authorization.k8s.io/aggregate-to-view"

	// SchedulerUser is the identity of the hub's scheduler.
	SchedulerUser = "system:kube-scheduler"
	// ControllerManagerUser is the identity under which the controller
	// manager watches shared informers and discovers resources.
	ControllerManagerUser = "system:kube-controller-manager"
	// SystemNamespace holds the controllers' ServiceAccounts.
	SystemNamespace = "kube-system"
	// ReleaseDownloaderRole lets nodes (group system:nodes) read Releases and
	// download their executables.
	ReleaseDownloaderRole = "system:tether:release-downloader"
)

// rule builds a PolicyRule from space-separated lists of verbs, API groups
// and resources ("" for the core group is written as "core").
func rule(verbs, groups, resources string) rbacv1.PolicyRule {
	var gs []string
	for _, g := range strings.Fields(groups) {
		if g == "core" {
			g = ""
		}
		gs = append(gs, g)
	}
	return rbacv1.PolicyRule{Verbs: strings.Fields(verbs), APIGroups: gs, Resources: strings.Fields(resources)}
}

// urls builds a non-resource PolicyRule.
func urls(verbs, paths string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{Verbs: strings.Fields(verbs), NonResourceURLs: strings.Fields(paths)}
}

// eventRules let a component record Events in both API groups that serve
// them.
func eventRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		rule("create update patch", "core", "events"),
		rule("create update patch", "events.k8s.io", "events"),
	}
}

const (
	read      = "get list watch"
	readWrite = "get list watch create update patch delete deletecollection"
	write     = "create update patch delete deletecollection"
)

func meta(name string, labels map[string]string) metav1.ObjectMeta {
	l := map[string]string{BootstrappingLabel: BootstrappingValue}
	for k, v := range labels {
		l[k] = v
	}
	return metav1.ObjectMeta{Name: name, Labels: l,
		Annotations: map[string]string{rbacv1.AutoUpdateAnnotationKey: "true"}}
}

func clusterRole(name string, labels map[string]string, rules ...rbacv1.PolicyRule) rbacv1.ClusterRole {
	return rbacv1.ClusterRole{ObjectMeta: meta(name, labels), Rules: rules}
}

func aggregated(name string, labels map[string]string, selectors ...string) rbacv1.ClusterRole {
	r := rbacv1.ClusterRole{ObjectMeta: meta(name, labels), AggregationRule: &rbacv1.AggregationRule{}}
	for _, s := range selectors {
		r.AggregationRule.ClusterRoleSelectors = append(r.AggregationRule.ClusterRoleSelectors,
			metav1.LabelSelector{MatchLabels: map[string]string{s: "true"}})
	}
	return r
}

// ClusterRoles returns the default ClusterRoles: the user-facing roles, the
// system roles every client needs, the scheduler's and every controller's.
func ClusterRoles() []rbacv1.ClusterRole {
	roles := []rbacv1.ClusterRole{
		clusterRole("cluster-admin", nil,
			rule("*", "*", "*"),
			urls("*", "*")),
		aggregated("admin", nil, AggregateToAdmin),
		aggregated("edit", map[string]string{AggregateToAdmin: "true"}, AggregateToEdit),
		aggregated("view", map[string]string{AggregateToEdit: "true"}, AggregateToView),
		clusterRole("system:aggregate-to-admin", map[string]string{AggregateToAdmin: "true"}, aggregateToAdmin()...),
		clusterRole("system:aggregate-to-edit", map[string]string{AggregateToEdit: "true"}, aggregateToEdit()...),
		clusterRole("system:aggregate-to-view", map[string]string{AggregateToView: "true"}, aggregateToView()...),
		// What metrics-server installs: reading the resource metrics API
		// is part of view, edit and admin.
		clusterRole("system:aggregated-metrics-reader",
			map[string]string{AggregateToView: "true", AggregateToEdit: "true", AggregateToAdmin: "true"},
			rule(read, "metrics.k8s.io", "pods nodes")),
		clusterRole("system:discovery", nil,
			urls("get", "/api /api/* /apis /apis/* /healthz /livez /openapi /openapi/* /readyz /version /version/")),
		clusterRole("system:basic-user", nil,
			rule("create", "authentication.k8s.io", "selfsubjectreviews"),
			rule("create", "authorization.k8s.io", "selfsubjectaccessreviews selfsubjectrulesreviews")),
		clusterRole("system:public-info-viewer", nil,
			urls("get", "/healthz /healthz/* /livez /livez/* /readyz /readyz/* /version /version/")),
		clusterRole("system:monitoring", nil,
			urls("get", "/healthz /healthz/* /livez /livez/* /readyz /readyz/* /metrics /metrics/slis")),
		clusterRole(SchedulerUser, nil, schedulerRules()...),
		clusterRole("system:volume-scheduler", nil,
			rule("get list watch patch update", "core", "persistentvolumes"),
			rule(read, "storage.k8s.io", "storageclasses"),
			rule("get list watch patch update", "core", "persistentvolumeclaims")),
		clusterRole(ControllerManagerUser, nil, controllerManagerRules()...),
		// What an agent reads to upgrade itself: the Releases the hub
		// holds and their executables (hub/releases). Importing is
		// "post" on /fleet/releases, an administrator's.
		clusterRole(ReleaseDownloaderRole, nil,
			rule(read, fleetapi.Group, fleetapi.ReleasesResource.Resource),
			urls("get", fleetapi.ImportPath+"/*")),
	}
	for _, c := range Controllers() {
		roles = append(roles, clusterRole(ControllerRolePrefix+c.Account, nil, c.Rules...))
	}
	roles = append(roles, nodeFleetRoles()...)
	aggregate(roles)
	return roles
}

// aggregate gives each aggregated role among roles the rules the
// clusterrole-aggregation controller would give it from these roles (the
// matching roles by name, each rule once), through aggregated roles that
// match in turn (view into edit into admin). A new cluster's admin, edit
// and view then grant from the first request, not from when the elected
// controller manager first runs; the controller keeps them current after.
func aggregate(roles []rbacv1.ClusterRole) {
	byName := make([]*rbacv1.ClusterRole, len(roles))
	for i := range roles {
		byName[i] = &roles[i]
	}
	slices.SortFunc(byName, func(a, b *rbacv1.ClusterRole) int { return strings.Compare(a.Name, b.Name) })
	// Each pass carries rules one aggregation level further; the default
	// policy nests three deep, and no pass changes anything past the last.
	for changed := true; changed; {
		changed = false
		for _, r := range byName {
			if r.AggregationRule == nil {
				continue
			}
			var rules []rbacv1.PolicyRule
			for _, sel := range r.AggregationRule.ClusterRoleSelectors {
				for _, m := range byName {
					if m == r || !labelsMatch(sel.MatchLabels, m.Labels) {
						continue
					}
					for _, rule := range m.Rules {
						if !slices.ContainsFunc(rules, func(x rbacv1.PolicyRule) bool { return equality.Semantic.DeepEqual(x, rule) }) {
							rules = append(rules, rule)
						}
					}
				}
			}
			if !equality.Semantic.DeepEqual(rules, r.Rules) {
				r.Rules, changed = rules, true
			}
		}
	}
}

// labelsMatch tells whether labels hold every pair of want.
func labelsMatch(want, labels map[string]string) bool {
	for k, v := range want {
		if l, ok := labels[k]; !ok || l != v {
			return false
		}
	}
	return true
}

func clusterRoleBinding(name, role string, subjects ...rbacv1.Subject) rbacv1.ClusterRoleBinding {
	return rbacv1.ClusterRoleBinding{ObjectMeta: meta(name, nil),
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: subjects}
}

func group(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: name}
}

func user(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
}

func serviceAccount(ns, name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}
}

// ClusterRoleBindings returns the default ClusterRoleBindings.
func ClusterRoleBindings() []rbacv1.ClusterRoleBinding {
	bs := []rbacv1.ClusterRoleBinding{
		clusterRoleBinding("cluster-admin", "cluster-admin", group("system:masters")),
		clusterRoleBinding("system:discovery", "system:discovery", group("system:authenticated")),
		clusterRoleBinding("system:basic-user", "system:basic-user", group("system:authenticated")),
		clusterRoleBinding("system:public-info-viewer", "system:public-info-viewer",
			group("system:authenticated"), group("system:unauthenticated")),
		clusterRoleBinding("system:monitoring", "system:monitoring", group("system:monitoring")),
		clusterRoleBinding(SchedulerUser, SchedulerUser, user(SchedulerUser)),
		clusterRoleBinding("system:volume-scheduler", "system:volume-scheduler", user(SchedulerUser)),
		clusterRoleBinding(ControllerManagerUser, ControllerManagerUser, user(ControllerManagerUser)),
		clusterRoleBinding(ReleaseDownloaderRole, ReleaseDownloaderRole, group(join.NodesGroup)),
	}
	for _, c := range Controllers() {
		n := ControllerRolePrefix + c.Account
		bs = append(bs, clusterRoleBinding(n, n, serviceAccount(SystemNamespace, c.Account)))
	}
	bs = append(bs, nodeFleetBindings()...)
	return bs
}

// schedulerRules are what the hub's scheduler reads and writes: it watches
// pods, nodes, namespaces, volumes and claims, classes, budgets and
// priority classes; binds pods, records why a pod does not fit in its
// status, preempts (deletes) victims and records Events.
func schedulerRules() []rbacv1.PolicyRule {
	return append(eventRules(),
		rule(read, "core", "nodes namespaces"),
		rule("get list watch delete", "core", "pods"),
		rule("create", "core", "bindings pods/binding"),
		rule("patch update", "core", "pods/status"),
		rule(read, "core", "replicationcontrollers services persistentvolumeclaims persistentvolumes"),
		rule(read, "apps extensions", "replicasets"),
		rule(read, "apps", "statefulsets"),
		rule(read, "policy", "poddisruptionbudgets"),
		rule(read, "scheduling.k8s.io", "priorityclasses"),
		rule(read, "storage.k8s.io", "storageclasses csinodes csidrivers csistoragecapacities"),
		rule("create", "authentication.k8s.io", "tokenreviews"),
		rule("create", "authorization.k8s.io", "subjectaccessreviews"),
		rule("create", "coordination.k8s.io", "leases"),
		leaseRule("kube-scheduler"),
	)
}

// leaseRule lets a component renew its own leader election Lease, as
// upstream's bootstrap policy does.
func leaseRule(name string) rbacv1.PolicyRule {
	r := rule("get update", "coordination.k8s.io", "leases")
	r.ResourceNames = []string{name}
	return r
}

// controllerManagerRules are what the controller manager itself does under
// its own identity: watch every served resource for the shared informers
// and the garbage collector's graph, and discover what is served.
func controllerManagerRules() []rbacv1.PolicyRule {
	return append(eventRules(),
		rule("list watch", "*", "*"),
		rule("get", "core", "namespaces"),
		rule("create", "authentication.k8s.io", "tokenreviews"),
		rule("create", "authorization.k8s.io", "subjectaccessreviews"),
		rule("create", "coordination.k8s.io", "leases"),
		leaseRule("kube-controller-manager"),
	)
}

// aggregateToAdmin is what admin holds beyond edit: managing access within
// a namespace.
func aggregateToAdmin() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		rule("create", "authorization.k8s.io", "localsubjectaccessreviews"),
		rule(readWrite, "rbac.authorization.k8s.io", "rolebindings roles"),
	}
}

// aggregateToEdit is what edit holds beyond view: writing the namespaced
// workload, configuration and networking objects, Secrets among them.
func aggregateToEdit() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		// Reading these is as good as holding their contents or a shell
		// in the pod, so view lacks them and edit has them.
		rule(read, "core", "pods/attach pods/proxy pods/exec pods/portforward secrets services/proxy"),
		rule("impersonate", "core", "serviceaccounts"),
		rule(write, "core", "pods pods/attach pods/proxy pods/exec pods/portforward"),
		rule("create", "core", "pods/eviction"),
		rule(write, "core", "configmaps events persistentvolumeclaims replicationcontrollers "+
			"replicationcontrollers/scale secrets serviceaccounts services services/proxy"),
		rule("create", "core", "serviceaccounts/token"),
		rule(write, "apps", "daemonsets deployments deployments/rollback deployments/scale replicasets "+
			"replicasets/scale statefulsets statefulsets/scale"),
		rule(write, "autoscaling", "horizontalpodautoscalers"),
		rule(write, "batch", "cronjobs jobs"),
		rule(write, "policy", "poddisruptionbudgets"),
		rule(write, "networking.k8s.io", "ingresses networkpolicies"),
		rule(readWrite, "coordination.k8s.io", "leases"),
	}
}

// aggregateToView is read access to the namespaced objects that hold no
// secrets.
func aggregateToView() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		rule(read, "core", "pods replicationcontrollers replicationcontrollers/scale serviceaccounts services "+
			"services/status endpoints persistentvolumeclaims persistentvolumeclaims/status configmaps"),
		rule(read, "core", "bindings events limitranges namespaces/status pods/log pods/status "+
			"replicationcontrollers/status resourcequotas resourcequotas/status"),
		rule(read, "core", "namespaces"),
		rule(read, "discovery.k8s.io", "endpointslices"),
		rule(read, "apps", "controllerrevisions daemonsets daemonsets/status deployments deployments/scale "+
			"deployments/status replicasets replicasets/scale replicasets/status statefulsets "+
			"statefulsets/scale statefulsets/status"),
		rule(read, "autoscaling", "horizontalpodautoscalers horizontalpodautoscalers/status"),
		rule(read, "batch", "cronjobs cronjobs/status jobs jobs/status"),
		rule(read, "policy", "poddisruptionbudgets poddisruptionbudgets/status"),
		rule(read, "networking.k8s.io", "ingresses ingresses/status networkpolicies"),
	}
}
