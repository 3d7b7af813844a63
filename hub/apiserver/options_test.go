package apiserver

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestDeleteOptions(t *testing.T) {
	s, err := New(Config{Storage: untouchable{t: t}, Kinds: testKinds})
	if err != nil {
		t.Fatal(err)
	}
	bg := metav1.DeletePropagationBackground
	orphan := metav1.DeletePropagationOrphan
	zero := int64(0)
	uid := "u1"
	tests := []struct {
		name, query, body string
		yaml              bool
		want              metav1.DeleteOptions
		code              int32
	}{
		{name: "empty"},
		{name: "query", query: "?propagationPolicy=Orphan&gracePeriodSeconds=0&dryRun=All",
			want: metav1.DeleteOptions{PropagationPolicy: &orphan, GracePeriodSeconds: &zero, DryRun: []string{"All"}}},
		{name: "kubectl body", body: `{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}`,
			want: metav1.DeleteOptions{TypeMeta: metav1.TypeMeta{Kind: "DeleteOptions", APIVersion: "v1"}, PropagationPolicy: &bg}},
		{name: "meta group body", body: `{"kind":"DeleteOptions","apiVersion":"meta.k8s.io/v1","preconditions":{"uid":"u1"}}`,
			want: metav1.DeleteOptions{TypeMeta: metav1.TypeMeta{Kind: "DeleteOptions", APIVersion: "meta.k8s.io/v1"}, Preconditions: &metav1.Preconditions{UID: (*types.UID)(&uid)}}},
		{name: "other group body", body: `{"kind":"DeleteOptions","apiVersion":"apps/v1","gracePeriodSeconds":0}`,
			want: metav1.DeleteOptions{TypeMeta: metav1.TypeMeta{Kind: "DeleteOptions", APIVersion: "apps/v1"}, GracePeriodSeconds: &zero}},
		{name: "custom resource group body", body: `{"kind":"DeleteOptions","apiVersion":"cert-manager.io/v1","propagationPolicy":"Background"}`,
			want: metav1.DeleteOptions{TypeMeta: metav1.TypeMeta{Kind: "DeleteOptions", APIVersion: "cert-manager.io/v1"}, PropagationPolicy: &bg}},
		{name: "yaml body", yaml: true, body: "kind: DeleteOptions\napiVersion: example.com/v1\ngracePeriodSeconds: 0\n",
			want: metav1.DeleteOptions{TypeMeta: metav1.TypeMeta{Kind: "DeleteOptions", APIVersion: "example.com/v1"}, GracePeriodSeconds: &zero}},
		{name: "other kind body", body: `{"kind":"ConfigMap","apiVersion":"v1"}`, code: 400},
		{name: "bad dryRun", query: "?dryRun=Maybe", code: 422},
		{name: "bad policy", body: `{"propagationPolicy":"Sideways"}`, code: 422},
		{name: "malformed body", body: `{"propagationPolicy":`, code: 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("DELETE", "/api/v1/namespaces/default/configmaps/a"+tc.query, strings.NewReader(tc.body))
			if tc.body != "" {
				r.Header.Set("Content-Type", "application/json")
			}
			if tc.yaml {
				r.Header.Set("Content-Type", "application/yaml")
			}
			got, err := s.deleteOptions(r)
			if tc.code != 0 {
				if err == nil || toStatus(err).ErrStatus.Code != tc.code {
					t.Fatalf("error %v, want code %d", err, tc.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(&tc.want, got); diff != "" {
				t.Errorf("options (-want +got):\n%s", diff)
			}
		})
	}
}
