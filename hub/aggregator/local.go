package aggregator

import (
	"context"
	"fmt"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/kube-aggregator/pkg/apis/apiregistration/v1/helper"

	"github.com/tether-edge/tether/hub/registry"
)

// Labels upstream's registration controllers mark the APIServices they own
// with: "onstart" for the API server's own group/versions, "true" for
// those of custom resources, which come and go with their definitions.
const (
	labelAutoManaged = "kube-aggregator.kubernetes.io/automanaged"
	managedOnStart   = "onstart"
	managedSync      = "true"
)

type priority struct{ group, version int32 }

// builtinPriorities are upstream's group and version priorities of the
// built-in group/versions; others (custom resources) get 1000 and 100 as
// upstream's CRD registration gives them.
var builtinPriorities = map[schema.GroupVersion]priority{
	{Group: "", Version: "v1"}:                             {18000, 1},
	{Group: "apps", Version: "v1"}:                         {17800, 15},
	{Group: "events.k8s.io", Version: "v1"}:                {17750, 15},
	{Group: "authentication.k8s.io", Version: "v1"}:        {17700, 15},
	{Group: "authorization.k8s.io", Version: "v1"}:         {17600, 15},
	{Group: "autoscaling", Version: "v1"}:                  {17500, 15},
	{Group: "autoscaling", Version: "v2"}:                  {17500, 30},
	{Group: "batch", Version: "v1"}:                        {17400, 15},
	{Group: "certificates.k8s.io", Version: "v1"}:          {17300, 15},
	{Group: "networking.k8s.io", Version: "v1"}:            {17200, 15},
	{Group: "policy", Version: "v1"}:                       {17100, 15},
	{Group: "rbac.authorization.k8s.io", Version: "v1"}:    {17000, 15},
	{Group: "storage.k8s.io", Version: "v1"}:               {16800, 15},
	{Group: "apiextensions.k8s.io", Version: "v1"}:         {16700, 15},
	{Group: "admissionregistration.k8s.io", Version: "v1"}: {16700, 15},
	{Group: "scheduling.k8s.io", Version: "v1"}:            {16600, 15},
	{Group: "coordination.k8s.io", Version: "v1"}:          {16500, 15},
	{Group: "node.k8s.io", Version: "v1"}:                  {16300, 15},
	{Group: "discovery.k8s.io", Version: "v1"}:             {16200, 15},
	{Group: "flowcontrol.apiserver.k8s.io", Version: "v1"}: {16100, 21},
	{Group: "apiregistration.k8s.io", Version: "v1"}:       {18000, 15},
}

// localAPIServices returns the Local APIServices for the group/versions
// kinds serve: built-in ones labelled "onstart", others "true".
func localAPIServices(kinds []*registry.Kind) map[string]*apiregistrationv1.APIService {
	out := map[string]*apiregistrationv1.APIService{}
	for _, k := range registry.Served(kinds) {
		gv := k.GVK.GroupVersion()
		name := gv.Version + "." + gv.Group
		if out[name] != nil {
			continue
		}
		p, builtin := builtinPriorities[gv]
		managed := managedOnStart
		if !builtin {
			p, managed = priority{1000, 100}, managedSync
		}
		out[name] = &apiregistrationv1.APIService{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelAutoManaged: managed}},
			Spec: apiregistrationv1.APIServiceSpec{Group: gv.Group, Version: gv.Version,
				GroupPriorityMinimum: p.group, VersionPriority: p.version},
		}
	}
	return out
}

// syncLocal makes the stored Local APIServices those of kinds: it creates
// the missing ones, puts back the spec of those it manages, deletes those
// it manages whose group/version is no longer served, and marks every
// Local one Available as upstream does.
func (a *Aggregator) syncLocal(ctx context.Context, kinds []*registry.Kind) error {
	want := localAPIServices(kinds)
	have := a.snapshot()
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	client := a.reg.ApiregistrationV1().APIServices()
	for _, n := range names {
		w := want[n]
		cur := have[n]
		if cur == nil {
			created, err := client.Create(ctx, w, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue // the informer has not seen it yet
			}
			if err != nil {
				return fmt.Errorf("create apiservice %s: %w", n, err)
			}
			cur = created
		} else if cur.Labels[labelAutoManaged] != "" && (cur.Spec.Service != nil ||
			cur.Spec.GroupPriorityMinimum != w.Spec.GroupPriorityMinimum || cur.Spec.VersionPriority != w.Spec.VersionPriority) {
			upd := cur.DeepCopy()
			upd.Spec = w.Spec
			if _, err := client.Update(ctx, upd, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
				return fmt.Errorf("update apiservice %s: %w", n, err)
			}
			continue
		}
		if cur.Spec.Service == nil && !helper.IsAPIServiceConditionTrue(cur, apiregistrationv1.Available) {
			upd := cur.DeepCopy()
			helper.SetAPIServiceCondition(upd, helper.NewLocalAvailableAPIServiceCondition())
			if _, err := client.UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return fmt.Errorf("update apiservice %s status: %w", n, err)
			}
		}
	}
	for n, cur := range have {
		m := cur.Labels[labelAutoManaged]
		if want[n] != nil || (m != managedOnStart && m != managedSync) {
			continue
		}
		if err := client.Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete apiservice %s: %w", n, err)
		}
	}
	return nil
}
