package apiextensions

import (
	"context"
	"errors"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// installManager is the field manager of the definitions Install writes.
const installManager = "tether-hub"

// Install makes the stored definitions of defs' names hold defs' specs:
// it creates those missing and updates those whose spec differs (after
// defaulting), leaving their metadata and status alone. The hub calls it
// before the controller runs, so the definitions it ships are served
// before it reports ready, like built-in kinds. Hubs sharing a store may
// race: a conflict reads the stored definition again.
func Install(ctx context.Context, st storage.API, reg *registry.Registry, defs []*apiextensionsv1.CustomResourceDefinition) error {
	k := reg.Lookup(gvrCRD)
	if k == nil {
		return errors.New("install definitions: CustomResourceDefinitions are not served")
	}
	var errs []error
	for _, d := range defs {
		if err := installOne(ctx, st, k, d.DeepCopy()); err != nil {
			errs = append(errs, fmt.Errorf("install %s: %w", d.Name, err))
		}
	}
	return errors.Join(errs...)
}

func installOne(ctx context.Context, st storage.API, k *registry.Kind, want *apiextensionsv1.CustomResourceDefinition) error {
	want.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(want)
	opts := storage.Options{FieldManager: installManager}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		obj, err := st.Get(ctx, k, "", want.Name)
		if apierrors.IsNotFound(err) {
			_, err = st.Create(ctx, k, "", want.DeepCopy(), opts)
			if apierrors.IsAlreadyExists(err) && attempt < 10 {
				continue
			}
			return err
		}
		if err != nil {
			return err
		}
		cur, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
		if !ok {
			return fmt.Errorf("stored definition is a %T", obj)
		}
		if equality.Semantic.DeepEqual(cur.Spec, want.Spec) {
			return nil
		}
		upd := cur.DeepCopy()
		upd.Spec = want.Spec
		_, err = st.Update(ctx, k, "", want.Name, upd, opts)
		if (apierrors.IsConflict(err) || apierrors.IsNotFound(err)) && attempt < 10 {
			continue
		}
		return err
	}
}
