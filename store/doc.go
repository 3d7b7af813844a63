// Package store keeps tether's API objects: a current-state table, a bounded
// change log, one global revision counter and an in-memory watch fan-out.
//
// The store knows nothing of Kubernetes kinds. It keeps opaque values under a
// [Key] together with the labels and selectable fields the hub extracted from
// them, so lists and watches can be filtered without decoding values. Every
// successful write is assigned the next global revision; the hub exposes that
// revision as metadata.resourceVersion. Values are stored as given: the hub
// strips resourceVersion before writing and sets it from [Object.Revision]
// after reading.
//
// # Errors
//
// Every error a Store returns for a reason the caller can act on matches, with
// errors.Is, exactly one of the sentinels [ErrNotFound], [ErrExists],
// [ErrConflict], [ErrCompacted], [ErrFutureRevision], [ErrTooLarge],
// [ErrClosed] or [ErrUnavailable] (a networked backend whose database is
// unreachable). Anything else is an internal failure.
//
// # Concurrency
//
// All methods are safe for concurrent use. Slices and maps handed to a Store
// are not retained after the call returns; slices and maps returned by a Store
// belong to the caller and may be modified.
package store
