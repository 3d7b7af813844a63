package scheduler

import (
	corev1 "k8s.io/api/core/v1"
)

// slimPod returns a copy of pod that holds only what the scheduler reads
// of a pod, for the pod informer to keep instead of the whole object. The
// informer's store holds every pod of the cluster, and most of a running
// pod (its containers' commands, environment, mounts and probes, its
// service account volume, its status) is never read by placement: a
// typical pod held 7 KB of heap whole and holds 3.7 KB slim. pod is not
// changed; the copy shares with it the maps, slices and pointers it keeps
// whole, and copies into new slices the lists it keeps only part of, so
// that nothing it drops stays reachable.
//
// What is kept, and who reads it:
//
//   - type and identity (kind, namespace, name, uid, resourceVersion):
//     the binding, the status patches, the victim deletion and its UID
//     precondition, and the involvedObject of every Event;
//   - labels: label groups, affinity and spread selectors, matchLabelKeys,
//     PodDisruptionBudget selectors;
//   - creationTimestamp and status.startTime: the age that orders
//     preemption victims of equal priority;
//   - deletionTimestamp: terminating pods, which spread does not count
//     and which hold back preemption on a pod's nominated node;
//   - spec.nodeName, schedulerName, schedulingGates, status.phase and
//     status.nominatedNodeName: which pods are pending, assigned, finished,
//     gated or promised a node, and the NodeName filter;
//   - priority, priorityClassName and preemptionPolicy: priority and
//     preemption;
//   - nodeSelector, affinity, tolerations and topologySpreadConstraints:
//     the filters and scores of the same names;
//   - overhead, and of every init and app container its image, ports,
//     resources and restartPolicy: requests (sidecars included), host
//     ports and image locality; and its name, to tell containers apart;
//   - the volumes that claim storage (persistentVolumeClaim, ephemeral):
//     the volume filter and the claims prepared at binding;
//   - the PodScheduled conditions: the failure report compares against
//     the current one to avoid rewriting it;
//   - activeDeadlineSeconds, terminationGracePeriodSeconds and the names of
//     ephemeral containers: no decision reads them, but they are what an
//     update may change in the spec of a pending pod besides what is kept
//     above (ephemeral containers may only be added, never changed), so
//     the spec comparison that requeues a pod on a spec change
//     (schedulingChanged) sees the same changes as on the whole pod.
//
// Everything else is dropped: annotations, owner references, finalizers,
// generation, managedFields; other volumes; the containers' commands,
// arguments, environment, mounts, devices, probes, lifecycle hooks,
// security contexts, resize policies and termination message settings;
// the pod's service account, DNS, host namespaces, security context and
// the rest of its spec; and status but for the fields above (container
// statuses, allocated resources and resize status among them: the
// requests the scheduler counts come from the spec alone, in-place resize
// included).
//
// Dropping loses nothing the scheduler writes, because it never writes a
// pod it holds back to the API: it creates Bindings from the pod's
// identity, patches status (strategic merge of the fields it sets, with
// the pod's UID) and deletes victims with a UID precondition. A field the
// scheduler starts to read must be kept here: TestSlimPod lists every
// field as kept or dropped, and the scenarios run on slim pods too.
func slimPod(pod *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{TypeMeta: pod.TypeMeta}
	m, sm := &pod.ObjectMeta, &out.ObjectMeta
	sm.Name, sm.Namespace, sm.UID, sm.ResourceVersion = m.Name, m.Namespace, m.UID, m.ResourceVersion
	sm.CreationTimestamp, sm.DeletionTimestamp = m.CreationTimestamp, m.DeletionTimestamp
	sm.Labels = m.Labels

	s, ss := &pod.Spec, &out.Spec
	ss.NodeName, ss.SchedulerName, ss.SchedulingGates = s.NodeName, s.SchedulerName, s.SchedulingGates
	ss.Priority, ss.PriorityClassName, ss.PreemptionPolicy = s.Priority, s.PriorityClassName, s.PreemptionPolicy
	ss.NodeSelector, ss.Affinity, ss.Tolerations = s.NodeSelector, s.Affinity, s.Tolerations
	ss.TopologySpreadConstraints = s.TopologySpreadConstraints
	ss.Overhead = s.Overhead
	ss.InitContainers = slimContainers(s.InitContainers)
	ss.Containers = slimContainers(s.Containers)
	ss.Volumes = claimVolumes(s.Volumes)
	ss.ActiveDeadlineSeconds, ss.TerminationGracePeriodSeconds = s.ActiveDeadlineSeconds, s.TerminationGracePeriodSeconds
	if len(s.EphemeralContainers) > 0 {
		ss.EphemeralContainers = make([]corev1.EphemeralContainer, len(s.EphemeralContainers))
		for i := range s.EphemeralContainers {
			ss.EphemeralContainers[i].Name = s.EphemeralContainers[i].Name
		}
	}

	st, sst := &pod.Status, &out.Status
	sst.Phase, sst.NominatedNodeName, sst.StartTime = st.Phase, st.NominatedNodeName, st.StartTime
	for i := range st.Conditions {
		if st.Conditions[i].Type == corev1.PodScheduled {
			sst.Conditions = append(sst.Conditions, st.Conditions[i])
		}
	}
	return out
}

// slimContainers keeps of each container what requests, host ports,
// sidecar detection and image locality read.
func slimContainers(cs []corev1.Container) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i := range cs {
		c := &cs[i]
		out[i] = corev1.Container{Name: c.Name, Image: c.Image, Ports: c.Ports, Resources: c.Resources, RestartPolicy: c.RestartPolicy}
	}
	return out
}

// claimVolumes keeps the volumes that claim storage, in order.
func claimVolumes(vs []corev1.Volume) []corev1.Volume {
	var out []corev1.Volume
	for i := range vs {
		v := &vs[i]
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			out = append(out, corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: v.PersistentVolumeClaim, Ephemeral: v.Ephemeral}})
		}
	}
	return out
}

// slimPodTransform is the pod informer's transform: a pod is stored as
// its slim copy (see slimPod). Anything else passes unchanged.
func slimPodTransform(obj any) (any, error) {
	if pod, ok := obj.(*corev1.Pod); ok {
		return slimPod(pod), nil
	}
	return obj, nil
}
