package webhooks

import (
	"context"
	"reflect"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authorization/authorizer"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
)

// objectInterfaces are the hub scheme's, with two changes that tether's
// storage needs: objects are already of their served version, so a
// conversion between two objects of one Go type is a copy (the scheme has
// no such conversion), and defaulting is the served kind's.
func newObjectInterfaces(s *runtime.Scheme, kinds func() []*registry.Kind) admission.ObjectInterfaces {
	return &admission.RuntimeObjectInterfaces{
		ObjectCreater:            s,
		ObjectTyper:              s,
		ObjectDefaulter:          kindDefaulter{kinds},
		ObjectConvertor:          copyConvertor{s},
		EquivalentResourceMapper: runtime.NewEquivalentResourceRegistry(),
	}
}

// copyConvertor copies between objects of the same Go type and leaves
// the rest to the scheme.
type copyConvertor struct{ *runtime.Scheme }

func (c copyConvertor) Convert(in, out, context any) error {
	iv, ov := reflect.ValueOf(in), reflect.ValueOf(out)
	if iv.Kind() == reflect.Pointer && iv.Type() == ov.Type() && !iv.IsNil() && !ov.IsNil() {
		if _, ok := in.(runtime.Unstructured); !ok {
			ov.Elem().Set(iv.Elem())
			return nil
		}
	}
	return c.Scheme.Convert(in, out, context)
}

// kindDefaulter sets the served kind's defaults on an object a webhook
// patched, as upstream defaults a patched object.
type kindDefaulter struct{ kinds func() []*registry.Kind }

func (d kindDefaulter) Default(obj runtime.Object) {
	if d.kinds == nil {
		return
	}
	gvk := obj.GetObjectKind().GroupVersionKind()
	for _, k := range d.kinds() {
		if k.GVK == gvk {
			if k.Default != nil {
				k.Default(obj)
			}
			return
		}
	}
}

// Authorizer decides on a user's request (the hub's authorizer chain).
type Authorizer = apiserver.Authorizer

// authorizerAdapter answers upstream's authorizer questions
// (ValidatingAdmissionPolicies' authorizer variable) with the hub's
// authorizer.
type authorizerAdapter struct{ a Authorizer }

func (ad authorizerAdapter) Authorize(_ context.Context, at authorizer.Attributes) (authorizer.Decision, string, error) {
	if ad.a == nil || at.GetUser() == nil {
		return authorizer.DecisionNoOpinion, "", nil
	}
	u := at.GetUser()
	err := ad.a.Authorize(&auth.User{Name: u.GetName(), UID: u.GetUID(), Groups: u.GetGroups(), Extra: u.GetExtra()},
		apiserver.Attributes{Verb: at.GetVerb(), Resource: at.IsResourceRequest(), Group: at.GetAPIGroup(),
			Version: at.GetAPIVersion(), Kind: at.GetResource(), Namespace: at.GetNamespace(), Name: at.GetName(),
			Subresource: at.GetSubresource(), Path: at.GetPath()})
	if err == nil {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionDeny, err.Error(), nil
}
