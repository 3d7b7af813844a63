package hub_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

func netpol(name, ingress string) string {
	return `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ` + name + `}
spec:
  podSelector: {matchLabels: {app: nothing}}
  ingress:
` + ingress + "\n"
}

// TestKubectlNetworkPolicyValidation shows a real hub refusing, through a
// real kubectl, NetworkPolicies with an invalid CIDR or a port out of
// range, with upstream's messages, a 422 whose causes name the fields, and
// nothing stored; and accepting a policy that selects no pod.
func TestKubectlNetworkPolicyValidation(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	createDefaultAccounts(t, h, "default")

	if out, err := createFile(t, h, netpol("selects-nothing", `  - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]
    ports: [{port: 32000, endPort: 32768}]`)); err != nil {
		t.Fatalf("a valid policy selecting nothing: %v\n%s", err, out)
	}
	for _, c := range []struct{ name, ingress, want string }{
		{"bad-cidr", `  - from: [{ipBlock: {cidr: 10.0.0.0/33}}]`,
			`The NetworkPolicy "bad-cidr" is invalid: spec.ingress[0].from[0].ipBlock.cidr: Invalid value: "10.0.0.0/33": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)`},
		{"bad-port", `  - ports: [{port: 70000}]`,
			`The NetworkPolicy "bad-port" is invalid: spec.ingress[0].ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive`},
		{"bad-endport", `  - ports: [{port: 80, endPort: 79}]`,
			"The NetworkPolicy \"bad-endport\" is invalid: spec.ingress[0].ports[0].endPort: Invalid value: 79: must be greater than or equal to `port`"},
	} {
		_, err := createFile(t, h, netpol(c.name, c.ingress))
		if err == nil {
			t.Errorf("%s: created", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got\n%v\nwant it to hold %q", c.name, err, c.want)
		}
		if _, err := h.Run("get", "networkpolicy", c.name); err == nil {
			t.Errorf("%s: a refused policy was stored", c.name)
		}
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	port := intstr.FromInt32(0)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "causes"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "300.0.0.0/8"}}},
			Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
		}}},
	}
	_, err = cs.NetworkingV1().NetworkPolicies("default").Create(context.Background(), np, metav1.CreateOptions{})
	var se *apierrors.StatusError
	if !errors.As(err, &se) || se.ErrStatus.Code != http.StatusUnprocessableEntity || se.ErrStatus.Reason != metav1.StatusReasonInvalid {
		t.Fatalf("create: %v, want a 422 Invalid", err)
	}
	var fields []string
	for _, c := range se.ErrStatus.Details.Causes {
		fields = append(fields, string(c.Type)+" "+c.Field)
	}
	slices.Sort(fields)
	want := []string{"FieldValueInvalid spec.ingress[0].from[0].ipBlock.cidr", "FieldValueInvalid spec.ingress[0].ports[0].port"}
	if !slices.Equal(fields, want) {
		t.Errorf("causes %v, want %v", fields, want)
	}
}
