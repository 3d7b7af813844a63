package storage

import (
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/store"
)

// continueExpiredMessage is what upstream answers for a continue token below
// the retained history.
const continueExpiredMessage = "The provided continue parameter is too old to display a consistent list result. " +
	"You can start a new list without the continue parameter."

// storeError maps an error from the store to a Kubernetes API error. gr and
// name describe the object involved (name may be empty for lists and
// watches). An error that already is an API error is returned unchanged.
func storeError(err error, gr schema.GroupResource, name string) error {
	if err == nil {
		return nil
	}
	var se *apierrors.StatusError
	if errors.As(err, &se) {
		return se
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return apierrors.NewNotFound(gr, name)
	case errors.Is(err, store.ErrExists):
		return apierrors.NewAlreadyExists(gr, name)
	case errors.Is(err, store.ErrConflict):
		return conflictError(gr, name)
	case errors.Is(err, store.ErrCompacted):
		return apierrors.NewResourceExpired(err.Error())
	case errors.Is(err, store.ErrFutureRevision):
		return tooLargeRV(0, 0)
	case errors.Is(err, store.ErrTooLarge):
		return apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("object %s %q exceeds the size limit", gr, name))
	case errors.Is(err, store.ErrClosed):
		return apierrors.NewServiceUnavailable("the store is closed")
	case errors.Is(err, store.ErrUnavailable):
		return apierrors.NewServiceUnavailable("the store's database is unavailable; retry once it is back: " + err.Error())
	}
	return apierrors.NewInternalError(err)
}

// conflictError is the 409 answered when a resourceVersion precondition
// fails.
func conflictError(gr schema.GroupResource, name string) error {
	return apierrors.NewConflict(gr, name,
		errors.New("the object has been modified; please apply your changes to the latest version and try again"))
}

// expired is the 410 for a watch or exact read below the retained history.
func expired(requested, oldest int64) *apierrors.StatusError {
	return apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", requested, oldest))
}

// tooLargeRV is the 504 for a read at a resourceVersion the store has not
// reached yet.
func tooLargeRV(requested, current int64) *apierrors.StatusError {
	msg := "Too large resource version"
	if requested > 0 {
		msg = fmt.Sprintf("Too large resource version: %d, current: %d", requested, current)
	}
	err := apierrors.NewTimeoutError(msg, 1)
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{
		Type:    metav1.CauseTypeResourceVersionTooLarge,
		Message: "Too large resource version",
	}}
	return err
}
