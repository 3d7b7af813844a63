package controllers

import (
	"context"
	"errors"
	"fmt"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Namespace condition reasons, as upstream's namespace controller writes
// them.
const (
	reasonDiscoveryFailed       = "DiscoveryFailed"
	reasonResourcesDiscovered   = "ResourcesDiscovered"
	reasonParsedGroupVersions   = "ParsedGroupVersions"
	reasonContentDeleted        = "ContentDeleted"
	reasonContentDeletionFailed = "ContentDeletionFailed"
	reasonContentRemaining      = "SomeResourcesRemain"
	reasonNoContentRemaining    = "ContentRemoved"
	reasonFinalizersRemaining   = "SomeFinalizersRemain"
	reasonNoFinalizersRemaining = "ContentHasNoFinalizers"
)

// namespaceController empties a namespace being deleted, then removes the
// kubernetes finalizer from its spec so the hub deletes it.
type namespaceController struct {
	m     *Manager
	meta  metadata.Interface   // these two act as the namespace
	kube  kubernetes.Interface // controller's own identity
	log   *slog.Logger
	queue *kit.Queue

	mu         sync.Mutex
	namespaces *watchedResource // the namespaces informer, once watched
}

func newNamespaceController(m *Manager, meta metadata.Interface, kube kubernetes.Interface, log *slog.Logger) *namespaceController {
	return &namespaceController{
		m:     m,
		meta:  meta,
		kube:  kube,
		log:   log,
		queue: kit.NewQueue("namespace", kit.WithBackoff(5*time.Millisecond, time.Minute)),
	}
}

// contentDeleted tells the controller an object of a namespace is gone, so
// a terminating namespace waiting on it is looked at again at once.
func (nc *namespaceController) contentDeleted(namespace string) {
	nc.mu.Lock()
	w := nc.namespaces
	nc.mu.Unlock()
	if w == nil {
		return
	}
	obj, ok, err := w.informer.GetIndexer().GetByKey(namespace)
	if err != nil || !ok {
		return
	}
	if p, ok := metaOf(obj); ok && p.DeletionTimestamp != nil {
		nc.queue.Add(namespace)
	}
}

// watch registers the controller's handlers on the namespaces informer.
func (nc *namespaceController) watch(w *watchedResource) {
	nc.mu.Lock()
	nc.namespaces = w
	nc.mu.Unlock()
	enqueue := func(obj any) {
		if p, ok := metaOf(obj); ok && p.DeletionTimestamp != nil {
			nc.queue.Add(p.Name)
		}
	}
	_, err := w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, n any) { enqueue(n) },
	})
	if err != nil {
		nc.log.Warn("add event handler", "err", err)
	}
}

// contentResult is what one pass over a namespace's content found.
type contentResult struct {
	remaining     map[string]int // resource → objects left
	finalizers    map[string]int // finalizer → objects holding it
	failures      []string
	estimate      time.Duration // time until graceful deletions end
	discoveryFail error
}

// sync deletes a terminating namespace's content and, once none is left,
// finalizes it. While content remains it looks again when its graceful
// deletions should be over (at most 15s), or after a second; content held
// by finalizers is looked at again with growing delays, as after a
// failure, and its deletion queues the namespace at once.
func (nc *namespaceController) sync(ctx context.Context, name string) error {
	ns, err := nc.kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get namespace: %w", err)
	}
	if ns.DeletionTimestamp == nil || !slices.Contains(ns.Spec.Finalizers, corev1.FinalizerKubernetes) {
		return nil
	}
	if ns.Status.Phase != corev1.NamespaceTerminating {
		// The hub sets the phase when it sets the deletion timestamp;
		// be lenient with one that did not.
		nc.log.Debug("namespace being deleted is not Terminating", "namespace", name)
	}

	res := nc.deleteContent(ctx, name)
	nc.updateConditions(ctx, ns, res)

	switch {
	case res.discoveryFail != nil:
		return res.discoveryFail
	case len(res.failures) > 0:
		return errors.New(strings.Join(res.failures, "; "))
	case len(res.remaining) > 0:
		wait := min(res.estimate, 15*time.Second)
		if wait <= 0 && len(res.finalizers) > 0 {
			return errors.New(describeCounts("Some content in the namespace has finalizers remaining: ", res.finalizers, "resource instances"))
		}
		if wait <= 0 {
			wait = time.Second
		}
		nc.log.Debug("namespace content remains", "namespace", name, "remaining", res.remaining, "after", wait)
		return kit.RequeueAfter(wait)
	}

	// Empty: hand the namespace back to the hub without our finalizer.
	ns.Spec.Finalizers = slices.DeleteFunc(ns.Spec.Finalizers, func(f corev1.FinalizerName) bool {
		return f == corev1.FinalizerKubernetes
	})
	_, err = nc.kube.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("finalize namespace: %w", err)
	}
	nc.log.Info("namespace emptied and finalized", "namespace", name)
	return nil
}

// deleteContent deletes every namespaced object of a namespace and counts
// what is left.
func (nc *namespaceController) deleteContent(ctx context.Context, ns string) contentResult {
	res := contentResult{remaining: map[string]int{}, finalizers: map[string]int{}}
	// Discovery must be fresh: an unknown resource would leave content
	// behind unseen.
	if err := nc.m.discover(ctx); err != nil {
		nc.log.Debug("rediscover resources before emptying namespace", "err", err)
	}
	resources := nc.m.namespacedResources()
	if len(resources) == 0 {
		res.discoveryFail = errors.New("no namespaced resources discovered")
		return res
	}
	background := metav1.DeletePropagationBackground
	for _, info := range resources {
		r := nc.meta.Resource(info.gvr).Namespace(ns)
		gr := info.gvr.GroupResource().String()
		if info.can("deletecollection") {
			err := r.DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &background}, metav1.ListOptions{})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsMethodNotSupported(err) {
				res.failures = append(res.failures, fmt.Sprintf("delete %s: %v", gr, err))
				continue
			}
		}
		list, err := r.List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
			continue
		}
		if err != nil {
			res.failures = append(res.failures, fmt.Sprintf("list %s: %v", gr, err))
			continue
		}
		for i := range list.Items {
			item := &list.Items[i]
			if item.DeletionTimestamp == nil && !info.can("deletecollection") {
				err := r.Delete(ctx, item.Name, metav1.DeleteOptions{PropagationPolicy: &background})
				if apierrors.IsNotFound(err) {
					continue
				}
				if err != nil {
					res.failures = append(res.failures, fmt.Sprintf("delete %s %s: %v", gr, item.Name, err))
				}
			}
			res.remaining[gr]++
			for _, f := range item.Finalizers {
				res.finalizers[f]++
			}
			if item.DeletionTimestamp != nil && item.DeletionGracePeriodSeconds != nil {
				if left := time.Until(item.DeletionTimestamp.Time); left > res.estimate {
					res.estimate = left
				}
			}
		}
	}
	return res
}

// updateConditions writes the namespace's deletion conditions when they
// changed. Failing to write them does not hold up the deletion.
func (nc *namespaceController) updateConditions(ctx context.Context, ns *corev1.Namespace, res contentResult) {
	want := []corev1.NamespaceCondition{
		cond(corev1.NamespaceDeletionDiscoveryFailure, res.discoveryFail != nil, reasonDiscoveryFailed, reasonResourcesDiscovered, errString(res.discoveryFail)),
		cond(corev1.NamespaceDeletionGVParsingFailure, false, "", reasonParsedGroupVersions, ""),
		cond(corev1.NamespaceDeletionContentFailure, len(res.failures) > 0, reasonContentDeletionFailed, reasonContentDeleted, strings.Join(res.failures, "; ")),
		cond(corev1.NamespaceContentRemaining, len(res.remaining) > 0, reasonContentRemaining, reasonNoContentRemaining, describeCounts("Some resources are remaining: ", res.remaining, "instances")),
		cond(corev1.NamespaceFinalizersRemaining, len(res.finalizers) > 0, reasonFinalizersRemaining, reasonNoFinalizersRemaining, describeCounts("Some content in the namespace has finalizers remaining: ", res.finalizers, "resource instances")),
	}
	changed := false
	now := metav1.Now()
	conds := slices.Clone(ns.Status.Conditions)
	for _, w := range want {
		i := slices.IndexFunc(conds, func(c corev1.NamespaceCondition) bool { return c.Type == w.Type })
		if i < 0 {
			w.LastTransitionTime = now
			conds = append(conds, w)
			changed = true
			continue
		}
		c := conds[i]
		if c.Status != w.Status || c.Reason != w.Reason || c.Message != w.Message {
			if c.Status != w.Status {
				w.LastTransitionTime = now
			} else {
				w.LastTransitionTime = c.LastTransitionTime
			}
			conds[i] = w
			changed = true
		}
	}
	if !changed {
		return
	}
	upd := ns.DeepCopy()
	upd.Status.Conditions = conds
	got, err := nc.kube.CoreV1().Namespaces().UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	if err != nil {
		nc.log.Debug("update namespace conditions", "namespace", ns.Name, "err", err)
		return
	}
	*ns = *got
}

func cond(t corev1.NamespaceConditionType, isTrue bool, trueReason, falseReason, msg string) corev1.NamespaceCondition {
	if isTrue {
		return corev1.NamespaceCondition{Type: t, Status: corev1.ConditionTrue, Reason: trueReason, Message: msg}
	}
	return corev1.NamespaceCondition{Type: t, Status: corev1.ConditionFalse, Reason: falseReason, Message: falseMessages[t]}
}

// falseMessages are upstream's messages for conditions that do not hold.
var falseMessages = map[corev1.NamespaceConditionType]string{
	corev1.NamespaceDeletionDiscoveryFailure: "All resources successfully discovered",
	corev1.NamespaceDeletionGVParsingFailure: "All legacy kube types successfully parsed",
	corev1.NamespaceDeletionContentFailure:   "All content successfully deleted, may be waiting on finalization",
	corev1.NamespaceContentRemaining:         "All content successfully removed",
	corev1.NamespaceFinalizersRemaining:      "All content-preserving finalizers finished",
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func describeCounts(prefix string, counts map[string]int, unit string) string {
	if len(counts) == 0 {
		return ""
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s has %d %s", k, counts[k], unit)
	}
	return prefix + strings.Join(parts, ", ")
}
