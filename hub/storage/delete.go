package storage

//lint:file-ignore SA1019 DeleteOptions.OrphanDependents is still honoured, as upstream does

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// namespaceContentMessage is upstream's answer to a repeated delete of a
// namespace that is still being emptied.
const namespaceContentMessage = "The system is ensuring all content is removed from this namespace.  Upon completion, this namespace will automatically be purged by the system."

// Delete implements API.
func (s *Storage) Delete(ctx context.Context, k *registry.Kind, namespace, name string, opts *metav1.DeleteOptions, dryRun bool) (runtime.Object, bool, error) {
	k, err := s.served(k)
	if err != nil {
		return nil, false, err
	}
	if opts == nil {
		opts = &metav1.DeleteOptions{}
	}
	if k.GVK.Group == "" && k.Resource == "namespaces" && protectedNamespace(name) {
		return nil, false, apierrors.NewForbidden(k.GroupResource(), name, errors.New("this namespace may not be deleted"))
	}
	key := s.key(k, namespace, name)
	for attempt := 0; ; attempt++ {
		o, err := s.st.Get(ctx, key)
		if err != nil {
			return nil, false, storeError(err, k.GroupResource(), name)
		}
		cur, err := s.decode(k, o)
		if err != nil {
			return nil, false, err
		}
		m, _ := meta.Accessor(cur)
		if p := opts.Preconditions; p != nil {
			if p.UID != nil && *p.UID != m.GetUID() {
				return nil, false, apierrors.NewConflict(k.GroupResource(), name,
					fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", *p.UID, m.GetUID()))
			}
			if p.ResourceVersion != nil && *p.ResourceVersion != m.GetResourceVersion() {
				return nil, false, apierrors.NewConflict(k.GroupResource(), name,
					fmt.Errorf("Precondition failed: ResourceVersion in precondition: %v, ResourceVersion in object meta: %v", *p.ResourceVersion, m.GetResourceVersion()))
			}
		}
		if err := s.validateExternalDelete(ctx, k, cur, opts, dryRun); err != nil {
			return nil, false, err
		}
		obj := cur.DeepCopyObject()
		om, _ := meta.Accessor(obj)
		changed := false

		// Propagation policy → finalizers.
		policy, err := propagation(k, opts)
		if err != nil {
			return nil, false, err
		}
		fins := om.GetFinalizers()
		want := slices.Clone(fins)
		switch policy {
		case metav1.DeletePropagationOrphan:
			want = addFin(removeFin(want, metav1.FinalizerDeleteDependents), metav1.FinalizerOrphanDependents)
		case metav1.DeletePropagationForeground:
			want = addFin(removeFin(want, metav1.FinalizerOrphanDependents), metav1.FinalizerDeleteDependents)
		case metav1.DeletePropagationBackground:
			want = removeFin(removeFin(want, metav1.FinalizerOrphanDependents), metav1.FinalizerDeleteDependents)
		}
		if !slices.Equal(fins, want) {
			om.SetFinalizers(want)
			changed = true
		}

		now := time.Now().Truncate(time.Second)
		pending := false // stays: graceful period or finalizers
		if ns, ok := obj.(*corev1.Namespace); ok {
			if ns.DeletionTimestamp != nil && len(ns.Spec.Finalizers) > 0 && !changed {
				return nil, false, apierrors.NewConflict(k.GroupResource(), name, errors.New(namespaceContentMessage))
			}
			if ns.DeletionTimestamp == nil {
				t := metav1.NewTime(now)
				ns.DeletionTimestamp = &t
				ns.Status.Phase = corev1.NamespaceTerminating
				changed = true
			}
			if len(ns.Spec.Finalizers) > 0 {
				pending = true
			}
		} else if k.GracefulDelete != nil {
			grace, graceful := k.GracefulDelete(obj, opts.GracePeriodSeconds)
			if graceful && grace > 0 {
				if old := om.GetDeletionGracePeriodSeconds(); om.GetDeletionTimestamp() != nil && old != nil && *old <= grace {
					// Grace may only be shortened.
					pending = true
				} else {
					t := metav1.NewTime(now.Add(time.Duration(grace) * time.Second))
					g := grace
					om.SetDeletionTimestamp(&t)
					om.SetDeletionGracePeriodSeconds(&g)
					if om.GetGeneration() > 0 {
						om.SetGeneration(om.GetGeneration() + 1)
					}
					changed, pending = true, true
				}
			} else if om.GetDeletionTimestamp() != nil {
				zero := int64(0)
				if g := om.GetDeletionGracePeriodSeconds(); g == nil || *g != 0 {
					om.SetDeletionGracePeriodSeconds(&zero)
					changed = true
				}
			}
		}
		if len(om.GetFinalizers()) > 0 {
			pending = true
			if om.GetDeletionTimestamp() == nil {
				t := metav1.NewTime(now)
				zero := int64(0)
				om.SetDeletionTimestamp(&t)
				om.SetDeletionGracePeriodSeconds(&zero)
				changed = true
			}
		}

		if pending {
			if !changed {
				return cur, false, nil
			}
			enc, err := s.encode(k, obj)
			if err != nil {
				return nil, false, err
			}
			if dryRun {
				return obj, false, nil
			}
			rev, err := s.st.Update(ctx, enc, o.Revision)
			if errors.Is(err, store.ErrConflict) && attempt < maxRetries {
				continue
			}
			if err != nil {
				return nil, false, storeError(err, k.GroupResource(), name)
			}
			enc.Revision = rev
			out, err := s.decode(k, enc)
			return out, false, err
		}
		if dryRun {
			return cur, true, nil
		}
		gone, err := s.st.Delete(ctx, key, o.Revision)
		if errors.Is(err, store.ErrConflict) && attempt < maxRetries {
			continue
		}
		if err != nil {
			return nil, false, storeError(err, k.GroupResource(), name)
		}
		s.release(k, cur)
		out, err := s.decode(k, gone)
		return out, true, err
	}
}

// propagation resolves the propagation policy of a delete.
func propagation(k *registry.Kind, opts *metav1.DeleteOptions) (metav1.DeletionPropagation, error) {
	if opts.PropagationPolicy != nil {
		if opts.OrphanDependents != nil {
			return "", apierrors.NewBadRequest("orphanDependents and propagationPolicy cannot both be set")
		}
		switch p := *opts.PropagationPolicy; p {
		case metav1.DeletePropagationOrphan, metav1.DeletePropagationBackground, metav1.DeletePropagationForeground:
			return p, nil
		default:
			return "", apierrors.NewBadRequest(fmt.Sprintf("propagationPolicy: Unsupported value: %q", p))
		}
	}
	if opts.OrphanDependents != nil {
		if *opts.OrphanDependents {
			return metav1.DeletePropagationOrphan, nil
		}
		return metav1.DeletePropagationBackground, nil
	}
	if k.DefaultGC != "" {
		return k.DefaultGC, nil
	}
	// Nothing requested: leave existing finalizers alone.
	return "", nil
}

func addFin(f []string, name string) []string {
	if slices.Contains(f, name) {
		return f
	}
	return append(f, name)
}

func removeFin(f []string, name string) []string {
	return slices.DeleteFunc(f, func(s string) bool { return s == name })
}

// DeleteCollection implements API.
func (s *Storage) DeleteCollection(ctx context.Context, k *registry.Kind, namespace string, opts ListOptions, del *metav1.DeleteOptions, dryRun bool) (runtime.Object, error) {
	k, err := s.served(k)
	if err != nil {
		return nil, err
	}
	opts.Limit, opts.Continue = 0, ""
	list, err := s.List(ctx, k, namespace, opts)
	if err != nil {
		return nil, err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	var out []runtime.Object
	for _, it := range items {
		m, _ := meta.Accessor(it)
		d := del
		if d == nil {
			d = &metav1.DeleteOptions{}
		}
		obj, _, err := s.Delete(ctx, k, m.GetNamespace(), m.GetName(), d, dryRun)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, obj)
	}
	return s.makeList(k, out, s.st.Revision(), "", 0)
}

// Bind implements API.
func (s *Storage) Bind(ctx context.Context, namespace string, b *corev1.Binding, opts Options) error {
	pk := s.view().byGVK[corev1.SchemeGroupVersion.WithKind("Pod")]
	if pk == nil {
		return apierrors.NewNotFound(corev1.Resource("pods"), b.Name)
	}
	if b.Target.Kind != "" && b.Target.Kind != "Node" {
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Binding").GroupKind(), b.Name, field.ErrorList{
			field.NotSupported(field.NewPath("target", "kind"), b.Target.Kind, []string{"Node"}),
		})
	}
	if b.Target.Name == "" {
		return apierrors.NewBadRequest("binding target node name is required")
	}
	// What the binding sets encodes and decodes unchanged, unless a string
	// is not valid UTF-8 (encoding replaces those bytes): the bound pod
	// is then the new state's decoded form, and no watch decodes it again.
	mode := rawDecoded
	if !utf8.ValidString(b.Target.Name) {
		mode = raw
	}
	for k, v := range b.Annotations {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			mode = raw
		}
	}
	_, err := s.update(ctx, pk, namespace, b.Name, opts, mode, func(cur runtime.Object) (runtime.Object, error) {
		pod := cur.(*corev1.Pod)
		if pod.DeletionTimestamp != nil {
			return nil, apierrors.NewConflict(corev1.Resource("pods/binding"), b.Name, fmt.Errorf("pod %s is being deleted, cannot be assigned to a host", b.Name))
		}
		if pod.Spec.NodeName != "" {
			return nil, apierrors.NewConflict(corev1.Resource("pods/binding"), b.Name, fmt.Errorf("pod %s is already assigned to node %q", b.Name, pod.Spec.NodeName))
		}
		if b.UID != "" && b.UID != pod.UID {
			return nil, apierrors.NewConflict(corev1.Resource("pods/binding"), b.Name,
				fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", b.UID, pod.UID))
		}
		pod.Spec.NodeName = b.Target.Name
		setScheduled(pod)
		pod.ResourceVersion = b.ResourceVersion
		for k, v := range b.Annotations {
			if pod.Annotations == nil {
				pod.Annotations = map[string]string{}
			}
			pod.Annotations[k] = v
		}
		return pod, nil
	})
	return err
}

// setScheduled marks the pod's PodScheduled condition true, as a binding
// does upstream.
func setScheduled(pod *corev1.Pod) {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	for i, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			if c.Status != corev1.ConditionTrue {
				pod.Status.Conditions[i].Status = corev1.ConditionTrue
				pod.Status.Conditions[i].LastTransitionTime = now
				pod.Status.Conditions[i].Reason = ""
				pod.Status.Conditions[i].Message = ""
			}
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
		Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now,
	})
}
