package statefulset

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// sync converges one StatefulSet.
func (c *Controller) sync(ctx context.Context, key string) error {
	ns, name := kit.SplitKey(key)
	cached, err := c.sets.StatefulSets(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read statefulset: %w", err)
	}
	set := cached.DeepCopy()
	sel, err := metav1.LabelSelectorAsSelector(set.Spec.Selector)
	if err != nil || sel.Empty() {
		return nil
	}
	pods, err := c.claimPods(ctx, set, sel)
	if err != nil {
		return err
	}
	revs, err := c.claimRevisions(ctx, set, sel)
	if err != nil {
		return err
	}
	current, update, collisions, err := c.revisions(ctx, set, revs)
	if err != nil {
		return err
	}
	status, err := c.converge(ctx, set, pods, current, update, collisions)
	if err != nil {
		// Still report what was done.
		_ = c.writeStatus(ctx, set, status)
		return err
	}
	if err := c.writeStatus(ctx, set, status); err != nil {
		return err
	}
	return c.truncateHistory(ctx, set, pods, revs, current, update)
}

func (c *Controller) claimPods(ctx context.Context, set *appsv1.StatefulSet, sel labels.Selector) ([]*corev1.Pod, error) {
	cands := kit.ByIndex[*corev1.Pod](c.podIndex, string(set.UID))
	cands = append(cands, kit.ByIndex[*corev1.Pod](c.podIndex, kit.OrphanIndexKey(set.Namespace))...)
	// Only pods named after the set may be adopted: the name is the
	// identity.
	cands = slices.DeleteFunc(cands, func(p *corev1.Pod) bool {
		return metav1.GetControllerOfNoCopy(p) == nil && ordinalOf(set, p) < 0
	})
	claimer := &kit.Claimer{Owner: set, OwnerGVK: controllerKind, Selector: sel, Fresh: c.fresh(set)}
	pods, err := kit.Claim(ctx, claimer, cands, func(ctx context.Context, name string, data []byte) error {
		_, err := c.client.CoreV1().Pods(set.Namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim pods: %w", err)
	}
	return pods, nil
}

func (c *Controller) claimRevisions(ctx context.Context, set *appsv1.StatefulSet, sel labels.Selector) ([]*appsv1.ControllerRevision, error) {
	cands := kit.ByIndex[*appsv1.ControllerRevision](c.revIndex, string(set.UID))
	cands = append(cands, kit.ByIndex[*appsv1.ControllerRevision](c.revIndex, kit.OrphanIndexKey(set.Namespace))...)
	claimer := &kit.Claimer{Owner: set, OwnerGVK: controllerKind, Selector: sel, Fresh: c.fresh(set)}
	revs, err := kit.Claim(ctx, claimer, cands, func(ctx context.Context, name string, data []byte) error {
		_, err := c.client.AppsV1().ControllerRevisions(set.Namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim controller revisions: %w", err)
	}
	kit.SortRevisions(revs)
	return revs, nil
}

func (c *Controller) fresh(set *appsv1.StatefulSet) func(context.Context) (metav1.Object, error) {
	return func(ctx context.Context) (metav1.Object, error) {
		return c.client.AppsV1().StatefulSets(set.Namespace).Get(ctx, set.Name, metav1.GetOptions{})
	}
}

// revisionFor builds the revision of set's current template.
func revisionFor(set *appsv1.StatefulSet, number int64, collisions *int32) (*appsv1.ControllerRevision, error) {
	data, err := kit.TemplatePatch(&set.Spec.Template)
	if err != nil {
		return nil, err
	}
	cr := kit.NewRevision(set, controllerKind, set.Spec.Template.Labels, data, number, collisions)
	// kubectl rollout history shows the change-cause of each revision.
	if len(set.Annotations) > 0 {
		cr.Annotations = maps.Clone(set.Annotations)
	}
	return cr, nil
}

// revisions finds (creating or renumbering as needed) the update revision
// for the set's template and the current revision its status names.
func (c *Controller) revisions(ctx context.Context, set *appsv1.StatefulSet, revs []*appsv1.ControllerRevision) (current, update *appsv1.ControllerRevision, collisions int32, err error) {
	collisions = ptr.Deref(set.Status.CollisionCount, 0)
	want, err := revisionFor(set, kit.NextRevisionNumber(revs), &collisions)
	if err != nil {
		return nil, nil, 0, err
	}
	equal := kit.FindEqualRevisions(revs, want)
	switch {
	case len(equal) > 0 && kit.EqualRevisions(revs[len(revs)-1], equal[len(equal)-1]):
		update = revs[len(revs)-1] // unchanged template
	case len(equal) > 0:
		// Back to an earlier template (a rollback): renumber that
		// revision as the newest instead of making a copy.
		cr := equal[len(equal)-1].DeepCopy()
		cr.Revision = want.Revision
		update, err = c.client.AppsV1().ControllerRevisions(set.Namespace).Update(ctx, cr, metav1.UpdateOptions{})
		if err != nil {
			return nil, nil, 0, fmt.Errorf("renumber controller revision: %w", err)
		}
	default:
		update, err = kit.CreateRevision(ctx, c.client, set, want, &collisions)
		if err != nil {
			return nil, nil, 0, err
		}
	}
	for _, r := range revs {
		if r.Name == set.Status.CurrentRevision {
			current = r
		}
	}
	if current == nil {
		current = update
	}
	return current, update, collisions, nil
}

// templateOf returns the pod template a revision holds.
func templateOf(set *appsv1.StatefulSet, rev *appsv1.ControllerRevision) *corev1.PodTemplateSpec {
	t, err := kit.TemplateFromRevision(rev)
	if err != nil {
		return &set.Spec.Template // unreadable old revision: use the current template
	}
	return t
}

// converge creates, fixes and deletes pods for one step, and returns the
// status to write.
func (c *Controller) converge(ctx context.Context, set *appsv1.StatefulSet, pods []*corev1.Pod, current, update *appsv1.ControllerRevision, collisions int32) (appsv1.StatefulSetStatus, error) {
	now := c.now()
	minReady := set.Spec.MinReadySeconds
	start, n := startOrdinal(set), replicaCount(set)
	st := appsv1.StatefulSetStatus{
		ObservedGeneration: set.Generation,
		CurrentRevision:    current.Name,
		UpdateRevision:     update.Name,
		CollisionCount:     ptr.To(collisions),
		Conditions:         set.Status.Conditions,
	}
	replicas := make([]*corev1.Pod, n)
	var condemned []*corev1.Pod
	for _, p := range pods {
		st.Replicas++
		if runningAndReady(p) {
			st.ReadyReplicas++
			if runningAndAvailable(p, minReady, now) {
				st.AvailableReplicas++
			}
		}
		if created(p) && !terminating(p) {
			if revisionOf(p) == current.Name {
				st.CurrentReplicas++
			}
			if revisionOf(p) == update.Name {
				st.UpdatedReplicas++
			}
		}
		switch ord := ordinalOf(set, p); {
		case ord >= start && ord < start+n:
			replicas[ord-start] = p
		case ord >= 0:
			condemned = append(condemned, p)
		}
	}
	currentTmpl, updateTmpl := templateOf(set, current), &set.Spec.Template
	partition := 0
	if ru := set.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.Partition != nil {
		partition = int(*ru.Partition)
	}
	rolling := set.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType
	// A missing pod is made at the current revision below the partition
	// of a rolling update, at the update revision otherwise.
	versioned := func(ord int) *corev1.Pod {
		if rolling && ord < start+partition {
			return newPod(set, currentTmpl, current.Name, ord)
		}
		return newPod(set, updateTmpl, update.Name, ord)
	}
	for i := range replicas {
		if replicas[i] == nil {
			replicas[i] = versioned(start + i)
		}
	}
	slices.SortFunc(condemned, func(a, b *corev1.Pod) int { return ordinalOf(set, a) - ordinalOf(set, b) })

	var firstUnhealthy *corev1.Pod
	for _, p := range append(slices.Clone(replicas), condemned...) {
		if !healthy(p, minReady, now) && firstUnhealthy == nil {
			firstUnhealthy = p
		}
	}
	if set.DeletionTimestamp != nil {
		return st, nil
	}
	ordered := set.Spec.PodManagementPolicy != appsv1.ParallelPodManagement
	var errs []error

	for i, p := range replicas {
		ord := start + i
		if created(p) && finished(p) && !terminating(p) {
			// A failed or completed pod is replaced under the same name.
			c.recorder.Eventf(set, corev1.EventTypeWarning, "RecreatingFailedPod", "StatefulSet %s/%s is recreating failed Pod %s", set.Namespace, set.Name, p.Name)
			if err := c.deletePod(ctx, set, p); err != nil {
				return st, err
			}
			if revisionOf(p) == current.Name {
				st.CurrentReplicas--
			}
			if revisionOf(p) == update.Name {
				st.UpdatedReplicas--
			}
			st.Replicas--
			replicas[i] = versioned(ord)
			p = replicas[i]
		}
		if !created(p) {
			if err := c.createPod(ctx, set, p, ord); err != nil {
				if ordered {
					return st, err
				}
				errs = append(errs, err)
				continue
			}
			st.Replicas++
			if revisionOf(p) == current.Name {
				st.CurrentReplicas++
			}
			if revisionOf(p) == update.Name {
				st.UpdatedReplicas++
			}
			if ordered {
				return st, nil // one at a time: wait for it to be Running and Ready
			}
			continue
		}
		if p.Status.Phase == corev1.PodPending {
			if err := c.ensureClaims(ctx, set, p, ord, false); err != nil {
				errs = append(errs, err)
			}
		}
		if ordered && (terminating(p) || !runningAndAvailable(p, minReady, now)) {
			c.requeueForAvailability(set, p, now)
			return st, errors.Join(errs...)
		}
		if !terminating(p) && (!identityMatches(set, p, ord) || !c.claimsRetained(set, p, ord, false)) {
			if err := c.fixIdentity(ctx, set, p, ord); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return st, errors.Join(errs...)
	}

	// Scale down, from the highest ordinal; with OrderedReady one at a
	// time, and only while everything below is healthy.
	for i := len(condemned) - 1; i >= 0; i-- {
		p := condemned[i]
		if terminating(p) {
			if ordered {
				return st, nil
			}
			continue
		}
		if ordered && !healthy(p, minReady, now) && p != firstUnhealthy {
			return st, nil
		}
		if err := c.ensureClaims(ctx, set, p, ordinalOf(set, p), true); err != nil {
			return st, err
		}
		if err := c.deletePod(ctx, set, p); err != nil {
			return st, err
		}
		if revisionOf(p) == current.Name {
			st.CurrentReplicas--
		}
		if revisionOf(p) == update.Name {
			st.UpdatedReplicas--
		}
		if ordered {
			return st, nil
		}
	}

	if !rolling {
		return st, nil // OnDelete: pods update when the user deletes them
	}
	// Rolling update from the highest ordinal down to the partition, at
	// most maxUnavailable pods unavailable at once.
	maxUnavailable := 1
	if ru := set.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
		v, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, n, true)
		if err == nil && v > 0 {
			maxUnavailable = v
		}
	}
	unavailable := 0
	for _, p := range replicas {
		if !healthy(p, minReady, now) {
			unavailable++
		}
	}
	budget := maxUnavailable - unavailable
	for i := len(replicas) - 1; i >= partition && budget > 0; i-- {
		p := replicas[i]
		if revisionOf(p) == update.Name || terminating(p) {
			continue
		}
		c.log.Debug("updating pod", "statefulset", set.Name, "pod", p.Name, "rev", update.Name)
		if err := c.deletePod(ctx, set, p); err != nil {
			return st, err
		}
		if revisionOf(p) == current.Name {
			st.CurrentReplicas--
		}
		budget--
	}
	return st, nil
}

// requeueForAvailability looks at the set again when a ready pod becomes
// available after minReadySeconds.
func (c *Controller) requeueForAvailability(set *appsv1.StatefulSet, p *corev1.Pod, now time.Time) {
	if set.Spec.MinReadySeconds == 0 || !runningAndReady(p) {
		return
	}
	if d := kit.AvailableIn(p, set.Spec.MinReadySeconds, now); d > 0 {
		key, _ := kit.Key(set)
		c.queue.AddAfter(key, d)
	}
}

func (c *Controller) createPod(ctx context.Context, set *appsv1.StatefulSet, pod *corev1.Pod, ord int) error {
	if err := c.ensureClaims(ctx, set, pod, ord, false); err != nil {
		return err
	}
	_, err := c.client.CoreV1().Pods(set.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil // our cache is behind
	}
	if err != nil {
		c.recorder.Eventf(set, corev1.EventTypeWarning, "FailedCreate", "create Pod %s in StatefulSet %s failed error: %v", pod.Name, set.Name, err)
		return fmt.Errorf("create pod %s: %w", pod.Name, err)
	}
	c.recorder.Eventf(set, corev1.EventTypeNormal, "SuccessfulCreate", "create Pod %s in StatefulSet %s successful", pod.Name, set.Name)
	return nil
}

func (c *Controller) deletePod(ctx context.Context, set *appsv1.StatefulSet, pod *corev1.Pod) error {
	err := c.client.CoreV1().Pods(set.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		c.recorder.Eventf(set, corev1.EventTypeWarning, "FailedDelete", "delete Pod %s in StatefulSet %s failed error: %v", pod.Name, set.Name, err)
		return fmt.Errorf("delete pod %s: %w", pod.Name, err)
	}
	c.recorder.Eventf(set, corev1.EventTypeNormal, "SuccessfulDelete", "delete Pod %s in StatefulSet %s successful", pod.Name, set.Name)
	return nil
}

// fixIdentity restores a pod's identity labels and hostname and its
// claims' owner references.
func (c *Controller) fixIdentity(ctx context.Context, set *appsv1.StatefulSet, p *corev1.Pod, ord int) error {
	if err := c.ensureClaims(ctx, set, p, ord, false); err != nil {
		return err
	}
	if identityMatches(set, p, ord) {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{
		PodNameLabel: p.Name, PodIndexLabel: fmt.Sprint(ord),
	}}})
	_, err := c.client.CoreV1().Pods(set.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("restore identity of pod %s: %w", p.Name, err)
	}
	return nil
}

// claimsRetained reports whether every claim of the pod exists with the
// owner references the retention policy asks for.
func (c *Controller) claimsRetained(set *appsv1.StatefulSet, p *corev1.Pod, ord int, condemned bool) bool {
	for _, t := range set.Spec.VolumeClaimTemplates {
		claim, err := c.claims.PersistentVolumeClaims(set.Namespace).Get(ClaimName(set, t.Name, ord))
		if err != nil {
			return false
		}
		if !sameOwners(claim.OwnerReferences, claimOwners(set, p, condemned)) {
			return false
		}
	}
	return true
}

// ensureClaims creates the pod's missing claims from the templates and
// sets their owner references for the retention policy.
func (c *Controller) ensureClaims(ctx context.Context, set *appsv1.StatefulSet, p *corev1.Pod, ord int, condemned bool) error {
	var errs []error
	for _, t := range set.Spec.VolumeClaimTemplates {
		name := ClaimName(set, t.Name, ord)
		owners := claimOwners(set, p, condemned)
		claim, err := c.claims.PersistentVolumeClaims(set.Namespace).Get(name)
		switch {
		case apierrors.IsNotFound(err):
			pvc := &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{
					Name: name, Namespace: set.Namespace,
					Labels:          claimLabels(set, &t),
					Annotations:     maps.Clone(t.Annotations),
					OwnerReferences: owners,
				},
				Spec: *t.Spec.DeepCopy(),
			}
			_, err := c.client.CoreV1().PersistentVolumeClaims(set.Namespace).Create(ctx, pvc, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				c.recorder.Eventf(set, corev1.EventTypeWarning, "FailedCreate", "create Claim %s for Pod %s in StatefulSet %s failed error: %v", name, p.Name, set.Name, err)
				errs = append(errs, fmt.Errorf("create claim %s: %w", name, err))
				continue
			}
			if err == nil {
				c.recorder.Eventf(set, corev1.EventTypeNormal, "SuccessfulCreate", "create Claim %s Pod %s in StatefulSet %s success", name, p.Name, set.Name)
			}
		case err != nil:
			errs = append(errs, fmt.Errorf("read claim %s: %w", name, err))
		case claim.DeletionTimestamp == nil && !sameOwners(claim.OwnerReferences, ownedPart(claim.OwnerReferences, set, p, owners)):
			// Owners other than the set and the pod are left alone.
			cp := claim.DeepCopy()
			cp.OwnerReferences = ownedPart(claim.OwnerReferences, set, p, owners)
			if _, err := c.client.CoreV1().PersistentVolumeClaims(set.Namespace).Update(ctx, cp, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("update claim %s owners: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// claimLabels are the template's labels plus the set's selector labels.
func claimLabels(set *appsv1.StatefulSet, t *corev1.PersistentVolumeClaim) map[string]string {
	l := maps.Clone(t.Labels)
	if l == nil {
		l = map[string]string{}
	}
	maps.Copy(l, set.Spec.Selector.MatchLabels)
	return l
}

// ownedPart replaces, among refs, those to the set or to pods of the
// set's name with want.
func ownedPart(refs []metav1.OwnerReference, set *appsv1.StatefulSet, p *corev1.Pod, want []metav1.OwnerReference) []metav1.OwnerReference {
	var out []metav1.OwnerReference
	for _, r := range refs {
		if r.UID == set.UID || (r.Kind == "Pod" && strings.HasPrefix(r.Name, set.Name+"-")) {
			continue
		}
		out = append(out, r)
	}
	return append(out, want...)
}

func sameOwners(a, b []metav1.OwnerReference) bool {
	key := func(r metav1.OwnerReference) string { return string(r.UID) }
	as, bs := map[string]bool{}, map[string]bool{}
	for _, r := range a {
		as[key(r)] = true
	}
	for _, r := range b {
		bs[key(r)] = true
	}
	return maps.Equal(as, bs)
}

// writeStatus writes status when it changed; a finished rolling update
// makes the update revision current.
func (c *Controller) writeStatus(ctx context.Context, set *appsv1.StatefulSet, st appsv1.StatefulSetStatus) error {
	if set.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType &&
		st.UpdatedReplicas == st.Replicas && st.ReadyReplicas == st.Replicas {
		st.CurrentReplicas = st.UpdatedReplicas
		st.CurrentRevision = st.UpdateRevision
	}
	if apiequality.Semantic.DeepEqual(set.Status, st) {
		return nil
	}
	cp := set.DeepCopy()
	cp.Status = st
	_, err := c.client.AppsV1().StatefulSets(set.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("update statefulset status: %w", err)
	}
	return nil
}

// truncateHistory deletes the oldest revisions no pod uses beyond
// revisionHistoryLimit (default 10).
func (c *Controller) truncateHistory(ctx context.Context, set *appsv1.StatefulSet, pods []*corev1.Pod, revs []*appsv1.ControllerRevision, current, update *appsv1.ControllerRevision) error {
	live := map[string]bool{current.Name: true, update.Name: true}
	for _, p := range pods {
		live[revisionOf(p)] = true
	}
	var dead []*appsv1.ControllerRevision
	for _, r := range revs {
		if !live[r.Name] {
			dead = append(dead, r)
		}
	}
	limit := int(ptr.Deref(set.Spec.RevisionHistoryLimit, 10))
	var errs []error
	for i := 0; i < len(dead)-limit; i++ {
		err := c.client.AppsV1().ControllerRevisions(set.Namespace).Delete(ctx, dead[i].Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete controller revision %s: %w", dead[i].Name, err))
		}
	}
	return errors.Join(errs...)
}
