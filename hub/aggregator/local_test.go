package aggregator

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/kube-aggregator/pkg/apis/apiregistration/v1/helper"
	aggregatorfake "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset/fake"

	"github.com/tether-edge/tether/hub/registry"
)

// TestLocalAPIServicesFollowTheRegistry: custom kinds' group/versions get
// Local APIServices when they are registered and lose them when they go,
// as upstream's CRD registration does; a user's APIService is left alone.
func TestLocalAPIServicesFollowTheRegistry(t *testing.T) {
	ctx := context.Background()
	reg, err := registry.New(registry.Config{Extra: Kinds()})
	if err != nil {
		t.Fatal(err)
	}
	agg, _ := testAggregator(t)
	user := remoteAPIService(nil, false)
	fake := aggregatorfake.NewSimpleClientset(user)
	agg.reg = fake
	sync := func() map[string]*apiregistrationv1.APIService {
		t.Helper()
		// What the informer would have seen.
		list, err := fake.ApiregistrationV1().APIServices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range list.Items {
			agg.observe(list.Items[i].Name, &list.Items[i])
		}
		if err := agg.syncLocal(ctx, reg.Kinds()); err != nil {
			t.Fatal(err)
		}
		list, _ = fake.ApiregistrationV1().APIServices().List(ctx, metav1.ListOptions{})
		out := map[string]*apiregistrationv1.APIService{}
		for i := range list.Items {
			out[list.Items[i].Name] = &list.Items[i]
		}
		// Forget deleted ones as the informer would.
		for n := range agg.snapshot() {
			if out[n] == nil {
				agg.observe(n, nil)
			}
		}
		return out
	}
	got := sync()
	if s := got["v1.apps"]; s == nil || s.Labels[labelAutoManaged] != managedOnStart {
		t.Fatalf("v1.apps: %+v", s)
	}
	got = sync() // the second pass marks the created ones Available
	if !helper.IsAPIServiceConditionTrue(got["v1.apps"], apiregistrationv1.Available) {
		t.Fatalf("v1.apps not Available: %+v", got["v1.apps"].Status)
	}
	if got[user.Name] == nil {
		t.Fatal("the user's APIService was deleted")
	}

	crontab := &registry.Kind{GVK: schema.GroupVersionKind{Group: "stable.example.com", Version: "v1", Kind: "CronTab"},
		Resource: "crontabs", Singular: "crontab", Namespaced: true}
	reg.SetCustom("crontabs.stable.example.com", []*registry.Kind{crontab})
	got = sync()
	if s := got["v1.stable.example.com"]; s == nil || s.Labels[labelAutoManaged] != managedSync || s.Spec.Service != nil {
		t.Fatalf("no Local APIService for the custom kind: %+v", s)
	}
	reg.SetCustom("crontabs.stable.example.com", nil)
	got = sync()
	if got["v1.stable.example.com"] != nil {
		t.Fatal("the custom kind's APIService outlived it")
	}
	if got["v1.apps"] == nil || got[user.Name] == nil {
		t.Fatal("APIServices that are still wanted were deleted")
	}
}
