package statefulset

import (
	"fmt"
	"maps"
	"regexp"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

var ordinalRe = regexp.MustCompile(`^(.*)-([0-9]+)$`)

// ordinalOf returns the ordinal in a pod's name if it belongs to set
// (name <set>-<n>), or -1.
func ordinalOf(set *appsv1.StatefulSet, pod *corev1.Pod) int {
	m := ordinalRe.FindStringSubmatch(pod.Name)
	if m == nil || m[1] != set.Name {
		return -1
	}
	n, err := strconv.Atoi(m[2])
	if err != nil {
		return -1
	}
	return n
}

func podName(set *appsv1.StatefulSet, ordinal int) string {
	return fmt.Sprintf("%s-%d", set.Name, ordinal)
}

// ClaimName names the claim of template for the pod with ordinal:
// <template>-<set>-<ordinal>.
func ClaimName(set *appsv1.StatefulSet, template string, ordinal int) string {
	return fmt.Sprintf("%s-%s-%d", template, set.Name, ordinal)
}

func startOrdinal(set *appsv1.StatefulSet) int {
	if set.Spec.Ordinals != nil {
		return int(set.Spec.Ordinals.Start)
	}
	return 0
}

func replicaCount(set *appsv1.StatefulSet) int {
	if set.Spec.Replicas == nil {
		return 1
	}
	return int(*set.Spec.Replicas)
}

// newPod builds the pod with ordinal from template (the template of the
// revision it must run) and labels it with that revision.
func newPod(set *appsv1.StatefulSet, template *corev1.PodTemplateSpec, revision string, ordinal int) *corev1.Pod {
	pod := kit.PodFromTemplate(template, set, controllerKind)
	pod.GenerateName = ""
	pod.Name = podName(set, ordinal)
	pod.Labels = maps.Clone(pod.Labels)
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[PodNameLabel] = pod.Name
	pod.Labels[PodIndexLabel] = strconv.Itoa(ordinal)
	pod.Labels[appsv1.ControllerRevisionHashLabelKey] = revision
	pod.Spec.Hostname = pod.Name
	pod.Spec.Subdomain = set.Spec.ServiceName
	setStorage(set, pod, ordinal)
	return pod
}

// setStorage points the pod's volumes named after claim templates at the
// ordinal's claims.
func setStorage(set *appsv1.StatefulSet, pod *corev1.Pod, ordinal int) {
	if len(set.Spec.VolumeClaimTemplates) == 0 {
		return
	}
	claims := map[string]string{}
	for _, t := range set.Spec.VolumeClaimTemplates {
		claims[t.Name] = ClaimName(set, t.Name, ordinal)
	}
	var vols []corev1.Volume
	for _, v := range pod.Spec.Volumes {
		if _, ok := claims[v.Name]; !ok {
			vols = append(vols, v)
		}
	}
	for _, t := range set.Spec.VolumeClaimTemplates {
		vols = append(vols, corev1.Volume{Name: t.Name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claims[t.Name]},
		}})
	}
	pod.Spec.Volumes = vols
}

// identityMatches reports whether a pod still carries its ordinal's
// identity (name labels, hostname, subdomain).
func identityMatches(set *appsv1.StatefulSet, pod *corev1.Pod, ordinal int) bool {
	return pod.Labels[PodNameLabel] == pod.Name && pod.Labels[PodIndexLabel] == strconv.Itoa(ordinal) &&
		pod.Spec.Hostname == pod.Name && pod.Spec.Subdomain == set.Spec.ServiceName
}

func revisionOf(pod *corev1.Pod) string { return pod.Labels[appsv1.ControllerRevisionHashLabelKey] }

// created reports whether the pod exists in the hub (has a phase): the
// placeholders a sync makes for missing ordinals do not.
func created(p *corev1.Pod) bool { return p.Status.Phase != "" }

func terminating(p *corev1.Pod) bool { return p.DeletionTimestamp != nil }

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
}

func runningAndReady(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && kit.IsPodReady(p)
}

func runningAndAvailable(p *corev1.Pod, minReady int32, now time.Time) bool {
	return p.Status.Phase == corev1.PodRunning && kit.IsPodAvailable(p, minReady, now)
}

// healthy pods count as available for maxUnavailable and ordering.
func healthy(p *corev1.Pod, minReady int32, now time.Time) bool {
	return created(p) && !terminating(p) && runningAndAvailable(p, minReady, now)
}

// claimOwners returns the owner references a claim should have under the
// set's retention policy: the set when whenDeleted is Delete, and the pod
// when whenScaled is Delete and the pod's ordinal is being scaled away.
func claimOwners(set *appsv1.StatefulSet, pod *corev1.Pod, condemned bool) []metav1.OwnerReference {
	p := set.Spec.PersistentVolumeClaimRetentionPolicy
	if p == nil {
		return nil
	}
	var refs []metav1.OwnerReference
	if p.WhenDeleted == appsv1.DeletePersistentVolumeClaimRetentionPolicyType {
		refs = append(refs, metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: set.Name, UID: set.UID})
	}
	if condemned && p.WhenScaled == appsv1.DeletePersistentVolumeClaimRetentionPolicyType && pod.UID != "" {
		refs = append(refs, metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID})
	}
	return refs
}
