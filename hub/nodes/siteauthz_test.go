package nodes

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/storage"
)

func TestNodeAuthorizerSiteNodes(t *testing.T) {
	st := newStorage(t)
	ctx := context.Background()
	a := NewAuthorizer(Config{Storage: st, Logger: quiet})
	nodesK := mustKindT(t, "nodes")
	for name, zone := range map[string]string{"n1": "shop-a", "n2": "shop-b", "n3": ""} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if zone != "" {
			n.Labels = map[string]string{corev1.LabelTopologyZone: zone}
		}
		if _, err := st.Create(ctx, nodesK, "", n, storage.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	at := func(verb, kind, ns, name, labelSel, fieldSel string) apiserver.Attributes {
		return apiserver.Attributes{Verb: verb, Resource: true, Version: "v1", Kind: kind, Namespace: ns, Name: name,
			LabelSelector: labelSel, FieldSelector: fieldSel}
	}
	for _, c := range []struct {
		node string
		at   apiserver.Attributes
		ok   bool
	}{
		{"n1", at("list", "nodes", "", "", "topology.kubernetes.io/zone=shop-a", ""), true},
		{"n1", at("watch", "nodes", "", "", "topology.kubernetes.io/zone=shop-a,x=y", ""), true},
		{"n1", at("watch", "nodes", "", "", "topology.kubernetes.io/zone=shop-b", ""), false},
		{"n1", at("list", "nodes", "", "", "topology.kubernetes.io/zone in (shop-a,shop-b)", ""), false},
		{"n1", at("list", "nodes", "", "", "", ""), false},
		{"n3", at("list", "nodes", "", "", "topology.kubernetes.io/zone=", ""), false},
	} {
		err := a.Authorize(nodeUser(c.node), c.at)
		if (err == nil) != c.ok {
			t.Errorf("%s: %s %s %s/%s (%q %q): err = %v, want allowed %v", c.node, c.at.Verb, c.at.Kind, c.at.Namespace, c.at.Name, c.at.LabelSelector, c.at.FieldSelector, err, c.ok)
		}
	}
}
