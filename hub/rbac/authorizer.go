package rbac

import (
	"context"
	"log/slog"
	"sync"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/storage"
)

// Config configures an Authorizer.
type Config struct {
	// Storage holds the RBAC objects. Required.
	Storage storage.API
	// Logger receives watch restarts; nil uses slog.Default().
	Logger *slog.Logger
}

// Authorizer decides requests from RBAC objects; see the package comment.
type Authorizer struct {
	cfg Config

	mu sync.RWMutex
	// guarded by mu
	idx    *index
	viewMu sync.RWMutex
	// views caches per-user merges of the index, guarded by viewMu; see
	// rolesFor.
	views map[viewKey][]*userView

	synced   chan struct{}
	syncOnce sync.Once
	// kinds listed at least once, guarded by mu
	listed map[string]bool
}

// New returns an Authorizer; Run must be running for it to know the
// cluster's roles and bindings.
func New(cfg Config) *Authorizer {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Authorizer{cfg: cfg, idx: newIndex(), synced: make(chan struct{}), listed: map[string]bool{}, views: map[viewKey][]*userView{}}
}

// SetStorage sets the storage the authorizer reads when it could not be
// given in Config: the storage takes the authorizer's Admitter among its
// admission, so it is built after the authorizer. Call it before Run.
func (a *Authorizer) SetStorage(st storage.API) { a.cfg.Storage = st }

// WaitSynced waits until Roles, ClusterRoles, RoleBindings and
// ClusterRoleBindings have all been listed once; false if ctx ended first.
func (a *Authorizer) WaitSynced(ctx context.Context) bool {
	select {
	case <-a.synced:
		return true
	case <-ctx.Done():
		return false
	}
}

// Authorize implements apiserver.Authorizer.
func (a *Authorizer) Authorize(u *auth.User, at apiserver.Attributes) error {
	if u.InGroup(pki.AdminGroup) {
		return nil
	}
	namespace := ""
	if at.Resource {
		namespace = at.Namespace
	}
	a.mu.RLock()
	v := a.rolesFor(u, namespace)
	allowed := allows(v.cluster, &at) || allows(v.inNS, &at)
	var missing []*roleSlot
	if !allowed {
		missing = missingRoles(v.cluster, v.inNS)
	}
	a.mu.RUnlock()
	if allowed {
		return nil
	}
	reason := ""
	if len(missing) > 0 {
		reason = "RBAC: " + notFound(missing, false).Error()
	}
	return forbidden(u, at, reason)
}

// allows reports whether one of the roles allows the request.
func allows(roles []*roleSlot, at *apiserver.Attributes) bool {
	for _, s := range roles {
		rules := s.rules
		for i := range rules {
			if ruleAllows(at, &rules[i]) {
				return true
			}
		}
	}
	return false
}

// missingRoles lists the roles that do not exist.
func missingRoles(lists ...[]*roleSlot) []*roleSlot {
	var out []*roleSlot
	for _, list := range lists {
		for _, s := range list {
			if !s.exists {
				out = append(out, s)
			}
		}
	}
	return out
}

// notFound is the error of bindings whose roles do not exist: as the
// authorizer's informer caches word it (role.rbac.authorization.k8s.io)
// or, registry set, as the API does (roles.rbac.authorization.k8s.io).
func notFound(missing []*roleSlot, registry bool) error {
	errs := make([]error, 0, len(missing))
	for _, s := range missing {
		res := "role"
		if s.cluster {
			res = "clusterrole"
		}
		if registry {
			res += "s"
		}
		errs = append(errs, apierrors.NewNotFound(schema.GroupResource{Group: rbacv1.GroupName, Resource: res}, s.name))
	}
	return utilerrors.NewAggregate(errs)
}
