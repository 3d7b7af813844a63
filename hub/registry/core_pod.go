package registry

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

var podKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("Pod"),
	Resource:   "pods",
	Singular:   "pod",
	Namespaced: true,
	ShortNames: []string{"po"},
	Categories: []string{"all"},
	HasStatus:  true,
	HasSpec:    true,
	Default:    func(obj runtime.Object) { defaultPod(obj.(*corev1.Pod)) },
	Mutate:     mutatePod,
	PrepareForCreate: func(obj runtime.Object) {
		pod := obj.(*corev1.Pod)
		pod.Status = corev1.PodStatus{Phase: corev1.PodPending, QOSClass: podQOSClass(&pod.Spec)}
	},
	GenerationChanged: func(obj, old runtime.Object) bool {
		return !apiequality.Semantic.DeepEqual(obj.(*corev1.Pod).Spec, old.(*corev1.Pod).Spec)
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validatePodCreate(obj.(*corev1.Pod))
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		return validatePodUpdate(obj.(*corev1.Pod), old.(*corev1.Pod))
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		return validatePodStatusUpdate(obj.(*corev1.Pod), old.(*corev1.Pod))
	},
	// kubectl debug adds containers through pods/ephemeralcontainers.
	Subresources: map[string]*SubresourceUpdate{"ephemeralcontainers": ephemeralContainersUpdate},
	Fields: func(obj runtime.Object) fields.Set {
		pod := obj.(*corev1.Pod)
		ips := make([]string, 0, len(pod.Status.PodIPs))
		for _, ip := range pod.Status.PodIPs {
			ips = append(ips, ip.IP)
		}
		return fields.Set{
			"spec.nodeName":            pod.Spec.NodeName,
			"spec.restartPolicy":       string(pod.Spec.RestartPolicy),
			"spec.schedulerName":       pod.Spec.SchedulerName,
			"spec.serviceAccountName":  pod.Spec.ServiceAccountName,
			"spec.hostNetwork":         strconv.FormatBool(pod.Spec.HostNetwork),
			"status.phase":             string(pod.Status.Phase),
			"status.podIP":             firstOr(ips, ""),
			"status.podIPs":            strings.Join(ips, ","),
			"status.nominatedNodeName": pod.Status.NominatedNodeName,
		}
	},
	FieldLabels: []string{"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
		"spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs", "status.nominatedNodeName"},
	FieldAliases: map[string]string{"spec.host": "spec.nodeName"},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
		column("Status", "string", 0, "The aggregate status of the containers in this pod."),
		column("Restarts", "string", 0, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
		ageColumn,
		column("IP", "string", 1, "IP address allocated to the pod. Routable at least within the cluster."),
		column("Node", "string", 1, "Name of the node the pod is assigned to."),
		column("Nominated Node", "string", 1, "Name of the node the scheduler nominated for this pod while it preempts lower-priority pods."),
		column("Readiness Gates", "string", 1, "How many of the pod's readiness gates report true."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		return podCells(obj.(*corev1.Pod), now)
	},
	GracefulDelete: func(obj runtime.Object, requested *int64) (int64, bool) {
		pod := obj.(*corev1.Pod)
		var grace int64
		switch {
		case requested != nil:
			grace = *requested
		case pod.Spec.TerminationGracePeriodSeconds != nil:
			grace = *pod.Spec.TerminationGracePeriodSeconds
		default:
			grace = corev1.DefaultTerminationGracePeriodSeconds
		}
		if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			grace = 0
		}
		if grace < 0 {
			grace = 1
		}
		return grace, grace > 0
	},
}

func firstOr(s []string, def string) string {
	if len(s) == 0 {
		return def
	}
	return s[0]
}

// podQOSClass computes the quality-of-service class from the containers'
// requests and limits (cpu and memory only), as the kubelet does.
func podQOSClass(spec *corev1.PodSpec) corev1.PodQOSClass {
	requests := corev1.ResourceList{}
	limits := corev1.ResourceList{}
	zero := true
	guaranteed := true
	all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	for _, c := range all {
		for name, q := range c.Resources.Requests {
			if name != corev1.ResourceCPU && name != corev1.ResourceMemory || q.IsZero() {
				continue
			}
			zero = false
			v := requests[name]
			v.Add(q)
			requests[name] = v
		}
		seen := 0
		for name, q := range c.Resources.Limits {
			if name != corev1.ResourceCPU && name != corev1.ResourceMemory || q.IsZero() {
				continue
			}
			zero = false
			seen++
			v := limits[name]
			v.Add(q)
			limits[name] = v
		}
		if seen != 2 {
			guaranteed = false
		}
	}
	if zero {
		return corev1.PodQOSBestEffort
	}
	if guaranteed {
		for name, r := range requests {
			if l, ok := limits[name]; !ok || l.Cmp(r) != 0 {
				guaranteed = false
			}
		}
	}
	if guaranteed && len(limits) == 2 {
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

const podUpdateForbidden = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"

func validatePodUpdate(pod, old *corev1.Pod) field.ErrorList {
	specPath := field.NewPath("spec")
	errs := validatePodSpec(&pod.Spec, specPath)
	if disconnectPolicyChanged(pod.Annotations, old.Annotations) {
		errs = append(errs, validateDisconnectPolicy(pod.Annotations, field.NewPath("metadata", "annotations"))...)
	}

	if len(pod.Spec.Containers) != len(old.Spec.Containers) || len(pod.Spec.InitContainers) != len(old.Spec.InitContainers) {
		return append(errs, field.Forbidden(specPath, podUpdateForbidden))
	}
	if a := pod.Spec.ActiveDeadlineSeconds; old.Spec.ActiveDeadlineSeconds != nil {
		if a == nil {
			errs = append(errs, field.Invalid(specPath.Child("activeDeadlineSeconds"), a, "must not update from a positive integer to nil value"))
		} else if *a > *old.Spec.ActiveDeadlineSeconds {
			errs = append(errs, field.Invalid(specPath.Child("activeDeadlineSeconds"), *a, "must be less than or equal to previous value"))
		}
	}

	// Copy what may change onto a copy of the old spec; anything else that
	// differs is a forbidden change.
	munged := *pod.Spec.DeepCopy()
	for i := range munged.Containers {
		munged.Containers[i].Image = old.Spec.Containers[i].Image
	}
	for i := range munged.InitContainers {
		munged.InitContainers[i].Image = old.Spec.InitContainers[i].Image
	}
	munged.ActiveDeadlineSeconds = old.Spec.ActiveDeadlineSeconds
	// Tolerations may only be added to.
	if tolerationsAdditive(old.Spec.Tolerations, pod.Spec.Tolerations) {
		munged.Tolerations = old.Spec.Tolerations
	} else {
		errs = append(errs, field.Forbidden(specPath.Child("tolerations"), "existing toleration can not be modified except its tolerationSeconds"))
		munged.Tolerations = old.Spec.Tolerations
	}
	if g, og := pod.Spec.TerminationGracePeriodSeconds, old.Spec.TerminationGracePeriodSeconds; g != nil && og != nil && *og < 0 && *g == 1 {
		munged.TerminationGracePeriodSeconds = og
	}
	// Scheduling gates may only be removed.
	if len(pod.Spec.SchedulingGates) <= len(old.Spec.SchedulingGates) {
		munged.SchedulingGates = old.Spec.SchedulingGates
	}
	// The node name is set through the binding subresource, not updates.
	if !apiequality.Semantic.DeepEqual(munged, old.Spec) {
		errs = append(errs, field.Forbidden(specPath, podUpdateForbidden))
	}
	return errs
}

// tolerationsAdditive reports whether every old toleration is still present
// in the new list (its tolerationSeconds may shrink).
func tolerationsAdditive(old, cur []corev1.Toleration) bool {
	for _, o := range old {
		found := false
		for _, c := range cur {
			if o.Key == c.Key && o.Operator == c.Operator && o.Value == c.Value && o.Effect == c.Effect {
				if o.TolerationSeconds == nil && c.TolerationSeconds == nil ||
					o.TolerationSeconds != nil && c.TolerationSeconds != nil && *c.TolerationSeconds <= *o.TolerationSeconds ||
					apiequality.Semantic.DeepEqual(o, c) {
					found = true
					break
				}
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func validatePodStatusUpdate(pod, old *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	sp := field.NewPath("status")
	if old.Spec.NodeName != "" && pod.Status.NominatedNodeName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(pod.Status.NominatedNodeName) {
			errs = append(errs, field.Invalid(sp.Child("nominatedNodeName"), pod.Status.NominatedNodeName, msg))
		}
	}
	for i, ip := range pod.Status.PodIPs {
		errs = append(errs, validation.IsValidIP(sp.Child("podIPs").Index(i).Child("ip"), ip.IP)...)
	}
	if len(pod.Status.PodIPs) > 0 && pod.Status.PodIP != pod.Status.PodIPs[0].IP {
		errs = append(errs, field.Invalid(sp.Child("podIPs").Index(0).Child("ip"), pod.Status.PodIPs[0].IP, "must match podIP"))
	}
	if (old.Status.Phase == corev1.PodSucceeded || old.Status.Phase == corev1.PodFailed) && pod.Status.Phase != old.Status.Phase {
		errs = append(errs, field.Forbidden(sp.Child("phase"), fmt.Sprintf("cannot transition from terminal phase %q to %q", old.Status.Phase, pod.Status.Phase)))
	}
	return errs
}

// podCells renders a pod's row as kubectl shows it.
func podCells(pod *corev1.Pod, now time.Time) []any {
	restarts := 0
	sidecarRestarts := 0
	total := len(pod.Spec.Containers)
	ready := 0
	var lastRestart, lastSidecarRestart metav1.Time

	reason := string(pod.Status.Phase)
	if pod.Status.Reason != "" {
		reason = pod.Status.Reason
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonSchedulingGated {
			reason = corev1.PodReasonSchedulingGated
		}
	}

	sidecars := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecars[c.Name] = true
			total++
		}
	}

	later := func(cur *metav1.Time, t *corev1.ContainerStateTerminated) {
		if t != nil && cur.Before(&t.FinishedAt) {
			*cur = t.FinishedAt
		}
	}

	initializing := false
	for i, cs := range pod.Status.InitContainerStatuses {
		restarts += int(cs.RestartCount)
		later(&lastRestart, cs.LastTerminationState.Terminated)
		if sidecars[cs.Name] {
			sidecarRestarts += int(cs.RestartCount)
			later(&lastSidecarRestart, cs.LastTerminationState.Terminated)
		}
		t := cs.State.Terminated
		switch {
		case t != nil && t.ExitCode == 0:
			continue
		case sidecars[cs.Name] && cs.Started != nil && *cs.Started:
			if cs.Ready {
				ready++
			}
			continue
		case t != nil:
			switch {
			case t.Reason != "":
				reason = "Init:" + t.Reason
			case t.Signal != 0:
				reason = fmt.Sprintf("Init:Signal:%d", t.Signal)
			default:
				reason = fmt.Sprintf("Init:ExitCode:%d", t.ExitCode)
			}
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "" && cs.State.Waiting.Reason != "PodInitializing":
			reason = "Init:" + cs.State.Waiting.Reason
		default:
			reason = fmt.Sprintf("Init:%d/%d", i, len(pod.Spec.InitContainers))
		}
		initializing = true
		break
	}

	if !initializing || podConditionTrue(pod, corev1.PodInitialized) {
		restarts = sidecarRestarts
		lastRestart = lastSidecarRestart
		running := false
		for i := len(pod.Status.ContainerStatuses) - 1; i >= 0; i-- {
			cs := pod.Status.ContainerStatuses[i]
			restarts += int(cs.RestartCount)
			later(&lastRestart, cs.LastTerminationState.Terminated)
			t := cs.State.Terminated
			switch {
			case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
				reason = cs.State.Waiting.Reason
			case t != nil && t.Reason != "":
				reason = t.Reason
			case t != nil && t.Signal != 0:
				reason = fmt.Sprintf("Signal:%d", t.Signal)
			case t != nil:
				reason = fmt.Sprintf("ExitCode:%d", t.ExitCode)
			case cs.Ready && cs.State.Running != nil:
				running = true
				ready++
			}
		}
		if reason == "Completed" && running {
			if podConditionTrue(pod, corev1.PodReady) {
				reason = "Running"
			} else {
				reason = "NotReady"
			}
		}
	}

	if pod.DeletionTimestamp != nil && pod.Status.Reason == "NodeLost" {
		reason = "Unknown"
	} else if pod.DeletionTimestamp != nil && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		reason = "Terminating"
	}

	restartStr := strconv.Itoa(restarts)
	if restarts != 0 && !lastRestart.IsZero() {
		restartStr = fmt.Sprintf("%d (%s ago)", restarts, age(lastRestart, now))
	}

	ip := "<none>"
	if len(pod.Status.PodIPs) > 0 && pod.Status.PodIPs[0].IP != "" {
		ip = pod.Status.PodIPs[0].IP
	}
	gates := "<none>"
	if n := len(pod.Spec.ReadinessGates); n > 0 {
		trueCount := 0
		for _, g := range pod.Spec.ReadinessGates {
			if podConditionTrue(pod, g.ConditionType) {
				trueCount++
			}
		}
		gates = fmt.Sprintf("%d/%d", trueCount, n)
	}
	return []any{pod.Name, fmt.Sprintf("%d/%d", ready, total), reason, restartStr, age(pod.CreationTimestamp, now),
		ip, orNone(pod.Spec.NodeName), orNone(pod.Status.NominatedNodeName), gates}
}

func podConditionTrue(pod *corev1.Pod, t corev1.PodConditionType) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// Built-in priority classes, as upstream creates them.
var systemPriorityClasses = map[string]int32{
	"system-node-critical":    2000001000,
	"system-cluster-critical": 2000000000,
}

// mutatePod is the admission upstream's plugins apply to pods, each on
// the operations it handles there: DefaultTolerationSeconds adds its
// tolerations on create and update (the unreachable one is tether's
// disconnect policy, see admitTolerations), ServiceAccount names the default
// account, checks that the account exists and mounts its API token on
// create only (see admitServiceAccount), Priority resolves the
// priority on create and keeps the stored one on update, and RuntimeClass
// sets the overhead and scheduling of the pod's class on create (see
// admitRuntimeClass).
func mutatePod(ctx context.Context, l Lister, obj, old runtime.Object) error {
	pod := obj.(*corev1.Pod)
	if old != nil {
		admitTolerations(pod, old.(*corev1.Pod))
		keepPriority(&pod.Spec, &old.(*corev1.Pod).Spec)
		return nil
	}
	admitTolerations(pod, nil)
	// Mirror pods, the API's view of a node's static pods, name no
	// service account: upstream's ServiceAccount admission leaves them
	// alone, and their pods never run with a token.
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; !mirror {
		if pod.Spec.ServiceAccountName == "" {
			pod.Spec.ServiceAccountName = "default"
			pod.Spec.DeprecatedServiceAccount = "default"
		}
		if err := admitServiceAccount(ctx, l, pod); err != nil {
			return err
		}
	}
	if err := admitPriority(ctx, l, pod); err != nil {
		return err
	}
	return admitRuntimeClass(ctx, l, pod)
}

// keepPriority gives an update that names no priority or preemption
// policy the stored ones, which admission computed at create: validation
// then refuses only a real change.
func keepPriority(spec, old *corev1.PodSpec) {
	if spec.Priority == nil && old.Priority != nil {
		spec.Priority = ptr.To(*old.Priority)
	}
	if spec.PreemptionPolicy == nil && old.PreemptionPolicy != nil {
		spec.PreemptionPolicy = ptr.To(*old.PreemptionPolicy)
	}
}

// admitPriority resolves a new pod's priority from its priority class, as
// the upstream Priority admission plugin does: a named class must exist,
// an unnamed pod gets the global default class if there is one, else 0.
func admitPriority(ctx context.Context, l Lister, pod *corev1.Pod) error {
	spec := &pod.Spec
	name := spec.PriorityClassName
	var value int32
	var policy *corev1.PreemptionPolicy
	found := false
	if v, ok := systemPriorityClasses[name]; ok {
		value, found = v, true
	} else if l != nil {
		classes, err := l.List(ctx, "priorityclasses.scheduling.k8s.io", "")
		if err != nil {
			return fmt.Errorf("list priority classes: %w", err)
		}
		for _, o := range classes {
			pc, ok := o.(*schedulingv1.PriorityClass)
			if !ok {
				continue
			}
			if (name != "" && pc.Name == name) || (name == "" && pc.GlobalDefault) {
				value, policy, found = pc.Value, pc.PreemptionPolicy, true
				if name == "" {
					spec.PriorityClassName = pc.Name
				}
				break
			}
		}
	}
	if name != "" && !found {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, pod.Name, fmt.Errorf("no PriorityClass with name %s was found", name))
	}
	if spec.Priority != nil && *spec.Priority != value {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, pod.Name,
			fmt.Errorf("the integer value of priority (%d) must not be provided in pod spec; priority admission controller computed %d from the given PriorityClass name", *spec.Priority, value))
	}
	spec.Priority = &value
	if policy != nil {
		if spec.PreemptionPolicy != nil && *spec.PreemptionPolicy != *policy {
			return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, pod.Name,
				fmt.Errorf("the string value of PreemptionPolicy (%s) must not be provided in pod spec; priority admission controller computed %s from the given PriorityClass name", *spec.PreemptionPolicy, *policy))
		}
		spec.PreemptionPolicy = policy
	}
	if spec.PreemptionPolicy == nil {
		p := corev1.PreemptLowerPriority
		spec.PreemptionPolicy = &p
	}
	return nil
}

// PodQOSClass returns the quality-of-service class of a pod spec, for
// admission that changes requests or limits after the pod was prepared.
func PodQOSClass(spec *corev1.PodSpec) corev1.PodQOSClass { return podQOSClass(spec) }
