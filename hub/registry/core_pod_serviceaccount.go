package registry

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
)

// What the ServiceAccount admission gives a pod that may talk to the API,
// with upstream's names and values.
const (
	// ServiceAccountMountPath is where containers find the token, the CA
	// bundle and their namespace (rest.InClusterConfig reads it).
	ServiceAccountMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	// serviceAccountVolumePrefix starts the name of the projected volume.
	serviceAccountVolumePrefix = "kube-api-access-"
	// serviceAccountTokenSeconds is the lifetime the volume asks for: an
	// hour and seven seconds, which upstream's token issuer recognises as
	// its own default and may extend.
	serviceAccountTokenSeconds = 3607
	// defaultServiceAccountAttempts is how often the default account is
	// looked up before a pod is refused: the serviceaccount controller
	// creates it a moment after its namespace.
	defaultServiceAccountAttempts = 10
)

var serviceAccountsResource = schema.GroupResource{Resource: "serviceaccounts"}

// admitServiceAccount is upstream's ServiceAccount admission on pod create:
// the pod's account must exist, and unless the pod or the account opts out
// of automounting, every container gets the kube-api-access projected
// volume (token, CA bundle, namespace) mounted read-only at
// ServiceAccountMountPath, unless it already mounts something there.
func admitServiceAccount(ctx context.Context, l Lister, pod *corev1.Pod) error {
	sa, err := lookupServiceAccount(ctx, l, pod.Namespace, pod.Spec.ServiceAccountName)
	if err != nil {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, pod.Name,
			fmt.Errorf("error looking up service account %s/%s: %w", pod.Namespace, pod.Spec.ServiceAccountName, err))
	}
	if automount(pod, sa) {
		mountServiceAccountToken(pod)
	}
	return nil
}

// lookupServiceAccount returns the named account of namespace ns, looking
// the default account up again for a while when it is not there yet.
func lookupServiceAccount(ctx context.Context, l Lister, ns, name string) (*corev1.ServiceAccount, error) {
	attempts := 1
	if name == "default" && l != nil {
		attempts = defaultServiceAccountAttempts
	}
	// One interval for all attempts, between 100 and 200ms, as upstream.
	interval := time.Duration(100+rand.IntN(100)) * time.Millisecond
	for i := range attempts {
		if i > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(interval):
			}
		}
		sa, err := findServiceAccount(ctx, l, ns, name)
		if err != nil || sa != nil {
			return sa, err
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "serviceaccount"}, name)
}

func findServiceAccount(ctx context.Context, l Lister, ns, name string) (*corev1.ServiceAccount, error) {
	if l == nil {
		return nil, nil
	}
	objs, err := l.List(ctx, serviceAccountsResource.Resource, ns)
	if err != nil {
		return nil, fmt.Errorf("list service accounts: %w", err)
	}
	for _, o := range objs {
		if sa, ok := o.(*corev1.ServiceAccount); ok && sa.Name == name {
			return sa, nil
		}
	}
	return nil, nil
}

// automount reports whether the pod gets the API token: the pod's own
// choice first, then its account's, else yes.
func automount(pod *corev1.Pod, sa *corev1.ServiceAccount) bool {
	if v := pod.Spec.AutomountServiceAccountToken; v != nil {
		return *v
	}
	if v := sa.AutomountServiceAccountToken; v != nil {
		return *v
	}
	return true
}

// mountServiceAccountToken mounts the API token volume in every init
// container and container that has nothing mounted at the path, adding the
// volume (a kube-api-access-<random> one, or the one the pod already has)
// when some container mounts it.
func mountServiceAccountToken(pod *corev1.Pod) {
	name := ""
	for _, v := range pod.Spec.Volumes {
		if strings.HasPrefix(v.Name, serviceAccountVolumePrefix) {
			name = v.Name
			break
		}
	}
	hasVolume := name != ""
	if !hasVolume {
		name = serviceAccountVolumePrefix + utilrand.String(5)
	}
	mount := corev1.VolumeMount{Name: name, ReadOnly: true, MountPath: ServiceAccountMountPath}
	needed := false
	for _, cs := range []([]corev1.Container){pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if !mountsAt(&cs[i], ServiceAccountMountPath) {
				cs[i].VolumeMounts = append(cs[i].VolumeMounts, mount)
				needed = true
			}
		}
	}
	if needed && !hasVolume {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: name,
			VolumeSource: corev1.VolumeSource{Projected: ServiceAccountTokenVolume()}})
	}
}

func mountsAt(c *corev1.Container, path string) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath == path {
			return true
		}
	}
	return false
}

// ServiceAccountTokenVolume returns the projected volume the ServiceAccount
// admission adds, its sources in upstream's order: a token for the API
// server's audience, the kube-root-ca.crt ConfigMap's ca.crt and the pod's
// namespace.
func ServiceAccountTokenVolume() *corev1.ProjectedVolumeSource {
	return &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To(int32(corev1.ProjectedVolumeSourceDefaultMode)),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
				Path: "token", ExpirationSeconds: ptr.To(int64(serviceAccountTokenSeconds))}},
			{ConfigMap: &corev1.ConfigMapProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{
				Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
	}
}
