package registry

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The claim pools of Services: one claim per cluster IP and per node port,
// as upstream's IPAddress objects and port allocation bitmaps record them.
const (
	serviceIPPool = "service-ips"
	nodePortPool  = "node-ports"
)

// staleClaimAge is how old a claim must be before an allocator may take it
// over when no stored object holds its value: older than any create that
// claimed it and is still under way, so only a create its hub died in the
// middle of leaves such a claim. Upstream's repair loop frees them the same
// way, a while after they were made.
const staleClaimAge = 2 * time.Minute

// serviceAllocation is what one admit handed out.
type serviceAllocation struct {
	ips   []netip.Addr
	ports []int32
}

// admitClaimed allocates as admit does and then claims each new value in
// the store. A picked value another hub's Service holds is left to it and
// another picked; a requested one is refused as already allocated.
func (a *serviceAllocator) admitClaimed(ctx context.Context, l Lister, claims Claims, svc, old *corev1.Service, usedIPs map[netip.Addr]string, usedPorts map[int32]string) error {
	gk := corev1.SchemeGroupVersion.WithKind("Service").GroupKind()
	orig := svc.DeepCopy()
	claim := Claim{Owner: string(svc.UID), Object: serviceOwner(svc)}
	if old != nil {
		claim.Owner = string(old.UID)
	}
	// A claim is stale when it is old and no stored Service uses its
	// value: its create failed with its hub.
	stale := func(value func(*corev1.Service) bool) func(Claim) bool {
		return func(held Claim) bool {
			if time.Since(held.Time) < staleClaimAge {
				return false
			}
			objs, err := l.List(ctx, "services", "")
			if err != nil {
				return false
			}
			for _, o := range objs {
				if s, ok := o.(*corev1.Service); ok && value(s) {
					return false
				}
			}
			return true
		}
	}
	// What other creates hold now, not yet stored, is taken too; claims
	// old enough to be stale may be picked and then taken over. The
	// claims are read again after each conflict: other hubs claim on.
	seeClaims := func() error {
		for pool, add := range map[string]func(string, string){
			serviceIPPool: func(v, o string) {
				if ip, err := netip.ParseAddr(v); err == nil {
					usedIPs[ip] = o
				}
			},
			nodePortPool: func(v, o string) {
				if p, err := strconv.Atoi(v); err == nil {
					usedPorts[int32(p)] = o
				}
			},
		} {
			held, err := claims.ListClaims(ctx, pool)
			if err != nil {
				return err
			}
			for v, c := range held {
				if time.Since(c.Time) < staleClaimAge && c.Owner != claim.Owner {
					add(v, "claimed by "+c.Object)
				}
			}
		}
		return nil
	}
	if err := seeClaims(); err != nil {
		return apierrors.NewInternalError(fmt.Errorf("allocate: %w", err))
	}
	for attempt := 0; ; attempt++ {
		got, errs := a.admit(svc, old, usedIPs, usedPorts)
		if len(errs) > 0 {
			return apierrors.NewInvalid(gk, svc.Name, errs)
		}
		held, err := a.claimAll(ctx, claims, claim, got, stale)
		// The claims hold the values from now on: the reservations here
		// would outlive deletes made through other hubs.
		a.forget(claim, got)
		if err == nil && held == nil {
			return nil
		}
		a.unclaim(ctx, claims, claim, got)
		if err != nil {
			return apierrors.NewInternalError(fmt.Errorf("allocate: %w", err))
		}
		if attempt >= 32 {
			return apierrors.NewInternalError(fmt.Errorf("allocate: the values picked kept being taken by other hubs"))
		}
		// held is a value another Service holds. If this Service asked
		// for it, that is its answer; otherwise pick again without it.
		*svc = *orig.DeepCopy()
		switch v := held.(type) {
		case netip.Addr:
			if svc.Spec.ClusterIP == v.String() {
				return apierrors.NewInvalid(gk, svc.Name, field.ErrorList{field.Invalid(field.NewPath("spec", "clusterIPs"),
					requestedIPs(svc), fmt.Sprintf("failed to allocate IP %s: provided IP is already allocated", v))})
			}
			usedIPs[v] = "another hub's Service"
		case int32:
			for i, p := range svc.Spec.Ports {
				if p.NodePort == v {
					return apierrors.NewInvalid(gk, svc.Name, field.ErrorList{field.Invalid(
						field.NewPath("spec", "ports").Index(i).Child("nodePort"), v, "provided port is already allocated")})
				}
			}
			usedPorts[v] = "another hub's Service"
		}
		if err := seeClaims(); err != nil {
			return apierrors.NewInternalError(fmt.Errorf("allocate: %w", err))
		}
	}
}

func requestedIPs(svc *corev1.Service) []string {
	if len(svc.Spec.ClusterIPs) > 0 {
		return svc.Spec.ClusterIPs
	}
	return []string{svc.Spec.ClusterIP}
}

// claimAll claims got's values; it returns the first value another owner
// holds, or a store error.
func (a *serviceAllocator) claimAll(ctx context.Context, claims Claims, c Claim, got serviceAllocation, stale func(func(*corev1.Service) bool) func(Claim) bool) (any, error) {
	for _, ip := range got.ips {
		usesIP := func(s *corev1.Service) bool {
			for _, x := range requestedIPs(s) {
				if x == ip.String() {
					return true
				}
			}
			return false
		}
		if _, ok, err := claims.Claim(ctx, serviceIPPool, ip.String(), c, stale(usesIP)); err != nil || !ok {
			if err != nil {
				return nil, err
			}
			return ip, nil
		}
	}
	for _, p := range got.ports {
		usesPort := func(s *corev1.Service) bool {
			for _, sp := range s.Spec.Ports {
				if sp.NodePort == p {
					return true
				}
			}
			return false
		}
		if _, ok, err := claims.Claim(ctx, nodePortPool, strconv.Itoa(int(p)), c, stale(usesPort)); err != nil || !ok {
			if err != nil {
				return nil, err
			}
			return p, nil
		}
	}
	return nil, nil
}

// forget drops the reservations one admit made here.
func (a *serviceAllocator) forget(c Claim, got serviceAllocation) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ip := range got.ips {
		if a.ips[ip] == c.Object {
			delete(a.ips, ip)
		}
	}
	for _, p := range got.ports {
		if a.ports[p] == c.Object {
			delete(a.ports, p)
		}
	}
}

// unclaim drops the claims one admit made in the store.
func (a *serviceAllocator) unclaim(ctx context.Context, claims Claims, c Claim, got serviceAllocation) {
	for _, ip := range got.ips {
		_ = claims.Unclaim(ctx, serviceIPPool, ip.String(), c.Owner)
	}
	for _, p := range got.ports {
		_ = claims.Unclaim(ctx, nodePortPool, strconv.Itoa(int(p)), c.Owner)
	}
}

// releaseService frees what a Service holds, here and, when l records
// claims, in the store. Claims of another object (another UID) stay.
func (a *serviceAllocator) releaseService(ctx context.Context, l Lister, svc *corev1.Service) {
	a.release(svc)
	claims, ok := l.(Claims)
	if !ok {
		return
	}
	owner := string(svc.UID)
	for _, s := range requestedIPs(svc) {
		if ip, err := netip.ParseAddr(s); err == nil {
			_ = claims.Unclaim(ctx, serviceIPPool, ip.String(), owner)
		}
	}
	for _, p := range svc.Spec.Ports {
		if p.NodePort != 0 {
			_ = claims.Unclaim(ctx, nodePortPool, strconv.Itoa(int(p.NodePort)), owner)
		}
	}
}
