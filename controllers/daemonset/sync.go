package daemonset

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// templateGenerationKey is the annotation (set by the hub) and pod label
// carrying the template generation, which older clients read.
const templateGenerationKey = "deprecated.daemonset.template.generation"

// podTemplateGenerationLabel carries that generation on daemon pods.
const podTemplateGenerationLabel = "pod-template-generation"

// sync converges one DaemonSet.
func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name := kit.SplitKey(key)
	cached, err := c.sets.DaemonSets(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.exp.Forget(key)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read daemonset: %w", err)
	}
	ds := cached.DeepCopy()
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || sel.Empty() {
		return nil
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	if ds.DeletionTimestamp != nil {
		return nil
	}
	cur, old, err := c.history(ctx, ds, sel)
	if err != nil {
		return err
	}
	hash := cur.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]
	byNode, err := c.podsByNode(ctx, ds, sel)
	if err != nil {
		return err
	}
	if c.exp.Satisfied(key) {
		if err := c.manage(ctx, key, ds, nodes, byNode, hash); err != nil {
			return err
		}
		if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType && c.exp.Satisfied(key) {
			if err := c.rollingUpdate(ctx, key, ds, nodes, byNode, hash); err != nil {
				return err
			}
		}
		if err := c.cleanupHistory(ctx, ds, byNode, cur, old); err != nil {
			return err
		}
	}
	return c.updateStatus(ctx, ds, nodes, byNode, hash)
}

// podsByNode claims the DaemonSet's pods and groups them by target node.
func (c *Controller) podsByNode(ctx context.Context, ds *appsv1.DaemonSet, sel labels.Selector) (map[string][]*corev1.Pod, error) {
	cands := kit.ByIndex[*corev1.Pod](c.podIndex, string(ds.UID))
	cands = append(cands, kit.ByIndex[*corev1.Pod](c.podIndex, kit.OrphanIndexKey(ds.Namespace))...)
	claimer := &kit.Claimer{Owner: ds, OwnerGVK: controllerKind, Selector: sel,
		Fresh: func(ctx context.Context) (metav1.Object, error) {
			return c.client.AppsV1().DaemonSets(ds.Namespace).Get(ctx, ds.Name, metav1.GetOptions{})
		}}
	pods, err := kit.Claim(ctx, claimer, cands, func(ctx context.Context, name string, data []byte) error {
		_, err := c.client.CoreV1().Pods(ds.Namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim pods: %w", err)
	}
	out := map[string][]*corev1.Pod{}
	for _, p := range pods {
		n := targetNode(p)
		out[n] = append(out[n], p)
	}
	for _, ps := range out {
		slices.SortFunc(ps, func(a, b *corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	}
	return out, nil
}

// history returns the current revision (created, or renumbered to be the
// newest, as needed) and the old ones.
func (c *Controller) history(ctx context.Context, ds *appsv1.DaemonSet, sel labels.Selector) (*appsv1.ControllerRevision, []*appsv1.ControllerRevision, error) {
	cands := kit.ByIndex[*appsv1.ControllerRevision](c.revIndex, string(ds.UID))
	cands = append(cands, kit.ByIndex[*appsv1.ControllerRevision](c.revIndex, kit.OrphanIndexKey(ds.Namespace))...)
	claimer := &kit.Claimer{Owner: ds, OwnerGVK: controllerKind, Selector: sel,
		Fresh: func(ctx context.Context) (metav1.Object, error) {
			return c.client.AppsV1().DaemonSets(ds.Namespace).Get(ctx, ds.Name, metav1.GetOptions{})
		}}
	revs, err := kit.Claim(ctx, claimer, cands, func(ctx context.Context, name string, data []byte) error {
		_, err := c.client.AppsV1().ControllerRevisions(ds.Namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("claim controller revisions: %w", err)
	}
	kit.SortRevisions(revs)
	data, err := kit.TemplatePatch(&ds.Spec.Template)
	if err != nil {
		return nil, nil, err
	}
	probe := &appsv1.ControllerRevision{Data: runtimeRaw(data)}
	var cur *appsv1.ControllerRevision
	var old []*appsv1.ControllerRevision
	for _, r := range revs {
		if cur == nil && kit.EqualRevisions(r, probe) {
			cur = r
			continue
		}
		old = append(old, r)
	}
	next := kit.NextRevisionNumber(revs)
	switch {
	case cur == nil:
		cur, err = c.createRevision(ctx, ds, data, next)
		if err != nil {
			return nil, nil, err
		}
	case cur.Revision < next-1:
		// Back to an earlier template: it becomes the newest revision.
		cp := cur.DeepCopy()
		cp.Revision = next
		cur, err = c.client.AppsV1().ControllerRevisions(ds.Namespace).Update(ctx, cp, metav1.UpdateOptions{})
		if err != nil {
			return nil, nil, fmt.Errorf("renumber controller revision: %w", err)
		}
	}
	return cur, old, nil
}

// createRevision stores the DaemonSet's template as revision number,
// named <ds>-<pod-template hash> like upstream, bumping the collision
// count on a name clash with different data.
func (c *Controller) createRevision(ctx context.Context, ds *appsv1.DaemonSet, data []byte, number int64) (*appsv1.ControllerRevision, error) {
	collisions := ptr.Deref(ds.Status.CollisionCount, 0)
	api := c.client.AppsV1().ControllerRevisions(ds.Namespace)
	for range 100 {
		hash := kit.TemplateHash(&ds.Spec.Template, &collisions)
		lbls := maps.Clone(ds.Spec.Template.Labels)
		if lbls == nil {
			lbls = map[string]string{}
		}
		lbls[appsv1.DefaultDaemonSetUniqueLabelKey] = hash
		cr := &appsv1.ControllerRevision{
			ObjectMeta: metav1.ObjectMeta{
				Name: kit.RevisionName(ds.Name, hash), Namespace: ds.Namespace, Labels: lbls,
				Annotations:     maps.Clone(ds.Annotations),
				OwnerReferences: []metav1.OwnerReference{kit.ControllerRef(ds, controllerKind)},
			},
			Data:     runtimeRaw(data),
			Revision: number,
		}
		created, err := api.Create(ctx, cr, metav1.CreateOptions{})
		if err == nil {
			return created, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create controller revision: %w", err)
		}
		existing, gerr := api.Get(ctx, cr.Name, metav1.GetOptions{})
		if gerr != nil {
			return nil, fmt.Errorf("read controller revision: %w", gerr)
		}
		if metav1.IsControlledBy(existing, ds) && kit.EqualRevisions(existing, cr) {
			return existing, nil
		}
		collisions++
		cp := ds.DeepCopy()
		cp.Status.CollisionCount = ptr.To(collisions)
		if _, err := c.client.AppsV1().DaemonSets(ds.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("record collision count: %w", err)
		}
	}
	return nil, fmt.Errorf("create controller revision for %s: too many hash collisions", ds.Name)
}

// manage creates missing daemon pods and deletes those that must go: on
// nodes that no longer qualify, failed ones, duplicates, and pods for
// nodes that are gone.
func (c *Controller) manage(ctx context.Context, key string, ds *appsv1.DaemonSet, nodes []*corev1.Node, byNode map[string][]*corev1.Pod, hash string) error {
	var create []string
	var del []*corev1.Pod
	surge := allowsSurge(ds)
	known := map[string]bool{}
	for _, n := range nodes {
		known[n.Name] = true
		run, keep := ShouldRun(ds, n)
		pods := byNode[n.Name]
		live := slices.DeleteFunc(slices.Clone(pods), func(p *corev1.Pod) bool { return p.DeletionTimestamp != nil })
		switch {
		case run && len(pods) == 0:
			create = append(create, n.Name)
		case keep:
			var running []*corev1.Pod
			for _, p := range live {
				if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
					c.recorder.Eventf(ds, corev1.EventTypeWarning, "FailedDaemonPod", "Found failed daemon pod %s/%s on node %s, will try to kill it", p.Namespace, p.Name, n.Name)
					del = append(del, p)
					continue
				}
				running = append(running, p)
			}
			if len(running) > 1 {
				del = append(del, extras(running, hash, surge)...)
			}
		case !keep:
			del = append(del, live...)
		}
	}
	for node, pods := range byNode {
		if known[node] {
			continue
		}
		for _, p := range pods {
			if p.Spec.NodeName == "" && p.DeletionTimestamp == nil {
				del = append(del, p) // for a node that is gone
			}
		}
	}
	return c.syncNodes(ctx, key, ds, del, create, hash)
}

// extras are the pods beyond one per node (two while surging: the oldest
// updated and the oldest not updated), oldest kept.
func extras(running []*corev1.Pod, hash string, surge bool) []*corev1.Pod {
	if !surge {
		return running[1:]
	}
	var out []*corev1.Pod
	var seenNew, seenOld bool
	for _, p := range running {
		if updated(p, hash) {
			if seenNew {
				out = append(out, p)
			}
			seenNew = true
		} else {
			if seenOld {
				out = append(out, p)
			}
			seenOld = true
		}
	}
	return out
}

func updated(p *corev1.Pod, hash string) bool {
	return p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] == hash
}

// syncNodes deletes pods and creates pods for nodes, within the burst
// limit, in slow-start batches, under expectations.
func (c *Controller) syncNodes(ctx context.Context, key string, ds *appsv1.DaemonSet, del []*corev1.Pod, create []string, hash string) error {
	create = create[:min(len(create), c.burst)]
	del = del[:min(len(del), c.burst)]
	if len(create) == 0 && len(del) == 0 {
		return nil
	}
	uids := make([]types.UID, len(del))
	for i, p := range del {
		uids[i] = p.UID
	}
	c.exp.Expect(key, len(create), uids)
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range del {
		wg.Go(func() {
			if err := c.control.DeletePod(ctx, ds, p); err != nil {
				c.exp.DeletionObserved(key, p.UID)
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	gen := ds.Annotations[templateGenerationKey]
	next := 0
	var nmu sync.Mutex
	done, err := slowStart(len(create), func() error {
		nmu.Lock()
		node := create[next]
		next++
		nmu.Unlock()
		pod := kit.PodFromTemplate(&ds.Spec.Template, ds, controllerKind)
		pod.Labels = maps.Clone(pod.Labels)
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		pod.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] = hash
		if gen != "" {
			pod.Labels[podTemplateGenerationLabel] = gen
		}
		pod.Spec.Affinity = pinAffinity(pod.Spec.Affinity, node)
		pod.Spec.Tolerations = withTolerations(pod.Spec.Tolerations, pod.Spec.HostNetwork)
		_, err := c.control.CreatePod(ctx, ds, pod)
		return err
	})
	for range len(create) - done {
		c.exp.CreationObserved(key)
	}
	if err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// slowStart runs fn count times in doubling batches from 1, stopping at
// the first batch with a failure; it returns the successes.
func slowStart(count int, fn func() error) (int, error) {
	done := 0
	for batch := min(count, 1); batch > 0; batch = min(2*batch, count-done) {
		var mu sync.Mutex
		var failed []error
		var wg sync.WaitGroup
		for range batch {
			wg.Go(func() {
				if err := fn(); err != nil {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		done += batch - len(failed)
		if len(failed) > 0 {
			return done, errors.Join(failed...)
		}
	}
	return done, nil
}

func allowsSurge(ds *appsv1.DaemonSet) bool {
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ds.Spec.UpdateStrategy.Type == appsv1.OnDeleteDaemonSetStrategyType || ru == nil || ru.MaxSurge == nil {
		return false
	}
	v, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxSurge, 1, true)
	return err == nil && v > 0
}

// Budgets resolves maxSurge and maxUnavailable against the number of
// nodes that should run the daemon, rounding percentages up; when both
// come to zero, one node may be unavailable.
func Budgets(ds *appsv1.DaemonSet, desired int) (surge, unavailable int) {
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ru == nil {
		ru = &appsv1.RollingUpdateDaemonSet{}
	}
	one := intstr.FromInt32(1)
	zero := intstr.FromInt32(0)
	mu, ms := ru.MaxUnavailable, ru.MaxSurge
	if mu == nil {
		mu = &one
	}
	if ms == nil {
		ms = &zero
	}
	u, err := intstr.GetScaledValueFromIntOrPercent(mu, desired, true)
	if err != nil {
		u = 1
	}
	s, err := intstr.GetScaledValueFromIntOrPercent(ms, desired, true)
	if err != nil {
		s = 0
	}
	if desired > 0 && u == 0 && s == 0 {
		u = 1
	}
	return s, u
}

// rollingUpdate replaces old pods node by node. Without surge it deletes
// old pods (unavailable ones at once, others within maxUnavailable) and
// lets manage create the new ones; with surge it creates the new pod
// first (within maxSurge) and deletes the old one once the new is
// available.
func (c *Controller) rollingUpdate(ctx context.Context, key string, ds *appsv1.DaemonSet, nodes []*corev1.Node, byNode map[string][]*corev1.Pod, hash string) error {
	now := c.now()
	desired := 0
	should := map[string]bool{}
	for _, n := range nodes {
		if run, _ := ShouldRun(ds, n); run {
			desired++
			should[n.Name] = true
		}
	}
	maxSurge, maxUnavailable := Budgets(ds, desired)
	avail := func(p *corev1.Pod) bool { return kit.IsPodAvailable(p, ds.Spec.MinReadySeconds, now) }
	nodeNames := slices.Sorted(maps.Keys(byNode))

	if maxSurge == 0 {
		unavailable := 0
		var replace, candidates []*corev1.Pod
		for _, node := range nodeNames {
			newPod, oldPod, ok := split(byNode[node], hash)
			switch {
			case !ok, newPod == nil && oldPod == nil, newPod != nil && oldPod != nil:
				unavailable++
			case newPod != nil:
				if !avail(newPod) {
					unavailable++
				}
			case !avail(oldPod):
				replace = append(replace, oldPod)
			case unavailable < maxUnavailable:
				candidates = append(candidates, oldPod)
			}
		}
		n := min(max(maxUnavailable-unavailable, 0), len(candidates))
		return c.syncNodes(ctx, key, ds, append(replace, candidates[:n]...), nil, hash)
	}

	surging := 0
	var del []*corev1.Pod
	var allowed, candidates []string
	for _, node := range nodeNames {
		newPod, oldPod, ok := split(byNode[node], hash)
		if !ok {
			continue
		}
		if !should[node] {
			continue // manage removes it
		}
		switch {
		case oldPod != nil && newPod == nil:
			if !avail(oldPod) {
				allowed = append(allowed, node)
			} else {
				candidates = append(candidates, node)
			}
		case oldPod != nil && newPod != nil:
			if avail(newPod) {
				del = append(del, oldPod)
			} else {
				surging++
			}
		}
	}
	n := min(max(maxSurge-surging, 0), len(candidates))
	return c.syncNodes(ctx, key, ds, del, append(allowed, candidates[:n]...), hash)
}

// split returns a node's updated and old pod (ignoring pods being
// deleted); ok is false when there are several of either.
func split(pods []*corev1.Pod, hash string) (newPod, oldPod *corev1.Pod, ok bool) {
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		if updated(p, hash) {
			if newPod != nil {
				return nil, nil, false
			}
			newPod = p
		} else {
			if oldPod != nil {
				return nil, nil, false
			}
			oldPod = p
		}
	}
	return newPod, oldPod, true
}

// cleanupHistory deletes the oldest revisions no pod runs beyond
// revisionHistoryLimit (default 10).
func (c *Controller) cleanupHistory(ctx context.Context, ds *appsv1.DaemonSet, byNode map[string][]*corev1.Pod, cur *appsv1.ControllerRevision, old []*appsv1.ControllerRevision) error {
	limit := int(ptr.Deref(ds.Spec.RevisionHistoryLimit, 10))
	if len(old) <= limit {
		return nil
	}
	live := map[string]bool{cur.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]: true}
	for _, pods := range byNode {
		for _, p := range pods {
			live[p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]] = true
		}
	}
	var dead []*appsv1.ControllerRevision
	for _, r := range old {
		if !live[r.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]] {
			dead = append(dead, r)
		}
	}
	var errs []error
	for i := 0; i < len(old)-limit && i < len(dead); i++ {
		err := c.client.AppsV1().ControllerRevisions(ds.Namespace).Delete(ctx, dead[i].Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete controller revision %s: %w", dead[i].Name, err))
		}
	}
	return errors.Join(errs...)
}

// updateStatus writes the counts kubectl shows and rollout status reads.
func (c *Controller) updateStatus(ctx context.Context, ds *appsv1.DaemonSet, nodes []*corev1.Node, byNode map[string][]*corev1.Pod, hash string) error {
	now := c.now()
	st := ds.Status.DeepCopy()
	var desired, current, misscheduled, ready, available, updatedN int32
	for _, n := range nodes {
		run, _ := ShouldRun(ds, n)
		pods := slices.DeleteFunc(slices.Clone(byNode[n.Name]), func(p *corev1.Pod) bool { return p.DeletionTimestamp != nil })
		if !run {
			if len(pods) > 0 {
				misscheduled++
			}
			continue
		}
		desired++
		if len(pods) == 0 {
			continue
		}
		current++
		p := pods[0] // the oldest
		if kit.IsPodReady(p) {
			ready++
			if kit.IsPodAvailable(p, ds.Spec.MinReadySeconds, now) {
				available++
			}
		}
		if updated(p, hash) {
			updatedN++
		}
	}
	st.DesiredNumberScheduled = desired
	st.CurrentNumberScheduled = current
	st.NumberMisscheduled = misscheduled
	st.NumberReady = ready
	st.NumberAvailable = available
	st.NumberUnavailable = desired - available
	st.UpdatedNumberScheduled = updatedN
	st.ObservedGeneration = ds.Generation
	if ds.Spec.MinReadySeconds > 0 && ready != available {
		key, _ := kit.Key(ds)
		c.queue.AddAfter(key, time.Duration(ds.Spec.MinReadySeconds)*time.Second)
	}
	if apiequality.Semantic.DeepEqual(&ds.Status, st) {
		return nil
	}
	cp := ds.DeepCopy()
	cp.Status = *st
	_, err := c.client.AppsV1().DaemonSets(ds.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("update daemonset status: %w", err)
	}
	return nil
}

func runtimeRaw(b []byte) runtime.RawExtension { return runtime.RawExtension{Raw: b} }
