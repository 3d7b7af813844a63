package apiextensions

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// pollRemaining is how often the cleanup looks whether the custom objects
// it deleted are gone (their own finalizers may hold them).
const pollRemaining = 250 * time.Millisecond

// terminate starts removing a deleted definition's objects, once: the
// cleanup finalizer holds the definition until they are gone.
func (c *Controller) terminate(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) error {
	if !apihelpers.CRDHasFinalizer(crd, apiextensionsv1.CustomResourceCleanupFinalizer) {
		return nil // storage removes it; the watch then says so
	}
	c.mu.Lock()
	busy := c.cleaning[crd.Name]
	c.cleaning[crd.Name] = true
	c.mu.Unlock()
	if busy {
		return nil
	}
	go func() {
		err := c.cleanup(ctx, crd)
		c.mu.Lock()
		delete(c.cleaning, crd.Name)
		c.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("apiextensions: removing custom objects failed; retrying", "crd", crd.Name, "err", err)
			c.q.AddRateLimited(crd.Name)
		}
	}()
	return nil
}

// cleanup does what upstream's finalizer controller does: it marks the
// definition Terminating (its kinds then refuse creates), deletes every
// custom object in every namespace, waits until they are gone, stops
// serving the kinds and removes the finalizer.
func (c *Controller) cleanup(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) error {
	established := apihelpers.IsCRDConditionTrue(crd, apiextensionsv1.Established)
	var kinds []*registry.Kind
	if established {
		if err := c.serve(crd, true); err != nil {
			return err
		}
		kinds = c.kindsOf(crd.Name)
	}
	upd := crd.DeepCopy()
	apihelpers.SetCRDCondition(upd, apiextensionsv1.CustomResourceDefinitionCondition{
		Type: apiextensionsv1.Terminating, Status: apiextensionsv1.ConditionTrue,
		Reason: "InstanceDeletionInProgress", Message: "CustomResource deletion is in progress",
	})
	if err := c.writeStatus(ctx, crd, upd); err != nil {
		return err
	}
	crd, upd = upd, upd.DeepCopy()
	done := apiextensionsv1.CustomResourceDefinitionCondition{
		Type: apiextensionsv1.Terminating, Status: apiextensionsv1.ConditionFalse,
		Reason: "NeverEstablished", Message: "resource was never established",
	}
	if k := storageKind(crd, kinds); k != nil {
		if err := c.deleteInstances(ctx, k); err != nil {
			failed := apiextensionsv1.CustomResourceDefinitionCondition{
				Type: apiextensionsv1.Terminating, Status: apiextensionsv1.ConditionTrue,
				Reason: "InstanceDeletionFailed", Message: fmt.Sprintf("could not issue all deletes: %v", err),
			}
			apihelpers.SetCRDCondition(upd, failed)
			_ = c.writeStatus(ctx, crd, upd)
			return err
		}
		done.Reason, done.Message = "InstanceDeletionCompleted", "removed all instances"
	}
	apihelpers.SetCRDCondition(upd, done)
	if err := c.writeStatus(ctx, crd, upd); err != nil {
		return err
	}
	c.unserve(crd.Name)
	_, err := c.cfg.Storage.GuaranteedUpdate(ctx, c.kind, "", crd.Name, storage.Options{FieldManager: fieldManager},
		func(cur runtime.Object) (runtime.Object, error) {
			cd, ok := cur.(*apiextensionsv1.CustomResourceDefinition)
			if !ok {
				return nil, fmt.Errorf("unexpected %T", cur)
			}
			if cd.UID != crd.UID {
				return nil, apierrors.NewConflict(gvrCRD.GroupResource(), crd.Name, fmt.Errorf("uid changed"))
			}
			apihelpers.CRDRemoveFinalizer(cd, apiextensionsv1.CustomResourceCleanupFinalizer)
			return cd, nil
		})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("remove finalizer of %s: %w", crd.Name, err)
	}
	return nil
}

// storageKind returns the kind of kinds whose version is the
// definition's storage version (any of them reads every object).
func storageKind(crd *apiextensionsv1.CustomResourceDefinition, kinds []*registry.Kind) *registry.Kind {
	if len(kinds) == 0 {
		return nil
	}
	if v, err := apihelpers.GetCRDStorageVersion(crd); err == nil {
		for _, k := range kinds {
			if k.GVK.Version == v {
				return k
			}
		}
	}
	return kinds[0]
}

// deleteInstances deletes every object of k, a namespace at a time as
// upstream does, and waits until none is left.
func (c *Controller) deleteInstances(ctx context.Context, k *registry.Kind) error {
	items, err := c.list(ctx, k)
	if err != nil {
		return err
	}
	done := sets.New[string]()
	for _, obj := range items {
		m, err := meta.Accessor(obj)
		if err != nil || done.Has(m.GetNamespace()) {
			continue
		}
		done.Insert(m.GetNamespace())
		if _, err := c.cfg.Storage.DeleteCollection(ctx, k, m.GetNamespace(), storage.ListOptions{}, nil, false); err != nil {
			return fmt.Errorf("delete %s in %q: %w", k.QualifiedResource(), m.GetNamespace(), err)
		}
	}
	for {
		items, err := c.list(ctx, k)
		if err != nil {
			return err
		}
		if len(items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollRemaining):
		}
	}
}

func (c *Controller) list(ctx context.Context, k *registry.Kind) ([]runtime.Object, error) {
	obj, err := c.cfg.Storage.List(ctx, k, "", storage.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", k.QualifiedResource(), err)
	}
	items, err := meta.ExtractList(obj)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", k.QualifiedResource(), err)
	}
	return items, nil
}
