package deployment

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Annotations the controller keeps on Deployments and ReplicaSets; kubectl
// rollout history and undo read them.
const (
	RevisionAnnotation        = "deployment.kubernetes.io/revision"
	RevisionHistoryAnnotation = "deployment.kubernetes.io/revision-history"
	DesiredReplicasAnnotation = "deployment.kubernetes.io/desired-replicas"
	MaxReplicasAnnotation     = "deployment.kubernetes.io/max-replicas"
	lastAppliedAnnotation     = "kubectl.kubernetes.io/last-applied-configuration"
	rollbackToAnnotation      = "deprecated.deployment.rollback.to"

	// maxRevisionHistoryChars bounds the revision-history annotation.
	maxRevisionHistoryChars = 2000
)

// Condition reasons, as kubectl describe and rollout status show them.
const (
	ReasonNewRSCreated       = "NewReplicaSetCreated"
	ReasonFoundNewRS         = "FoundNewReplicaSet"
	ReasonRSUpdated          = "ReplicaSetUpdated"
	ReasonNewRSAvailable     = "NewReplicaSetAvailable"
	ReasonTimedOut           = "ProgressDeadlineExceeded"
	ReasonFailedRSCreate     = "ReplicaSetCreateError"
	ReasonPaused             = "DeploymentPaused"
	ReasonResumed            = "DeploymentResumed"
	ReasonMinimumAvailable   = "MinimumReplicasAvailable"
	ReasonMinimumUnavailable = "MinimumReplicasUnavailable"
)

// replicas returns a ReplicaSet's or Deployment's spec.replicas (default 1
// for a nil pointer, as the hub defaults it).
func replicas(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

func isRolling(d *appsv1.Deployment) bool {
	return d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType
}

// Fenceposts resolves maxSurge and maxUnavailable against desired: surge
// rounds up, unavailable rounds down, and when both come to zero
// unavailable becomes 1 so a rollout can make progress.
func Fenceposts(maxSurge, maxUnavailable *intstr.IntOrString, desired int32) (surge, unavailable int32) {
	def := intstr.FromString("25%")
	if maxSurge == nil {
		maxSurge = &def
	}
	if maxUnavailable == nil {
		maxUnavailable = &def
	}
	s, err := intstr.GetScaledValueFromIntOrPercent(maxSurge, int(desired), true)
	if err != nil {
		s = 0
	}
	u, err := intstr.GetScaledValueFromIntOrPercent(maxUnavailable, int(desired), false)
	if err != nil {
		u = 0
	}
	if s == 0 && u == 0 {
		u = 1
	}
	return int32(s), int32(u)
}

// MaxSurge is how many pods above spec.replicas a rolling update may run.
func MaxSurge(d *appsv1.Deployment) int32 {
	if !isRolling(d) {
		return 0
	}
	ru := d.Spec.Strategy.RollingUpdate
	if ru == nil {
		ru = &appsv1.RollingUpdateDeployment{}
	}
	s, _ := Fenceposts(ru.MaxSurge, ru.MaxUnavailable, replicas(d.Spec.Replicas))
	return s
}

// MaxUnavailable is how many of spec.replicas may be unavailable during a
// rolling update, never more than spec.replicas.
func MaxUnavailable(d *appsv1.Deployment) int32 {
	want := replicas(d.Spec.Replicas)
	if !isRolling(d) || want == 0 {
		return 0
	}
	ru := d.Spec.Strategy.RollingUpdate
	if ru == nil {
		ru = &appsv1.RollingUpdateDeployment{}
	}
	_, u := Fenceposts(ru.MaxSurge, ru.MaxUnavailable, want)
	return min(u, want)
}

// equalIgnoreHash compares two pod templates, ignoring the
// pod-template-hash label the controller adds to ReplicaSets.
func equalIgnoreHash(a, b *corev1.PodTemplateSpec) bool {
	a, b = a.DeepCopy(), b.DeepCopy()
	delete(a.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
	delete(b.Labels, appsv1.DefaultDeploymentUniqueLabelKey)
	if len(a.Labels) == 0 {
		a.Labels = nil
	}
	if len(b.Labels) == 0 {
		b.Labels = nil
	}
	return apiequality.Semantic.DeepEqual(a, b)
}

// byCreation orders ReplicaSets oldest first, then by name.
func byCreation(a, b *appsv1.ReplicaSet) int {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		if a.CreationTimestamp.Before(&b.CreationTimestamp) {
			return -1
		}
		return 1
	}
	return strings.Compare(a.Name, b.Name)
}

// findNewRS returns the oldest ReplicaSet whose template equals the
// Deployment's: the one new pods belong to.
func findNewRS(d *appsv1.Deployment, rsList []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	sorted := slices.Clone(rsList)
	slices.SortFunc(sorted, byCreation)
	for _, rs := range sorted {
		if equalIgnoreHash(&rs.Spec.Template, &d.Spec.Template) {
			return rs
		}
	}
	return nil
}

// revisionOf parses a ReplicaSet's revision annotation (0 when absent).
func revisionOf(obj metav1.Object) int64 {
	v, err := strconv.ParseInt(obj.GetAnnotations()[RevisionAnnotation], 10, 64)
	if err != nil {
		return 0
	}
	return v
}

func maxRevision(rss []*appsv1.ReplicaSet) int64 {
	var m int64
	for _, rs := range rss {
		m = max(m, revisionOf(rs))
	}
	return m
}

func activeRSs(rss []*appsv1.ReplicaSet) []*appsv1.ReplicaSet {
	var out []*appsv1.ReplicaSet
	for _, rs := range rss {
		if rs != nil && replicas(rs.Spec.Replicas) > 0 {
			out = append(out, rs)
		}
	}
	return out
}

// sumSpec, sumStatus, sumReady and sumAvailable add up the counts of
// ReplicaSets (nil entries count zero).
func sumSpec(rss []*appsv1.ReplicaSet) int32 {
	var n int32
	for _, rs := range rss {
		if rs != nil {
			n += replicas(rs.Spec.Replicas)
		}
	}
	return n
}

func sumStatus(rss []*appsv1.ReplicaSet) int32 {
	var n int32
	for _, rs := range rss {
		if rs != nil {
			n += rs.Status.Replicas
		}
	}
	return n
}

func sumReady(rss []*appsv1.ReplicaSet) int32 {
	var n int32
	for _, rs := range rss {
		if rs != nil {
			n += rs.Status.ReadyReplicas
		}
	}
	return n
}

func sumAvailable(rss []*appsv1.ReplicaSet) int32 {
	var n int32
	for _, rs := range rss {
		if rs != nil {
			n += rs.Status.AvailableReplicas
		}
	}
	return n
}

func intAnnotation(obj metav1.Object, key string) (int32, bool) {
	v, ok := obj.GetAnnotations()[key]
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0, false
	}
	return int32(n), true
}

// setReplicasAnnotations records the Deployment size (desired-replicas) and
// size plus surge (max-replicas) on a ReplicaSet, which proportional
// scaling reads later. It reports whether anything changed.
func setReplicasAnnotations(rs *appsv1.ReplicaSet, desired, maxReplicas int32) bool {
	if rs.Annotations == nil {
		rs.Annotations = map[string]string{}
	}
	changed := false
	for k, v := range map[string]string{
		DesiredReplicasAnnotation: strconv.Itoa(int(desired)),
		MaxReplicasAnnotation:     strconv.Itoa(int(maxReplicas)),
	} {
		if rs.Annotations[k] != v {
			rs.Annotations[k] = v
			changed = true
		}
	}
	return changed
}

// skipCopy are the Deployment annotations not copied to its ReplicaSets.
var skipCopy = map[string]bool{
	lastAppliedAnnotation:     true,
	RevisionAnnotation:        true,
	RevisionHistoryAnnotation: true,
	DesiredReplicasAnnotation: true,
	MaxReplicasAnnotation:     true,
	rollbackToAnnotation:      true,
}

// copyAnnotations copies the Deployment's own annotations (such as
// kubernetes.io/change-cause, shown by rollout history) to rs.
func copyAnnotations(d *appsv1.Deployment, rs *appsv1.ReplicaSet) bool {
	if rs.Annotations == nil {
		rs.Annotations = map[string]string{}
	}
	changed := false
	for k, v := range d.Annotations {
		if skipCopy[k] {
			continue
		}
		if cur, ok := rs.Annotations[k]; !ok || cur != v {
			rs.Annotations[k] = v
			changed = true
		}
	}
	return changed
}

// setNewRSAnnotations brings the new ReplicaSet's annotations up to date:
// the Deployment's annotations, the revision (raised to newRevision when
// lower, keeping the old numbers in revision-history, which is what a
// rollback to this ReplicaSet looks like), and, for a ReplicaSet about to
// be created, the replica annotations.
func setNewRSAnnotations(d *appsv1.Deployment, rs *appsv1.ReplicaSet, newRevision int64, exists bool) bool {
	changed := copyAnnotations(d, rs)
	old, had := rs.Annotations[RevisionAnnotation]
	oldRev, err := strconv.ParseInt(old, 10, 64)
	if err != nil {
		if old != "" {
			return changed // someone wrote garbage; leave it
		}
		oldRev = 0
	}
	if oldRev < newRevision {
		rs.Annotations[RevisionAnnotation] = strconv.FormatInt(newRevision, 10)
		changed = true
		if had {
			rs.Annotations[RevisionHistoryAnnotation] = appendHistory(rs.Annotations[RevisionHistoryAnnotation], old)
		}
	}
	if !exists && setReplicasAnnotations(rs, replicas(d.Spec.Replicas), replicas(d.Spec.Replicas)+MaxSurge(d)) {
		changed = true
	}
	return changed
}

// appendHistory appends rev to a comma-separated history, dropping the
// oldest entries to stay within maxRevisionHistoryChars.
func appendHistory(history, rev string) string {
	if history == "" {
		return rev
	}
	revs := append(strings.Split(history, ","), rev)
	for len(strings.Join(revs, ",")) > maxRevisionHistoryChars && len(revs) > 1 {
		revs = revs[1:]
	}
	return strings.Join(revs, ",")
}

// labelsWith returns a copy of l with key set to value.
func labelsWith(l map[string]string, key, value string) map[string]string {
	out := maps.Clone(l)
	if out == nil {
		out = map[string]string{}
	}
	out[key] = value
	return out
}

// selectorWith returns a copy of sel that also requires key=value.
func selectorWith(sel *metav1.LabelSelector, key, value string) *metav1.LabelSelector {
	out := sel.DeepCopy()
	if out == nil {
		out = &metav1.LabelSelector{}
	}
	out.MatchLabels = labelsWith(out.MatchLabels, key, value)
	return out
}

// roundToInt32 rounds half away from zero.
func roundToInt32(f float64) int32 { return int32(math.Round(f)) }
