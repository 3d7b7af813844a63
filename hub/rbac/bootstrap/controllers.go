package bootstrap

import rbacv1 "k8s.io/api/rbac/v1"

// ControllerRolePrefix begins the name of every controller's ClusterRole
// and ClusterRoleBinding.
const ControllerRolePrefix = "system:controller:"

// Controller is one controller of the hub's controller manager: the
// ServiceAccount in kube-system it acts as and the rules its ClusterRole
// system:controller:<Account> grants.
type Controller struct {
	// Name is the controller's name in --controllers.
	Name string
	// Account is its ServiceAccount's name, upstream's for the same
	// controller.
	Account string
	Rules   []rbacv1.PolicyRule
}

// Controllers returns every controller the hub can run with its rules:
// what the controller reads and writes through the API (its shared
// informers are fed by the controller manager's own identity), its Events
// included.
func Controllers() []Controller {
	return []Controller{
		{"replicaset", "replicaset-controller", append(eventRules(),
			rule("get list watch update", "apps", "replicasets"),
			rule("update", "apps", "replicasets/status replicasets/finalizers"),
			rule("list watch create delete patch", "core", "pods"),
		)},
		{"replicationcontroller", "replication-controller", append(eventRules(),
			rule("get list watch update", "core", "replicationcontrollers"),
			rule("update", "core", "replicationcontrollers/status replicationcontrollers/finalizers"),
			rule("list watch create delete patch", "core", "pods"),
		)},
		{"deployment", "deployment-controller", append(eventRules(),
			rule("get list watch update", "apps", "deployments"),
			rule("update", "apps", "deployments/status deployments/finalizers"),
			rule("get list watch create update patch delete", "apps", "replicasets"),
			rule("get list watch update", "core", "pods"),
		)},
		{"statefulset", "statefulset-controller", append(eventRules(),
			rule("get list watch", "apps", "statefulsets"),
			rule("update", "apps", "statefulsets/status statefulsets/finalizers"),
			rule("get list watch create update patch delete", "core", "pods"),
			rule("get list watch create update patch delete", "apps", "controllerrevisions"),
			rule("get create update patch delete", "core", "persistentvolumeclaims"),
		)},
		{"daemonset", "daemon-set-controller", append(eventRules(),
			rule("get list watch", "apps", "daemonsets"),
			rule("update", "apps", "daemonsets/status daemonsets/finalizers"),
			rule("get list watch", "core", "nodes"),
			rule("list watch create delete patch", "core", "pods"),
			rule("create", "core", "pods/binding"),
			rule("get list watch create update patch delete", "apps", "controllerrevisions"),
		)},
		// One tether controller runs Jobs and CronJobs: it holds both
		// upstream roles' rules.
		{"job", "job-controller", append(eventRules(),
			rule("get list watch create update patch delete", "batch", "jobs"),
			rule("update", "batch", "jobs/status jobs/finalizers"),
			rule("get list watch update", "batch", "cronjobs"),
			rule("update", "batch", "cronjobs/status cronjobs/finalizers"),
			rule("list watch create delete patch", "core", "pods"),
		)},
		// EndpointSlices and the legacy Endpoints beside them: upstream's
		// endpointslice-controller and endpoint-controller in one.
		{"endpointslice", "endpointslice-controller", append(eventRules(),
			rule("get list watch", "core", "services pods nodes"),
			rule("update", "core", "services/finalizers"),
			rule("get list watch create update delete", "discovery.k8s.io", "endpointslices"),
			rule("get list watch create update delete", "core", "endpoints"),
			rule("create", "core", "endpoints/restricted"),
		)},
		{"endpointslice-mirroring", "endpointslicemirroring-controller", append(eventRules(),
			rule("get list watch", "core", "services endpoints"),
			rule("update", "core", "services/finalizers endpoints/finalizers"),
			rule("get list watch create update delete", "discovery.k8s.io", "endpointslices"),
		)},
		{"nodelifecycle", "node-controller", append(eventRules(),
			rule("get list watch update patch delete", "core", "nodes"),
			rule("update patch", "core", "nodes/status"),
			// patch: the deletion cost of the pod that loses when a
			// Lost pod's node is heard again (tether's disconnect policy).
			rule("get list watch patch delete", "core", "pods"),
			rule("update patch", "core", "pods/status"),
			rule("get list watch", "coordination.k8s.io", "leases"),
		)},
		// LoadBalancer Services served on the node addresses.
		{"service-lb-controller", "service-controller", append(eventRules(),
			rule("get list watch", "core", "services nodes"),
			rule("update patch", "core", "services/status"),
		)},
		{"pod-garbage-collector", "pod-garbage-collector", append(eventRules(),
			rule("get list watch delete", "core", "pods"),
			rule("update patch", "core", "pods/status"),
			rule("get list watch", "core", "nodes"),
		)},
		{"disruption", "disruption-controller", append(eventRules(),
			rule("get list watch", "apps extensions", "deployments replicasets statefulsets"),
			rule("get list watch", "core", "replicationcontrollers pods"),
			rule("get list watch", "policy", "poddisruptionbudgets"),
			rule("update", "policy", "poddisruptionbudgets/status"),
			rule("get", "*", "*/scale"),
		)},
		// Reads metrics.k8s.io and the targets' /scale; nodes, tether's
		// own, to hold the scale of a target whose pods' nodes are
		// unreachable.
		{"horizontalpodautoscaling", "horizontal-pod-autoscaler", append(eventRules(),
			rule("get list watch", "autoscaling", "horizontalpodautoscalers"),
			rule("update", "autoscaling", "horizontalpodautoscalers/status"),
			rule("get update", "*", "*/scale"),
			rule("list", "core", "pods"),
			rule("get list watch", "core", "nodes"),
			rule("list", "metrics.k8s.io", "pods"),
			rule("get list", "custom.metrics.k8s.io", "*"),
			rule("get list", "external.metrics.k8s.io", "*"),
		)},
		{"persistentvolume-binder", "persistent-volume-binder", append(eventRules(),
			rule("get list watch create update delete", "core", "persistentvolumes"),
			rule("update", "core", "persistentvolumes/status"),
			rule("get list watch update", "core", "persistentvolumeclaims"),
			rule("update", "core", "persistentvolumeclaims/status"),
			rule("get list watch", "core", "pods nodes"),
			rule("get list watch", "storage.k8s.io", "storageclasses"),
		)},
		// The default ServiceAccount of each namespace and, as upstream's
		// root-ca-cert-publisher, its kube-root-ca.crt ConfigMap.
		{"serviceaccount", "service-account-controller", append(eventRules(),
			rule("get list watch create", "core", "serviceaccounts"),
			rule("get list watch create update", "core", "configmaps"),
			rule("get list watch", "core", "namespaces"),
		)},
		{"garbagecollector", "generic-garbage-collector", append(eventRules(),
			rule("get list watch patch update delete", "*", "*"),
		)},
		{"namespace", "namespace-controller", append(eventRules(),
			rule("get list watch delete", "core", "namespaces"),
			rule("update", "core", "namespaces/finalize namespaces/status"),
			rule("get list delete deletecollection", "*", "*"),
		)},
		// tether's own: the gossip key Secret of every site (zone).
		{"sitekeys", "site-keys-controller", append(eventRules(),
			rule("get list watch", "core", "nodes"),
			rule("get list watch create update", "core", "secrets"),
		)},
		// tether's own: rollouts of agent versions. It asks a node by
		// annotating its Node and nudges the agent through nodes/proxy
		// (create: the POST of status/resend).
		{"edgeupgrade", "edge-upgrade-controller", append(eventRules(),
			rule("get list watch patch", "core", "nodes"),
			rule("get create", "core", "nodes/proxy"),
			rule("get list watch", "fleet.tether.io", "edgeupgrades releases"),
			rule("update patch", "fleet.tether.io", "edgeupgrades/status"),
		)},
		// tether's own: ImageStagings' status from the selected Nodes'
		// status.images.
		{"imagestaging", "imagestaging-controller", append(eventRules(),
			rule("get list watch", "fleet.tether.io", "imagestagings"),
			rule("update patch", "fleet.tether.io", "imagestagings/status"),
			rule("get list watch", "core", "nodes"),
		)},
		{"clusterrole-aggregation", "clusterrole-aggregation-controller", append(eventRules(),
			rule("escalate get list watch update patch", "rbac.authorization.k8s.io", "clusterroles"),
		)},
		// The kubernetes.io/kube-apiserver-client signer, which the hub
		// runs beside the controller manager: it watches requests and
		// writes certificates (or failures) into their status.
		{"csrsigning", "certificate-controller", append(eventRules(),
			rule("get list watch", "certificates.k8s.io", "certificatesigningrequests"),
			rule("update", "certificates.k8s.io", "certificatesigningrequests/status"),
			rbacv1.PolicyRule{Verbs: []string{"sign"}, APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"},
				ResourceNames: []string{"kubernetes.io/kube-apiserver-client"}},
		)},
	}
}

// AccountFor returns the ServiceAccount a controller named as in
// --controllers acts as, or "" if the hub runs no such controller.
func AccountFor(controller string) string {
	for _, c := range Controllers() {
		if c.Name == controller {
			return c.Account
		}
	}
	return ""
}
