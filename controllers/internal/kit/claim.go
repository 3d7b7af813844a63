package kit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// PatchFunc applies a strategic merge patch to the named object of the
// kind being claimed, e.g. a closure over Pods(ns).Patch.
type PatchFunc func(ctx context.Context, name string, data []byte) error

// Claimer decides which of a set of objects (pods, ReplicaSets,
// ControllerRevisions) belong to one controller:
//
//   - objects it controls whose labels still match are kept;
//   - objects it controls whose labels stopped matching are released, by a
//     patch removing its owner reference;
//   - orphans (no controller reference) whose labels match are adopted, by
//     a patch adding a controller reference, but only while the owner is
//     not being deleted, checked once per Claimer against a fresh read of
//     the owner (the cache may be stale, and adopting into an owner that is
//     going away would get the orphan garbage-collected);
//   - objects controlled by someone else are ignored.
//
// A Claimer is built per sync and is not safe for concurrent use.
type Claimer struct {
	Owner    metav1.Object
	OwnerGVK schema.GroupVersionKind
	Selector labels.Selector
	// Fresh reads the owner from the hub, bypassing the cache; it is
	// called at most once, before the first adoption.
	Fresh func(ctx context.Context) (metav1.Object, error)

	once     sync.Once
	adoptErr error
}

// ErrOwnerGone is returned (wrapped) when adoption was refused because the
// owner is being deleted or was replaced.
var ErrOwnerGone = errors.New("owner deleted or replaced")

func (c *Claimer) canAdopt(ctx context.Context) error {
	c.once.Do(func() {
		if c.Owner.GetDeletionTimestamp() != nil {
			c.adoptErr = fmt.Errorf("adopt into %s: %w", c.Owner.GetName(), ErrOwnerGone)
			return
		}
		fresh, err := c.Fresh(ctx)
		if err != nil {
			c.adoptErr = fmt.Errorf("read owner %s before adoption: %w", c.Owner.GetName(), err)
			return
		}
		if fresh.GetUID() != c.Owner.GetUID() || fresh.GetDeletionTimestamp() != nil {
			c.adoptErr = fmt.Errorf("adopt into %s: %w", c.Owner.GetName(), ErrOwnerGone)
		}
	})
	return c.adoptErr
}

// Claim returns the objects of objs that the owner controls after adopting
// and releasing as described on [Claimer]. Objects are not mutated; an
// adopted object is returned as read (without the new reference). Errors
// from individual patches are joined; objects already deleted or changed
// under it are skipped silently.
func Claim[T metav1.Object](ctx context.Context, c *Claimer, objs []T, patch PatchFunc) ([]T, error) {
	var claimed []T
	var errs []error
	for _, o := range objs {
		ref := metav1.GetControllerOfNoCopy(o)
		matches := c.Selector.Matches(labels.Set(o.GetLabels()))
		switch {
		case ref != nil && ref.UID != c.Owner.GetUID():
			// Someone else's.
		case ref != nil:
			if matches {
				claimed = append(claimed, o)
				continue
			}
			if c.Owner.GetDeletionTimestamp() != nil {
				continue // the garbage collector will handle them with the owner
			}
			if err := patch(ctx, o.GetName(), releasePatch(o.GetUID(), c.Owner.GetUID())); err != nil && !ignorable(err) {
				errs = append(errs, fmt.Errorf("release %s: %w", o.GetName(), err))
			}
		default:
			if !matches || o.GetDeletionTimestamp() != nil {
				continue
			}
			if err := c.canAdopt(ctx); err != nil {
				if errors.Is(err, ErrOwnerGone) {
					continue
				}
				errs = append(errs, err)
				continue
			}
			err := patch(ctx, o.GetName(), adoptPatch(o.GetUID(), ControllerRef(c.Owner, c.OwnerGVK)))
			if err != nil {
				if !ignorable(err) {
					errs = append(errs, fmt.Errorf("adopt %s: %w", o.GetName(), err))
				}
				continue
			}
			claimed = append(claimed, o)
		}
	}
	return claimed, errors.Join(errs...)
}

// ignorable is a patch error meaning the object is gone or no longer the
// one read (the UID in the patch did not match).
func ignorable(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsConflict(err) || apierrors.IsInvalid(err)
}

// adoptPatch adds ref to the object's owner references; the object's UID
// in the patch makes it fail on a different object of the same name.
func adoptPatch(uid types.UID, ref metav1.OwnerReference) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"ownerReferences": []metav1.OwnerReference{ref},
		"uid":             uid,
	}})
	return b
}

// releasePatch removes the owner's reference by its UID, the merge key of
// ownerReferences in a strategic merge patch.
func releasePatch(uid, owner types.UID) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"ownerReferences": []map[string]any{{"$patch": "delete", "uid": owner}},
		"uid":             uid,
	}})
	return b
}
