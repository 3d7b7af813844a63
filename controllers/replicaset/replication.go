package replicaset

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
)

// NewForReplicationControllers registers on cfg.Informers a controller of
// core/v1 ReplicationControllers: the ReplicaSet controller working on
// ReplicaSet views of them. A ReplicationController's selector map is a
// label selector of matchLabels only, and its status has the same counts
// and conditions as a ReplicaSet's, so the conversion loses nothing the
// controller reads or writes.
func NewForReplicationControllers(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errNeedClient
	}
	return newController(cfg, replicationControllers(cfg.Client, cfg.Informers))
}

// replicationControllers is owners for core/v1 ReplicationControllers.
func replicationControllers(client kubernetes.Interface, inf informers.SharedInformerFactory) *owners {
	return &owners{
		gvk:       corev1.SchemeGroupVersion.WithKind("ReplicationController"),
		name:      "replicationcontroller",
		component: "replication-controller",
		informer:  inf.Core().V1().ReplicationControllers().Informer(),
		view: func(obj any) (*appsv1.ReplicaSet, bool) {
			rc, ok := obj.(*corev1.ReplicationController)
			if !ok {
				return nil, false
			}
			return rcToReplicaSet(rc), true
		},
		get: func(ctx context.Context, ns, name string) (*appsv1.ReplicaSet, error) {
			rc, err := client.CoreV1().ReplicationControllers(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			return rcToReplicaSet(rc), nil
		},
		updateStatus: func(ctx context.Context, rs *appsv1.ReplicaSet) error {
			_, err := client.CoreV1().ReplicationControllers(rs.Namespace).UpdateStatus(ctx, replicaSetToRC(rs), metav1.UpdateOptions{})
			return err
		},
		trimStatus: func(st *appsv1.ReplicaSetStatus) { st.TerminatingReplicas = nil },
	}
}

// rcToReplicaSet returns the ReplicaSet view of rc. The view keeps rc's
// apiVersion and kind, so that the events recorded about it name the
// ReplicationController. It shares memory with rc.
func rcToReplicaSet(rc *corev1.ReplicationController) *appsv1.ReplicaSet {
	rs := &appsv1.ReplicaSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ReplicationController"},
		ObjectMeta: rc.ObjectMeta,
		Spec: appsv1.ReplicaSetSpec{
			Replicas:        rc.Spec.Replicas,
			MinReadySeconds: rc.Spec.MinReadySeconds,
			Selector:        &metav1.LabelSelector{MatchLabels: rc.Spec.Selector},
		},
		Status: appsv1.ReplicaSetStatus{
			Replicas:             rc.Status.Replicas,
			FullyLabeledReplicas: rc.Status.FullyLabeledReplicas,
			ReadyReplicas:        rc.Status.ReadyReplicas,
			AvailableReplicas:    rc.Status.AvailableReplicas,
			ObservedGeneration:   rc.Status.ObservedGeneration,
		},
	}
	if rc.Spec.Template != nil {
		rs.Spec.Template = *rc.Spec.Template
	}
	for _, c := range rc.Status.Conditions {
		rs.Status.Conditions = append(rs.Status.Conditions, appsv1.ReplicaSetCondition{
			Type: appsv1.ReplicaSetConditionType(c.Type), Status: c.Status,
			LastTransitionTime: c.LastTransitionTime, Reason: c.Reason, Message: c.Message,
		})
	}
	return rs
}

// replicaSetToRC is the inverse of rcToReplicaSet.
func replicaSetToRC(rs *appsv1.ReplicaSet) *corev1.ReplicationController {
	rc := &corev1.ReplicationController{
		ObjectMeta: rs.ObjectMeta,
		Spec: corev1.ReplicationControllerSpec{
			Replicas:        rs.Spec.Replicas,
			MinReadySeconds: rs.Spec.MinReadySeconds,
			Template:        &rs.Spec.Template,
		},
		Status: corev1.ReplicationControllerStatus{
			Replicas:             rs.Status.Replicas,
			FullyLabeledReplicas: rs.Status.FullyLabeledReplicas,
			ReadyReplicas:        rs.Status.ReadyReplicas,
			AvailableReplicas:    rs.Status.AvailableReplicas,
			ObservedGeneration:   rs.Status.ObservedGeneration,
		},
	}
	if rs.Spec.Selector != nil {
		rc.Spec.Selector = rs.Spec.Selector.MatchLabels
	}
	for _, c := range rs.Status.Conditions {
		rc.Status.Conditions = append(rc.Status.Conditions, corev1.ReplicationControllerCondition{
			Type: corev1.ReplicationControllerConditionType(c.Type), Status: c.Status,
			LastTransitionTime: c.LastTransitionTime, Reason: c.Reason, Message: c.Message,
		})
	}
	return rc
}
