package ingress

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// StatusWriter returns the client of the Ingresses of a namespace, which
// reads them and writes their status subresource.
type StatusWriter func(namespace string) IngressClient

// IngressClient is what the controller needs of a client of Ingresses;
// the edge agent's (edge/kube) and client-go's typed one both have it.
type IngressClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*networkingv1.Ingress, error)
	UpdateStatus(ctx context.Context, ing *networkingv1.Ingress, opts metav1.UpdateOptions) (*networkingv1.Ingress, error)
}

// statusRetry spaces the attempts of status writes that failed (the hub
// out of reach).
const statusRetry = 5 * time.Second

// statusWriter keeps the node's addresses in status.loadBalancer.ingress
// of every Ingress the controller serves, and out of those it no longer
// serves. Each node adds its own addresses and leaves the others'.
type statusWriter struct {
	client StatusWriter
	addrs  []string
	log    *slog.Logger

	mu      sync.Mutex
	pending map[types.NamespacedName]bool // true: add the addresses; false: remove them
	wake    chan struct{}
}

func newStatusWriter(client StatusWriter, addrs []string, log *slog.Logger) *statusWriter {
	return &statusWriter{client: client, addrs: addrs, log: log, pending: map[types.NamespacedName]bool{}, wake: make(chan struct{}, 1)}
}

// update computes the writes needed given every Ingress the controller
// knows and the ones it serves.
func (w *statusWriter) update(all []*networkingv1.Ingress, served []types.NamespacedName) {
	if len(w.addrs) == 0 {
		return
	}
	serve := make(map[types.NamespacedName]bool, len(served))
	for _, k := range served {
		serve[k] = true
	}
	pending := map[types.NamespacedName]bool{}
	for _, ing := range all {
		k := types.NamespacedName{Namespace: ing.Namespace, Name: ing.Name}
		has, hasAll := w.has(ing)
		if serve[k] && !hasAll || !serve[k] && has {
			pending[k] = serve[k]
		}
	}
	w.mu.Lock()
	w.pending = pending
	w.mu.Unlock()
	if len(pending) > 0 {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// has reports whether ing's status holds any and all of the addresses.
func (w *statusWriter) has(ing *networkingv1.Ingress) (anyOf, all bool) {
	all = true
	for _, a := range w.addrs {
		found := slices.ContainsFunc(ing.Status.LoadBalancer.Ingress, func(e networkingv1.IngressLoadBalancerIngress) bool { return e.IP == a })
		anyOf = anyOf || found
		all = all && found
	}
	return anyOf, all
}

// run makes the pending writes until ctx ends, retrying failed ones.
func (w *statusWriter) run(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-ctx.Done():
			retry.Stop()
			return
		case <-w.wake:
		case <-retry.C:
		}
		w.mu.Lock()
		todo := w.pending
		w.pending = map[types.NamespacedName]bool{}
		w.mu.Unlock()
		failed := map[types.NamespacedName]bool{}
		for k, add := range todo {
			if err := w.write(ctx, k, add); err != nil && ctx.Err() == nil {
				w.log.Debug("write ingress status", "ingress", k.String(), "err", err)
				failed[k] = add
			}
		}
		if len(failed) > 0 {
			w.mu.Lock()
			for k, add := range failed {
				if _, newer := w.pending[k]; !newer {
					w.pending[k] = add
				}
			}
			w.mu.Unlock()
			retry.Reset(statusRetry)
		}
	}
}

// write adds the node's addresses to, or removes them from, one Ingress's
// status, reading it again after a conflict.
func (w *statusWriter) write(ctx context.Context, k types.NamespacedName, add bool) error {
	for attempt := 0; ; attempt++ {
		ing, err := w.client(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		lb := &ing.Status.LoadBalancer
		has, hasAll := w.has(ing)
		switch {
		case add && hasAll, !add && !has:
			return nil
		case add:
			for _, a := range w.addrs {
				if !slices.ContainsFunc(lb.Ingress, func(e networkingv1.IngressLoadBalancerIngress) bool { return e.IP == a }) {
					lb.Ingress = append(lb.Ingress, networkingv1.IngressLoadBalancerIngress{IP: a})
				}
			}
		default:
			lb.Ingress = slices.DeleteFunc(lb.Ingress, func(e networkingv1.IngressLoadBalancerIngress) bool { return slices.Contains(w.addrs, e.IP) })
		}
		_, err = w.client(k.Namespace).UpdateStatus(ctx, ing, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) && attempt < 5 {
			continue
		}
		if err == nil {
			w.log.Info("wrote ingress status", "ingress", k.String(), "serving", add)
		}
		return err
	}
}
