package nodes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/internal/sitedigest"
	"github.com/tether-edge/tether/join"
)

// Authorizer is the node authorizer: a node's credentials may read its own
// Node and the pods bound to it, the secrets, config maps and claims those
// pods reference and the PersistentVolumes bound to those claims, its
// site's gossip key Secret (tether's own rule, see siteKey), Services,
// EndpointSlices and RuntimeClasses; write its own Node and its status,
// its Lease, its pods' status, and events; create the mirror pods of its
// static pods; request tokens of its pods' service accounts, bound to
// those pods (see admitTokenRequest); and delete its pods once they
// stopped (graceful deletion ends with the node). Anything else goes to
// Next, as upstream's chain (Node, then RBAC) does, so that roles bound to
// a node or to system:nodes grant more and every node may review itself
// (system:basic-user); what Next denies too is 403 with the node rules'
// reason. Requests of other users go to Next.
//
// Two rules are tether's own, for local-path volumes, whose data lives on
// one node: a node may read the local-path PersistentVolumes whose node
// affinity pins them to it, and may get a PersistentVolume of the
// provisioned form pvc-<uid> that does not exist (the answer is 404),
// which is how the node learns that it may remove the data of a deleted
// one. It learns nothing but the absence of a volume of that name.
//
// Nodes that run tether's ingress controller may also read Ingresses and
// IngressClasses, write Ingresses' status and read the TLS Secrets of the
// Ingresses the controller serves (authz_ingress.go).
//
// Every node enforces NetworkPolicy for its pods: a node may list and
// watch every pod, and read Namespaces and NetworkPolicies (what a network
// plugin's agent reads upstream).
type Authorizer struct {
	cfg   Config
	graph *graph
	// Zones tells each node's site; a node may read its site's gossip
	// key Secret (see siteKey). Nil: no node reads any.
	Zones *Zones
	// Next decides for users that are not nodes, and for nodes what the
	// node rules do not allow; nil is apiserver.AllowAuthenticated for
	// other users and a denial for nodes.
	Next apiserver.Authorizer
}

// NewAuthorizer returns a node authorizer; Run must be running for it to
// know which pods are bound where.
func NewAuthorizer(cfg Config) *Authorizer {
	cfg.setDefaults()
	return &Authorizer{cfg: cfg, graph: newGraph()}
}

// Run keeps the authorizer's view of pods current until ctx ends.
func (a *Authorizer) Run(ctx context.Context) {
	a.graph.run(ctx, a.cfg.Storage, a.cfg.Logger)
}

// nodeOf returns the node a user is, or false for other users.
func nodeOf(u *auth.User) (string, bool) {
	name, ok := join.NodeName(u.Name)
	if !ok || !u.InGroup(join.NodesGroup) {
		return "", false
	}
	return name, true
}

// Authorize implements apiserver.Authorizer.
func (a *Authorizer) Authorize(u *auth.User, at apiserver.Attributes) error {
	node, ok := nodeOf(u)
	if !ok {
		return a.next().Authorize(u, at)
	}
	if !at.Resource {
		// Discovery, OpenAPI, version and health: what client-go reads
		// before it does anything else.
		if at.Verb == "get" || at.Verb == "head" {
			p := at.Path
			if p == "/api" || p == "/apis" || strings.HasPrefix(p, "/api/") || strings.HasPrefix(p, "/apis/") ||
				strings.HasPrefix(p, "/openapi/") || p == "/version" || p == "/healthz" || p == "/livez" || p == "/readyz" {
				return nil
			}
		}
		if a.Next != nil && a.Next.Authorize(u, at) == nil {
			return nil
		}
		return forbiddenPath(u, at)
	}
	if at.Verb == "create" && at.Name == "" && at.Subresource == "" && (at.Group == "" && (at.Kind == "nodes" || at.Kind == "pods") ||
		at.Group == "coordination.k8s.io" && at.Kind == "leases" && at.Namespace == corev1.NamespaceNodeLease) {
		// The name is in the body: AuthorizeCreate decides.
		return nil
	}
	why := a.decide(node, at)
	if why == "" || a.Next != nil && a.Next.Authorize(u, at) == nil {
		return nil
	}
	return forbidden(u, at, why)
}

func (a *Authorizer) next() apiserver.Authorizer {
	if a.Next == nil {
		return apiserver.AllowAuthenticated{}
	}
	return a.Next
}

// RulesFor lists what u may do in namespace, for SelfSubjectRulesReview:
// Next's answer when Next can list rules, an incomplete one when it
// cannot. The node authorizer's own rules
// depend on the objects asked for and cannot be listed: for a node the
// answer is incomplete, as upstream's.
func (a *Authorizer) RulesFor(u *auth.User, namespace string) authorizationv1.SubjectRulesReviewStatus {
	var st authorizationv1.SubjectRulesReviewStatus
	if rl, ok := a.next().(apiserver.RuleLister); ok {
		st = rl.RulesFor(u, namespace)
	} else {
		st.Incomplete = true
	}
	if _, ok := nodeOf(u); ok {
		st.Incomplete = true
		msg := "node authorizer does not support user rule resolution"
		if st.EvaluationError != "" {
			msg = "[" + msg + ", " + st.EvaluationError + "]"
		}
		st.EvaluationError = msg
	}
	return st
}

// AuthorizeCreate implements apiserver.CreateAuthorizer: for creates whose
// name comes in the body, it decides with the name filled in.
func (a *Authorizer) AuthorizeCreate(u *auth.User, at apiserver.Attributes, obj runtime.Object) error {
	node, ok := nodeOf(u)
	if ok && at.Group == "" && at.Kind == "serviceaccounts" && at.Subresource == "token" {
		return a.admitTokenRequest(node, at, obj)
	}
	if !ok || at.Name != "" {
		return nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return forbidden(u, at, "object without metadata")
	}
	at.Name = m.GetName()
	if at.Group == "" && at.Kind == "pods" {
		if why := a.decideMirrorPod(node, obj); why != "" {
			return forbidden(u, at, why)
		}
		return nil
	}
	if why := a.decide(node, at); why != "" {
		return forbidden(u, at, why)
	}
	return nil
}

// annMirror marks a mirror pod: the API's view of a static pod that a
// node runs from a manifest file; its value is the static pod's hash.
const annMirror = "kubernetes.io/config.mirror"

// decideMirrorPod returns "" when node may create pod: a mirror pod bound
// to the node, controlled by the node's own Node object, and referencing
// no other API object (service account, secret, config map, claim), as
// upstream's NodeRestriction admission requires.
func (a *Authorizer) decideMirrorPod(node string, obj runtime.Object) string {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return "not a pod"
	}
	if _, ok := pod.Annotations[annMirror]; !ok {
		return fmt.Sprintf("pod does not have %q annotation, node %q can only create mirror pods", annMirror, node)
	}
	if pod.Spec.NodeName != node {
		return fmt.Sprintf("node %q can only create pods with spec.nodeName set to itself", node)
	}
	if len(pod.OwnerReferences) != 1 {
		return fmt.Sprintf("node %q can only create pods with a single owner reference set to itself", node)
	}
	owner := pod.OwnerReferences[0]
	if owner.APIVersion != "v1" || owner.Kind != "Node" || owner.Name != node {
		return fmt.Sprintf("node %q can only create pods with an owner reference set to itself", node)
	}
	if owner.Controller == nil || !*owner.Controller {
		return fmt.Sprintf("node %q can only create pods with a controller owner reference set to itself", node)
	}
	if owner.BlockOwnerDeletion != nil && *owner.BlockOwnerDeletion {
		return fmt.Sprintf("node %q must not set blockOwnerDeletion on an owner reference", node)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := a.cfg.Storage.Get(ctx, nodesKind, "", node)
	if err != nil {
		return fmt.Sprintf("node %q: %v", node, err)
	}
	if uid := n.(*corev1.Node).UID; owner.UID != uid {
		return fmt.Sprintf("node %s UID mismatch: expected %s got %s", node, uid, owner.UID)
	}
	if pod.Spec.ServiceAccountName != "" || pod.Spec.DeprecatedServiceAccount != "" {
		return fmt.Sprintf("node %q can not create pods that reference a service account", node)
	}
	if refs := podRefs(pod); len(refs) > 0 {
		return fmt.Sprintf("node %q can not create pods that reference %s", node, refs[0].resource)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.ServiceAccountToken != nil || src.ClusterTrustBundle != nil {
					return fmt.Sprintf("node %q can not create pods that reference service account tokens or cluster trust bundles", node)
				}
			}
		}
	}
	if len(pod.Spec.ResourceClaims) > 0 {
		return fmt.Sprintf("node %q can not create pods that reference resourceclaims", node)
	}
	return ""
}

// decide returns "" to allow, else the reason for refusing.
func (a *Authorizer) decide(node string, at apiserver.Attributes) string {
	read := at.Verb == "get" || at.Verb == "list" || at.Verb == "watch"
	switch {
	case at.Group == "" && at.Kind == "nodes":
		if at.Subresource != "" && at.Subresource != "status" {
			return fmt.Sprintf("node '%s' cannot use nodes/%s", node, at.Subresource)
		}
		switch at.Verb {
		case "get", "create", "update", "patch":
			if at.Name == node {
				return ""
			}
		case "list", "watch":
			if selects(at.FieldSelector, "metadata.name", node) || a.siteNodes(node, at) {
				return ""
			}
			return fmt.Sprintf("node '%s' can only list or watch its own Node (fieldSelector metadata.name=%s)", node, node)
		}
		return fmt.Sprintf("node '%s' cannot %s node '%s'", node, at.Verb, at.Name)

	case at.Group == "" && at.Kind == "pods":
		switch {
		case (at.Verb == "list" || at.Verb == "watch") && at.Subresource == "":
			// Every pod: the node enforces NetworkPolicy, whose peers
			// are pods anywhere (tether's own rule, see networkPolicyRead).
			return ""
		case at.Subresource == "" && (at.Verb == "get" || at.Verb == "delete"),
			at.Subresource == "status" && (at.Verb == "get" || at.Verb == "update" || at.Verb == "patch"):
			if a.podOn(node, at.Namespace, at.Name) {
				return ""
			}
			return fmt.Sprintf("no relationship found between node '%s' and this object", node)
		}
		return fmt.Sprintf("node '%s' cannot %s pods%s", node, at.Verb, sub(at.Subresource))

	case at.Group == "" && (at.Kind == "secrets" || at.Kind == "configmaps" || at.Kind == "persistentvolumeclaims"):
		if !read || at.Subresource != "" {
			return fmt.Sprintf("node '%s' cannot %s %s", node, at.Verb, at.Kind)
		}
		name := at.Name
		if at.Verb != "get" {
			// The kubelet's watch-based managers list and watch one
			// object at a time by name.
			n, ok := exactField(at.FieldSelector, "metadata.name")
			if !ok || at.Namespace == "" {
				return fmt.Sprintf("node '%s' can only list or watch single %s in a namespace (fieldSelector metadata.name=<name>)", node, at.Kind)
			}
			name = n
		}
		if a.needs(node, ref{at.Kind, at.Namespace, name}) || at.Kind == "secrets" && a.siteKey(node, at.Namespace, name) ||
			at.Kind == "secrets" && a.ingressSecret(node, at.Namespace, name) {
			return ""
		}
		return fmt.Sprintf("no relationship found between node '%s' and this object", node)

	case at.Group == "" && at.Kind == "persistentvolumes":
		if !read || at.Subresource != "" {
			return fmt.Sprintf("node '%s' cannot %s %s", node, at.Verb, at.Kind)
		}
		name := at.Name
		if at.Verb != "get" {
			n, ok := exactField(at.FieldSelector, "metadata.name")
			if !ok {
				return fmt.Sprintf("node '%s' can only list or watch single %s (fieldSelector metadata.name=<name>)", node, at.Kind)
			}
			name = n
		}
		switch a.volumeAccess(node, name) {
		case volumeAllowed:
			return ""
		case volumeMissing:
			if at.Verb == "get" && strings.HasPrefix(name, "pvc-") {
				return ""
			}
		}
		return fmt.Sprintf("no relationship found between node '%s' and this object", node)

	case at.Group == "" && (at.Kind == "services" || at.Kind == "endpoints"),
		at.Group == "discovery.k8s.io" && at.Kind == "endpointslices":
		if read && at.Subresource == "" {
			return ""
		}
		return fmt.Sprintf("node '%s' may only read %s", node, at.Kind)

	case networkPolicyRead(at):
		if read && at.Subresource == "" {
			return ""
		}
		return fmt.Sprintf("node '%s' may only read %s", node, at.Kind)

	case at.Group == "node.k8s.io" && at.Kind == "runtimeclasses":
		// The agent maps a pod's runtimeClassName to its handler, as
		// the kubelet does with the get, list and watch upstream's
		// system:node role grants.
		if read && at.Subresource == "" {
			return ""
		}
		return fmt.Sprintf("node '%s' may only read %s", node, at.Kind)

	case at.Group == "networking.k8s.io" && (at.Kind == "ingresses" || at.Kind == "ingressclasses"):
		return a.decideIngress(node, at)

	case at.Group == "coordination.k8s.io" && at.Kind == "leases":
		if at.Namespace == corev1.NamespaceNodeLease && at.Name == node && at.Subresource == "" &&
			(at.Verb == "get" || at.Verb == "create" || at.Verb == "update" || at.Verb == "patch") {
			return ""
		}
		return fmt.Sprintf("node '%s' may only use its own Lease in %s", node, corev1.NamespaceNodeLease)

	case at.Group == "" && at.Kind == "serviceaccounts":
		if at.Verb != "create" || at.Name == "" {
			return "can only create tokens for individual service accounts"
		}
		if at.Subresource != "token" {
			return "can only create token subresource of serviceaccount"
		}
		if a.needs(node, ref{at.Kind, at.Namespace, at.Name}) || a.accountOnNode(node, at.Namespace, at.Name) {
			return ""
		}
		return fmt.Sprintf("no relationship found between node '%s' and this object", node)

	case (at.Group == "" || at.Group == "events.k8s.io") && at.Kind == "events":
		if at.Verb == "create" || at.Verb == "update" || at.Verb == "patch" {
			return ""
		}
		return fmt.Sprintf("node '%s' may only write events", node)
	}
	return fmt.Sprintf("node '%s' has no access to %s", node, resourceName(at))
}

// podOn reports whether pod ns/name is bound to node.
func (a *Authorizer) podOn(node, ns, name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !a.graph.waitSynced(ctx) {
		return false
	}
	if a.graph.podNode(ns, name) == node {
		return true
	}
	// A pod bound a moment ago may not have reached the graph yet: read
	// it.
	obj, err := a.cfg.Storage.Get(ctx, podsKind, ns, name)
	if err != nil {
		return false
	}
	return obj.(*corev1.Pod).Spec.NodeName == node
}

// siteKey reports whether secret ns/name is the gossip key Secret of
// node's site (its Node's topology.kubernetes.io/zone label), which the
// node's agent reads to join its site's gossip.
func (a *Authorizer) siteKey(node, ns, name string) bool {
	if a.Zones == nil || ns != sitedigest.KeySecretNamespace {
		return false
	}
	zone, known := a.Zones.Zone(node)
	if !known {
		// A Node registered a moment ago may not have reached Zones
		// yet: read it.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		obj, err := a.cfg.Storage.Get(ctx, nodesKind, "", node)
		if err != nil {
			return false
		}
		zone = obj.(*corev1.Node).Labels[corev1.LabelTopologyZone]
	}
	return zone != "" && name == sitedigest.KeySecretName(zone)
}

// accountOnNode reports whether a pod bound to node runs as service
// account ns/name, reading the store: a node asks for a token as soon as
// it sees its pod, which may be before the graph does.
func (a *Authorizer) accountOnNode(node, ns, name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	obj, err := a.cfg.Storage.List(ctx, podsKind, ns, storage.ListOptions{Field: fields.SelectorFromSet(fields.Set{
		"spec.nodeName": node, "spec.serviceAccountName": name})})
	if err != nil {
		return false
	}
	return len(obj.(*corev1.PodList).Items) > 0
}

func (a *Authorizer) needs(node string, r ref) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !a.graph.waitSynced(ctx) {
		return false
	}
	return a.graph.nodeNeeds(node, r)
}

// Answers of volumeAccess.
const (
	volumeDenied = iota
	volumeAllowed
	volumeMissing
)

// volumeAccess tells whether node may read the PersistentVolume name: one
// bound (claimRef) to a claim of a pod on the node, or a local-path volume
// pinned to the node; or that no such volume exists.
func (a *Authorizer) volumeAccess(node, name string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	obj, err := a.cfg.Storage.Get(ctx, pvsKind, "", name)
	if apierrors.IsNotFound(err) {
		return volumeMissing
	}
	if err != nil {
		return volumeDenied
	}
	pv := obj.(*corev1.PersistentVolume)
	if r := pv.Spec.ClaimRef; r != nil && a.needs(node, ref{"persistentvolumeclaims", r.Namespace, r.Name}) {
		return volumeAllowed
	}
	if pv.Annotations[annProvisionedBy] == localPathProvisioner && pinnedTo(pv) == node {
		return volumeAllowed
	}
	return volumeDenied
}

// Names of tether's local-path volumes (controllers/volume).
const (
	annProvisionedBy     = "pv.kubernetes.io/provisioned-by"
	localPathProvisioner = "tether.io/local-path"
)

// pinnedTo returns the one node a volume's required node affinity allows
// (kubernetes.io/hostname In [node]), or "".
func pinnedTo(pv *corev1.PersistentVolume) string {
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) != 1 {
		return ""
	}
	node := ""
	for _, e := range na.Required.NodeSelectorTerms[0].MatchExpressions {
		if e.Key == corev1.LabelHostname && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
			if node != "" && node != e.Values[0] {
				return ""
			}
			node = e.Values[0]
		}
	}
	return node
}

// selects reports whether a field selector requires field=value exactly.
func selects(selector, field, value string) bool {
	v, ok := exactField(selector, field)
	return ok && v == value
}

func exactField(selector, field string) (string, bool) {
	if selector == "" {
		return "", false
	}
	sel, err := fields.ParseSelector(selector)
	if err != nil {
		return "", false
	}
	return sel.RequiresExactMatch(field)
}

func sub(s string) string {
	if s == "" {
		return ""
	}
	return "/" + s
}

func resourceName(at apiserver.Attributes) string {
	r := at.Kind + sub(at.Subresource)
	if at.Group != "" {
		r += "." + at.Group
	}
	return r
}

// forbidden builds the 403 upstream's node authorizer answers with.
func forbidden(u *auth.User, at apiserver.Attributes, why string) error {
	scope := "at the cluster scope"
	if at.Namespace != "" {
		scope = fmt.Sprintf("in the namespace %q", at.Namespace)
	}
	res := at.Kind + sub(at.Subresource)
	return apierrors.NewForbidden(schema.GroupResource{Group: at.Group, Resource: at.Kind}, at.Name,
		fmt.Errorf("User %q cannot %s resource %q in API group %q %s: %s", u.Name, at.Verb, res, at.Group, scope, why))
}

func forbiddenPath(u *auth.User, at apiserver.Attributes) error {
	return apierrors.NewForbidden(schema.GroupResource{}, "",
		fmt.Errorf("User %q cannot %s path %q", u.Name, at.Verb, at.Path))
}

// admitTokenRequest is upstream's NodeRestriction for a node's
// TokenRequest, which the authorizer already allowed for a service
// account one of the node's pods uses: the token must be bound to a pod,
// named with its UID, that is scheduled on the node. A node thus gets only
// tokens that die with its own pods.
func (a *Authorizer) admitTokenRequest(node string, at apiserver.Attributes, obj runtime.Object) error {
	refuse := func(why string) error {
		return apierrors.NewForbidden(schema.GroupResource{Resource: at.Kind}, at.Name, errors.New(why))
	}
	tr, ok := obj.(*authenticationv1.TokenRequest)
	if !ok {
		return refuse(fmt.Sprintf("unexpected type %T", obj))
	}
	ref := tr.Spec.BoundObjectRef
	if ref == nil || ref.APIVersion != "v1" || ref.Kind != "Pod" || ref.Name == "" {
		return refuse("node requested token not bound to a pod")
	}
	if ref.UID == "" {
		return refuse("node requested token with a pod binding without a uid")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	o, err := a.cfg.Storage.Get(ctx, podsKind, at.Namespace, ref.Name)
	if apierrors.IsNotFound(err) {
		return err
	}
	if err != nil {
		return refuse(err.Error())
	}
	pod := o.(*corev1.Pod)
	if ref.UID != pod.UID {
		return refuse(fmt.Sprintf("the UID in the bound object reference (%s) does not match the UID in record. The object might have been deleted and then recreated", ref.UID))
	}
	if pod.Spec.NodeName != node {
		return refuse("node requested token bound to a pod scheduled on a different node")
	}
	return nil
}

// networkPolicyRead matches the kinds a node reads to enforce NetworkPolicy
// besides pods: NetworkPolicies and Namespaces (for their labels).
func networkPolicyRead(at apiserver.Attributes) bool {
	return at.Group == "networking.k8s.io" && at.Kind == "networkpolicies" || at.Group == "" && at.Kind == "namespaces"
}
