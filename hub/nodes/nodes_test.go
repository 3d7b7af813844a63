package nodes

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/join"
	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/sqlite"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newStorage(t *testing.T) *storage.Storage {
	t.Helper()
	st, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return newStorageOn(t, st, storage.Config{})
}

// newStorageOn returns a Storage of st (cfg gives further settings) with
// the namespaces the tests use.
func newStorageOn(t *testing.T, st store.Store, cfg storage.Config) *storage.Storage {
	t.Helper()
	cfg.Store, cfg.Kinds, cfg.Logger = st, registry.All(), quiet
	stg, err := storage.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"default", "kube-system", "kube-node-lease", "shop"} {
		if _, err := stg.Create(context.Background(), mustKindT(t, "namespaces"), "", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, storage.Options{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		// Pods need their service account, which the serviceaccount
		// controller would create.
		if _, err := stg.Create(context.Background(), mustKindT(t, "serviceaccounts"), ns, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, storage.Options{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	return stg
}

func mustKindT(t *testing.T, resource string) *registry.Kind {
	for _, k := range registry.All() {
		if k.Resource == resource && (k.GVK.Group == "" || resource == "leases" || resource == "endpointslices") {
			return k
		}
	}
	t.Fatalf("no kind %s", resource)
	return nil
}

func nodeUser(name string) *auth.User {
	return &auth.User{Name: join.NodeUserPrefix + name, Groups: []string{join.NodesGroup, auth.GroupAuthenticated}}
}

func TestIdentify(t *testing.T) {
	ok := &x509.Certificate{Subject: pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes"}}}
	if n, err := Identify(ok); err != nil || n != "n1" {
		t.Fatalf("Identify = %q, %v", n, err)
	}
	for _, c := range []*x509.Certificate{
		{Subject: pkix.Name{CommonName: "system:node:n1"}},
		{Subject: pkix.Name{CommonName: "tether-admin", Organization: []string{"system:masters"}}},
		{Subject: pkix.Name{CommonName: "system:node:", Organization: []string{"system:nodes"}}},
	} {
		if _, err := Identify(c); err == nil {
			t.Errorf("Identify(%q %v) accepted", c.Subject.CommonName, c.Subject.Organization)
		}
	}
}

func TestNodeAuthorizer(t *testing.T) {
	st := newStorage(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := NewAuthorizer(Config{Storage: st, Logger: quiet})
	go a.Run(ctx)

	pod := func(name, node string, spec corev1.PodSpec) *corev1.Pod {
		spec.NodeName = node
		if len(spec.Containers) == 0 {
			spec.Containers = []corev1.Container{{Name: "c", Image: "img"}}
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"}, Spec: spec}
	}
	podsKind := mustKindT(t, "pods")
	for _, p := range []*corev1.Pod{
		pod("p1", "n1", corev1.PodSpec{
			Volumes: []corev1.Volume{
				{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s1"}}},
				{Name: "pr", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "cm-projected"}}}}}}},
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "claim1"}}},
			},
			Containers: []corev1.Container{{Name: "c", Image: "img",
				Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "cm-env"}, Key: "k"}}}},
				EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s-envfrom"}}}},
			}},
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "pull"}},
		}),
		pod("p2", "n2", corev1.PodSpec{Volumes: []corev1.Volume{
			{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s2"}}}}}),
		pod("unbound", "", corev1.PodSpec{Volumes: []corev1.Volume{
			{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s3"}}}}}),
	} {
		if _, err := st.Create(ctx, podsKind, "shop", p, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	pvsKind := mustKindT(t, "persistentvolumes")
	pinned := func(node string) *corev1.VolumeNodeAffinity {
		return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}}}
	}
	pv := func(name, claim string, localPathOn string) *corev1.PersistentVolume {
		v := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv/" + name}},
		}}
		if claim != "" {
			v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "shop", Name: claim}
		}
		if localPathOn != "" {
			v.Annotations = map[string]string{"pv.kubernetes.io/provisioned-by": "tether.io/local-path"}
			v.Spec.NodeAffinity = pinned(localPathOn)
		}
		return v
	}
	for _, v := range []*corev1.PersistentVolume{
		pv("pv-claim1", "claim1", ""), pv("pvc-on-n1", "", "n1"), pv("pvc-on-n2", "", "n2"), pv("other", "other-claim", ""),
		pv("pvc-static-on-n1", "", ""),
	} {
		if v.Name == "pvc-static-on-n1" {
			v.Spec.NodeAffinity = pinned("n1") // pinned, but not a local-path volume
		}
		if _, err := st.Create(ctx, pvsKind, "", v, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	n1 := nodeUser("n1")
	res := func(verb, group, kind, ns, name, sub, fieldSel string) apiserver.Attributes {
		return apiserver.Attributes{Verb: verb, Resource: true, Group: group, Version: "v1", Kind: kind,
			Namespace: ns, Name: name, Subresource: sub, FieldSelector: fieldSel}
	}
	allowed := []apiserver.Attributes{
		res("get", "", "nodes", "", "n1", "", ""),
		res("patch", "", "nodes", "", "n1", "status", ""),
		res("update", "", "nodes", "", "n1", "", ""),
		res("watch", "", "nodes", "", "", "", "metadata.name=n1"),
		res("list", "", "pods", "", "", "", "spec.nodeName=n1"),
		res("watch", "", "pods", "shop", "", "", "spec.nodeName=n1"),
		res("list", "", "pods", "", "", "", ""), // NetworkPolicy peers
		res("watch", "", "pods", "", "", "", ""),
		res("get", "", "namespaces", "", "shop", "", ""),
		res("watch", "", "namespaces", "", "", "", ""),
		res("list", "networking.k8s.io", "networkpolicies", "", "", "", ""),
		res("watch", "networking.k8s.io", "networkpolicies", "shop", "", "", ""),
		res("get", "", "pods", "shop", "p1", "", ""),
		res("patch", "", "pods", "shop", "p1", "status", ""),
		res("delete", "", "pods", "shop", "p1", "", ""),
		res("get", "", "secrets", "shop", "s1", "", ""),
		res("get", "", "secrets", "shop", "s-envfrom", "", ""),
		res("get", "", "secrets", "shop", "pull", "", ""),
		res("watch", "", "configmaps", "shop", "", "", "metadata.name=cm-env"),
		res("list", "", "configmaps", "shop", "", "", "metadata.name=cm-projected"),
		res("get", "", "persistentvolumeclaims", "shop", "claim1", "", ""),
		res("watch", "", "persistentvolumeclaims", "shop", "", "", "metadata.name=claim1"),
		res("get", "", "persistentvolumes", "", "pv-claim1", "", ""),
		res("list", "", "persistentvolumes", "", "", "", "metadata.name=pv-claim1"),
		res("watch", "", "persistentvolumes", "", "", "", "metadata.name=pv-claim1"),
		res("get", "", "persistentvolumes", "", "pvc-on-n1", "", ""),
		res("watch", "", "persistentvolumes", "", "", "", "metadata.name=pvc-on-n1"),
		res("get", "", "persistentvolumes", "", "pvc-deleted", "", ""), // the answer is 404
		res("list", "", "services", "", "", "", ""),
		res("watch", "discovery.k8s.io", "endpointslices", "", "", "", ""),
		res("list", "node.k8s.io", "runtimeclasses", "", "", "", ""),
		res("watch", "node.k8s.io", "runtimeclasses", "", "", "", ""),
		res("get", "node.k8s.io", "runtimeclasses", "", "kata", "", ""),
		res("get", "coordination.k8s.io", "leases", "kube-node-lease", "n1", "", ""),
		res("update", "coordination.k8s.io", "leases", "kube-node-lease", "n1", "", ""),
		res("create", "", "events", "shop", "", "", ""),
		res("create", "events.k8s.io", "events", "shop", "", "", ""),
		{Verb: "get", Path: "/api/v1"},
		{Verb: "get", Path: "/version"},
	}
	for _, at := range allowed {
		if err := a.Authorize(n1, at); err != nil {
			t.Errorf("%s %s/%s %s/%s (%s) refused: %v", at.Verb, at.Kind, at.Subresource, at.Namespace, at.Name, at.FieldSelector, err)
		}
	}
	refused := []apiserver.Attributes{
		res("get", "", "nodes", "", "n2", "", ""),
		res("patch", "", "nodes", "", "n2", "status", ""),
		res("list", "", "nodes", "", "", "", ""),
		res("delete", "", "nodes", "", "n1", "", ""),
		res("get", "", "pods", "shop", "p2", "", ""),
		res("update", "", "pods", "shop", "p2", "status", ""),
		res("get", "", "pods", "shop", "unbound", "", ""),
		res("update", "", "pods", "shop", "p1", "", ""),
		res("create", "", "pods", "shop", "p1", "binding", ""),
		res("create", "", "pods", "shop", "p1", "eviction", ""),
		res("patch", "", "pods", "shop", "p1", "ephemeralcontainers", ""),
		res("update", "", "pods", "shop", "p1", "ephemeralcontainers", ""),
		res("get", "", "pods", "shop", "p1", "log", ""),
		res("get", "", "pods", "shop", "p1", "proxy", ""),
		res("create", "", "pods", "shop", "p1:8080", "proxy", ""),
		res("get", "", "services", "shop", "web:80", "proxy", ""),
		res("get", "", "secrets", "shop", "s2", "", ""),
		res("get", "", "secrets", "shop", "s3", "", ""),
		res("list", "", "secrets", "shop", "", "", ""),
		res("list", "", "secrets", "", "", "", "metadata.name=s1"),
		res("update", "", "secrets", "shop", "s1", "", ""),
		res("create", "node.k8s.io", "runtimeclasses", "", "", "", ""),
		res("delete", "node.k8s.io", "runtimeclasses", "", "kata", "", ""),
		res("get", "", "configmaps", "shop", "other", "", ""),
		res("get", "", "persistentvolumeclaims", "shop", "other-claim", "", ""),
		res("get", "", "persistentvolumes", "", "other", "", ""),
		res("get", "", "persistentvolumes", "", "pvc-on-n2", "", ""),
		res("get", "", "persistentvolumes", "", "pvc-static-on-n1", "", ""),
		res("get", "", "persistentvolumes", "", "static-deleted", "", ""),
		res("watch", "", "persistentvolumes", "", "", "", "metadata.name=pvc-deleted"),
		res("list", "", "persistentvolumes", "", "", "", ""),
		res("update", "", "persistentvolumes", "", "pvc-on-n1", "", ""),
		res("delete", "", "persistentvolumes", "", "pv-claim1", "", ""),
		res("create", "", "persistentvolumes", "", "", "", ""),
		res("create", "", "services", "shop", "", "", ""),
		res("create", "networking.k8s.io", "networkpolicies", "shop", "", "", ""),
		res("delete", "", "namespaces", "", "shop", "", ""),
		res("get", "coordination.k8s.io", "leases", "kube-node-lease", "n2", "", ""),
		res("get", "", "events", "shop", "e", "", ""),
		res("list", "apps", "deployments", "", "", "", ""),
		{Verb: "get", Path: "/metrics"},
		{Verb: "post", Path: "/tether/v1/whatever"},
	}
	for _, at := range refused {
		err := a.Authorize(n1, at)
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s %s/%s %s/%s (%s) = %v, want 403", at.Verb, at.Kind, at.Subresource, at.Namespace, at.Name, at.FieldSelector, err)
		}
	}
	// The message names the user and what was asked, as upstream's.
	err := a.Authorize(n1, res("get", "", "secrets", "shop", "s2", "", ""))
	if !strings.Contains(err.Error(), `User "system:node:n1" cannot get resource "secrets" in API group "" in the namespace "shop"`) {
		t.Errorf("message: %v", err)
	}
	// Other users are not the node authorizer's business.
	if err := a.Authorize(&auth.User{Name: "alice", Groups: []string{auth.GroupAuthenticated}}, res("list", "", "secrets", "", "", "", "")); err != nil {
		t.Errorf("non-node user refused: %v", err)
	}

	// Creates carry the name in the body.
	nodeAttrs := res("create", "", "nodes", "", "", "", "")
	if err := a.Authorize(n1, nodeAttrs); err != nil {
		t.Fatal(err)
	}
	if err := a.AuthorizeCreate(n1, nodeAttrs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}); err != nil {
		t.Errorf("create own node: %v", err)
	}
	if err := a.AuthorizeCreate(n1, nodeAttrs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}); !apierrors.IsForbidden(err) {
		t.Errorf("create another node: %v, want 403", err)
	}

	// Mirror pods: a node creates them for itself only, controlled by its
	// Node, referencing no other object.
	nodesKind := mustKindT(t, "nodes")
	created, err := st.Create(ctx, nodesKind, "", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	nodeUID := created.(*corev1.Node).UID
	podAttrs := res("create", "", "pods", "shop", "", "", "")
	if err := a.Authorize(n1, podAttrs); err != nil {
		t.Fatalf("pod create deferred to the body: %v", err)
	}
	yes := true
	mirror := func(change func(*corev1.Pod)) *corev1.Pod {
		p := pod("static-n1", "n1", corev1.PodSpec{})
		p.Annotations = map[string]string{"kubernetes.io/config.mirror": "0123abcd", "kubernetes.io/config.source": "file"}
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "n1", UID: nodeUID, Controller: &yes}}
		if change != nil {
			change(p)
		}
		return p
	}
	if err := a.AuthorizeCreate(n1, podAttrs, mirror(nil)); err != nil {
		t.Errorf("create own mirror pod: %v", err)
	}
	for why, change := range map[string]func(*corev1.Pod){
		"not a mirror pod": func(p *corev1.Pod) { delete(p.Annotations, "kubernetes.io/config.mirror") },
		"another node's":   func(p *corev1.Pod) { p.Spec.NodeName = "n2" },
		"unbound":          func(p *corev1.Pod) { p.Spec.NodeName = "" },
		"no owner":         func(p *corev1.Pod) { p.OwnerReferences = nil },
		"owned by n2":      func(p *corev1.Pod) { p.OwnerReferences[0].Name = "n2" },
		"wrong node uid":   func(p *corev1.Pod) { p.OwnerReferences[0].UID = "other" },
		"owner not a Node": func(p *corev1.Pod) { p.OwnerReferences[0].Kind = "ReplicaSet" },
		"not controller":   func(p *corev1.Pod) { p.OwnerReferences[0].Controller = nil },
		"blocks deletion":  func(p *corev1.Pod) { p.OwnerReferences[0].BlockOwnerDeletion = &yes },
		"two owners":       func(p *corev1.Pod) { p.OwnerReferences = append(p.OwnerReferences, p.OwnerReferences[0]) },
		"service account":  func(p *corev1.Pod) { p.Spec.ServiceAccountName = "default" },
		"secret volume": func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s1"}}}}
		},
		"pull secret": func(p *corev1.Pod) { p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "pull"}} },
		"configmap env": func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm-env"}}}}
		},
		"claim": func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "claim1"}}}}
		},
		"projected token": func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "t", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}}}
		},
	} {
		err := a.AuthorizeCreate(n1, podAttrs, mirror(change))
		if !apierrors.IsForbidden(err) {
			t.Errorf("create mirror pod (%s): %v, want 403", why, err)
		}
	}
	if err := a.AuthorizeCreate(nodeUser("n2"), podAttrs, mirror(func(p *corev1.Pod) { p.Spec.NodeName = "n2" })); !apierrors.IsForbidden(err) {
		t.Errorf("n2 creates a mirror pod owned by n1: %v, want 403", err)
	}

	// The graph follows rebinding and deletion.
	if _, _, err := st.Delete(ctx, podsKind, "shop", "p1", &metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.Authorize(n1, res("get", "", "secrets", "shop", "s1", "", "")) == nil {
		if time.Now().After(deadline) {
			t.Fatal("secret of a deleted pod still readable after 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// So are the claim and the volume bound to it; the local-path volume
	// pinned to the node stays readable.
	for _, at := range []apiserver.Attributes{
		res("get", "", "persistentvolumeclaims", "shop", "claim1", "", ""),
		res("get", "", "persistentvolumes", "", "pv-claim1", "", ""),
	} {
		if err := a.Authorize(n1, at); !apierrors.IsForbidden(err) {
			t.Errorf("%s %s/%s after its pod was deleted: %v, want 403", at.Verb, at.Kind, at.Name, err)
		}
	}
	if err := a.Authorize(n1, res("get", "", "persistentvolumes", "", "pvc-on-n1", "", "")); err != nil {
		t.Errorf("local-path volume of n1: %v", err)
	}
}

func TestJoinerAndLeases(t *testing.T) {
	st := newStorage(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	authority, err := pki.LoadOrCreate(pki.Config{Dir: t.TempDir(), Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	cfg := Config{Storage: st, Authority: authority, CertTTL: time.Hour, Logger: quiet, LeaseRenew: 200 * time.Millisecond,
		Now: func() time.Time { return now }}
	j := NewJoiner(cfg)
	mux := http.NewServeMux()
	for p, h := range j.Handlers() {
		mux.Handle(p, h)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()

	secretsKind := mustKindT(t, "secrets")
	mkToken := func(id, exp string) {
		data := map[string][]byte{"token-id": []byte(id), "token-secret": []byte("0123456789abcdef"), "usage-bootstrap-authentication": []byte("true")}
		if exp != "" {
			data["expiration"] = []byte(exp)
		}
		if _, err := st.Create(ctx, secretsKind, "kube-system", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id},
			Type: "bootstrap.kubernetes.io/token", Data: data}, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	mkToken("good01", now.Add(time.Hour).UTC().Format(time.RFC3339))
	mkToken("old001", now.Add(-time.Minute).UTC().Format(time.RFC3339))

	key, _ := join.NewKey()
	csr, _ := join.NewCSR(key, "n1")
	post := func(path, bearer string, req join.Request) (int, string, join.Response) {
		body, _ := json.Marshal(req)
		hreq, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(string(body)))
		if bearer != "" {
			hreq.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(hreq)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var out join.Response
		_ = json.Unmarshal(data, &out)
		return resp.StatusCode, string(data), out
	}
	for _, c := range []struct {
		bearer, want string
		code         int
	}{
		{"", "needs a bootstrap token", 401},
		{"nope00.0123456789abcdef", "join token nope00 is unknown", 401},
		{"old001.0123456789abcdef", "join token old001 expired", 401},
		{"good01.fedcba9876543210", "wrong secret", 401},
	} {
		code, body, _ := post(join.JoinPath, c.bearer, join.Request{Node: "n1", CSR: csr})
		if code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("join with %q: %d %s, want %d %q", c.bearer, code, body, c.code, c.want)
		}
	}
	// A request for another subject than the node it names is refused.
	otherCSR, _ := join.NewCSR(key, "n2")
	if code, body, _ := post(join.JoinPath, "good01.0123456789abcdef", join.Request{Node: "n1", CSR: otherCSR}); code != 400 {
		t.Errorf("mismatched CSR: %d %s", code, body)
	}
	code, body, resp := post(join.JoinPath, "good01.0123456789abcdef", join.Request{Node: "n1", CSR: csr})
	if code != 200 {
		t.Fatalf("join: %d %s", code, body)
	}
	cert, err := join.ParseCertificate(resp.Certificate)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "system:node:n1" || len(cert.Subject.Organization) != 1 || cert.Subject.Organization[0] != "system:nodes" {
		t.Fatalf("subject %v", cert.Subject)
	}
	if got := cert.NotAfter.Sub(now); got > time.Hour+time.Minute || got < time.Hour-time.Minute {
		t.Errorf("lifetime %v, want 1h", got)
	}

	// Re-attestation needs the Node to exist and the same key.
	code, body, _ = post(join.ReattestPath, "", join.Request{Node: "n1", CSR: csr, Certificate: resp.Certificate})
	if code != 403 || !strings.Contains(body, "no longer exists") {
		t.Errorf("re-attest without a Node: %d %s", code, body)
	}
	nodesK := mustKindT(t, "nodes")
	if _, err := st.Create(ctx, nodesK, "", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, storage.Options{}); err != nil {
		t.Fatal(err)
	}
	otherKey, _ := join.NewKey()
	otherKeyCSR, _ := join.NewCSR(otherKey, "n1")
	if code, body, _ = post(join.ReattestPath, "", join.Request{Node: "n1", CSR: otherKeyCSR, Certificate: resp.Certificate}); code != 403 {
		t.Errorf("re-attest with another key: %d %s", code, body)
	}
	if code, body, _ = post(join.ReattestPath, "", join.Request{Node: "n1", CSR: csr, Certificate: resp.Certificate}); code != 200 {
		t.Errorf("re-attest: %d %s", code, body)
	}

	// Leases: a connected node with heartbeats gets its Lease, owned by
	// its Node.
	l := NewLeases(Config{Storage: st, Logger: quiet, LeaseRenew: 100 * time.Millisecond})
	go l.Run(ctx)
	api := l.Serve(st)
	l.Connected("n1")
	leasesK := mustKindT(t, "leases")
	var first *coordinationv1.Lease
	deadline := time.Now().Add(5 * time.Second)
	for first == nil {
		if obj, err := api.Get(ctx, leasesK, "kube-node-lease", "n1"); err == nil {
			first = obj.(*coordinationv1.Lease)
		} else if time.Now().After(deadline) {
			t.Fatalf("no lease after 5s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(first.OwnerReferences) != 1 || first.OwnerReferences[0].Kind != "Node" || *first.Spec.HolderIdentity != "n1" {
		t.Fatalf("lease %+v", first)
	}
	for i := 0; i < 4; i++ {
		l.Heartbeat("n1")
		time.Sleep(100 * time.Millisecond)
	}
	obj, _ := api.Get(ctx, leasesK, "kube-node-lease", "n1")
	renewed := obj.(*coordinationv1.Lease)
	if !renewed.Spec.RenewTime.After(first.Spec.RenewTime.Time) {
		t.Errorf("lease not renewed: %v then %v", first.Spec.RenewTime, renewed.Spec.RenewTime)
	}
	l.Disconnected("n1")
	time.Sleep(300 * time.Millisecond)
	obj, _ = api.Get(ctx, leasesK, "kube-node-lease", "n1")
	stopped := obj.(*coordinationv1.Lease)
	time.Sleep(400 * time.Millisecond)
	obj, _ = api.Get(ctx, leasesK, "kube-node-lease", "n1")
	if obj.(*coordinationv1.Lease).Spec.RenewTime.After(stopped.Spec.RenewTime.Time) {
		t.Error("lease of a disconnected node still renewed")
	}
	if l.Alive("n1") {
		t.Error("disconnected node reported alive")
	}
}

// TestNodeTokenRequest: a node may request a token of a service account
// one of its pods uses, bound to that pod by name and UID, and nothing
// else, with upstream's node authorizer and NodeRestriction messages.
func TestNodeTokenRequest(t *testing.T) {
	st := newStorage(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := NewAuthorizer(Config{Storage: st, Logger: quiet})
	go a.Run(ctx)
	for _, sa := range []string{"robot", "other"} {
		if _, err := st.Create(ctx, mustKindT(t, "serviceaccounts"), "shop", &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	uids := map[string]string{}
	for _, p := range []struct{ name, node, sa string }{{"mine", "n1", "robot"}, {"theirs", "n2", "other"}, {"also-mine", "n1", "default"}} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "shop"}, Spec: corev1.PodSpec{
			NodeName: p.node, ServiceAccountName: p.sa, Containers: []corev1.Container{{Name: "c", Image: "img"}}}}
		out, err := st.Create(ctx, mustKindT(t, "pods"), "shop", pod, storage.Options{})
		if err != nil {
			t.Fatal(err)
		}
		uids[p.name] = string(out.(*corev1.Pod).UID)
	}
	at := func(sa, sub, verb string) apiserver.Attributes {
		return apiserver.Attributes{Verb: verb, Resource: true, Version: "v1", Kind: "serviceaccounts", Namespace: "shop", Name: sa, Subresource: sub}
	}
	n1 := nodeUser("n1")
	// The graph learns of the pods from its watch.
	for deadline := time.Now().Add(5 * time.Second); a.Authorize(n1, at("default", "token", "create")) != nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	// The authorizer: only accounts of the node's own pods, only tokens.
	for _, tt := range []struct {
		at   apiserver.Attributes
		want string
	}{
		{at("robot", "token", "create"), ""},
		{at("default", "token", "create"), ""},
		{at("other", "token", "create"), "no relationship found between node 'n1' and this object"},
		{at("robot", "", "get"), "can only create tokens for individual service accounts"},
		{at("robot", "", "create"), "can only create token subresource of serviceaccount"},
	} {
		err := a.Authorize(n1, tt.at)
		if tt.want == "" && err != nil || tt.want != "" && (!apierrors.IsForbidden(err) || !strings.HasSuffix(err.Error(), ": "+tt.want)) {
			t.Errorf("%s %s/%s: %v, want %q", tt.at.Verb, tt.at.Name, tt.at.Subresource, err, tt.want)
		}
	}
	// Before the graph has a pod, the store answers.
	if !a.accountOnNode("n1", "shop", "robot") || a.accountOnNode("n1", "shop", "other") || a.accountOnNode("n2", "shop", "default") {
		t.Error("accountOnNode does not read which accounts the node's pods use")
	}
	// NodeRestriction: bound to one of the node's pods by name and UID.
	req := func(kind, name, uid string) *authenticationv1.TokenRequest {
		tr := &authenticationv1.TokenRequest{}
		if kind != "" {
			tr.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: kind, APIVersion: "v1", Name: name, UID: types.UID(uid)}
		}
		return tr
	}
	for _, tt := range []struct {
		name string
		tr   *authenticationv1.TokenRequest
		want string
	}{
		{"bound to its pod", req("Pod", "mine", uids["mine"]), ""},
		{"unbound", req("", "", ""), `serviceaccounts "robot" is forbidden: node requested token not bound to a pod`},
		{"bound to a node", req("Node", "n1", "x"), `serviceaccounts "robot" is forbidden: node requested token not bound to a pod`},
		{"without uid", req("Pod", "mine", ""), `serviceaccounts "robot" is forbidden: node requested token with a pod binding without a uid`},
		{"stale uid", req("Pod", "mine", "stale"), `serviceaccounts "robot" is forbidden: the UID in the bound object reference (stale) does not match the UID in record. The object might have been deleted and then recreated`},
		{"another node's pod", req("Pod", "theirs", uids["theirs"]), `serviceaccounts "robot" is forbidden: node requested token bound to a pod scheduled on a different node`},
		{"missing pod", req("Pod", "gone", "x"), `pods "gone" not found`},
	} {
		err := a.AuthorizeCreate(n1, at("robot", "token", "create"), tt.tr)
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || err.Error() != tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	// Other users are not restricted here.
	if err := a.AuthorizeCreate(&auth.User{Name: "admin"}, at("robot", "token", "create"), req("", "", "")); err != nil {
		t.Errorf("admin: %v", err)
	}
}
