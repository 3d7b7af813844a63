// Package admission is the hub's admission that applies across kinds, run
// by hub/storage on every create: LimitRange defaults and limits for pods
// and claims, ResourceQuota enforcement with its usage accounting, and the
// protection finalizers of claims and volumes. LimitRanges are applied to
// claim updates too, so a claim cannot be resized past them.
//
// Both read the namespace's LimitRanges and ResourceQuotas from storage at
// each create, so a change to them takes effect on the next request.
// Quota decisions for one namespace are serialized from the check until the
// write is over, and usage is computed from what is stored, so concurrent
// creates cannot together overrun a quota.
package admission

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
)

// Admission holds the admitters; bind it to storage with SetStorage before
// the first request.
type Admission struct {
	mu     sync.RWMutex
	st     storage.API
	log    *slog.Logger
	quota  *quota
	limits *limitRanger
}

// New returns the admission chain; logger may be nil.
func New(logger *slog.Logger) *Admission {
	if logger == nil {
		logger = slog.Default()
	}
	a := &Admission{log: logger}
	a.limits = &limitRanger{a: a}
	a.quota = newQuota(a)
	return a
}

// SetStorage binds the admitters to the storage they read from.
func (a *Admission) SetStorage(st storage.API) {
	a.mu.Lock()
	a.st = st
	a.mu.Unlock()
}

func (a *Admission) storage() storage.API {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.st
}

// Admitters returns the chain in the order it must run: limit ranges set
// defaults that quota then counts.
func (a *Admission) Admitters() []storage.Admitter {
	return []storage.Admitter{a.limits, a.quota, protection{}}
}

// Run keeps the status of every ResourceQuota current until ctx ends.
func (a *Admission) Run(ctx context.Context) { a.quota.run(ctx) }

func kindOf(resource, group string) *registry.Kind {
	return registry.Lookup(schema.GroupVersionResource{Group: group, Version: "v1", Resource: resource})
}

var _ storage.UpdateAdmitter = (*limitRanger)(nil)

var (
	podsKind        = kindOf("pods", "")
	servicesKind    = kindOf("services", "")
	pvcKind         = kindOf("persistentvolumeclaims", "")
	pvKind          = kindOf("persistentvolumes", "")
	quotasKind      = kindOf("resourcequotas", "")
	limitRangesKind = kindOf("limitranges", "")
)

// listIn lists the objects of kind k in namespace ns.
func (a *Admission) listIn(ctx context.Context, k *registry.Kind, ns string) ([]runtime.Object, error) {
	st := a.storage()
	if st == nil {
		return nil, fmt.Errorf("admission is not bound to storage")
	}
	l, ok := st.(interface{ Lister() registry.Lister })
	if ok {
		return l.Lister().List(ctx, k.QualifiedResource(), ns)
	}
	return nil, fmt.Errorf("storage cannot list for admission")
}
