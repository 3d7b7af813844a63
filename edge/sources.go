package edge

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge/staticpods"
)

// agentSources serves runtimes the ConfigMaps, Secrets, claims and volumes
// the reference manager watches for the node's pods, and tokens from the
// hub.
type agentSources struct{ a *Agent }

func (s agentSources) object(r objectRef) (any, error) {
	s.a.refs.mu.Lock()
	w := s.a.refs.watchers[r]
	s.a.refs.mu.Unlock()
	if w == nil || !w.synced() {
		return nil, fmt.Errorf("%s %s: %w", r.kind, r.storeKey(), ErrSourceNotReady)
	}
	obj, ok, err := w.store.GetByKey(r.storeKey())
	if err != nil {
		return nil, fmt.Errorf("read %s %s: %w", r.kind, r.storeKey(), err)
	}
	if !ok {
		return nil, fmt.Errorf("%s %s: %w", r.kind, r.storeKey(), ErrSourceNotFound)
	}
	return obj, nil
}

// ConfigMap implements Sources.
func (s agentSources) ConfigMap(namespace, name string) (*corev1.ConfigMap, error) {
	obj, err := s.object(objectRef{kind: refConfigMap, namespace: namespace, name: name})
	if err != nil {
		return nil, err
	}
	return obj.(*corev1.ConfigMap), nil
}

// Secret implements Sources.
func (s agentSources) Secret(namespace, name string) (*corev1.Secret, error) {
	obj, err := s.object(objectRef{kind: refSecret, namespace: namespace, name: name})
	if err != nil {
		return nil, err
	}
	return obj.(*corev1.Secret), nil
}

// PersistentVolumeClaim implements Sources.
func (s agentSources) PersistentVolumeClaim(namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	obj, err := s.object(objectRef{kind: refPVC, namespace: namespace, name: name})
	if err != nil {
		return nil, err
	}
	return obj.(*corev1.PersistentVolumeClaim), nil
}

// PersistentVolume implements Sources.
func (s agentSources) PersistentVolume(name string) (*corev1.PersistentVolume, error) {
	obj, err := s.object(objectRef{kind: refPV, name: name})
	if err != nil {
		return nil, err
	}
	return obj.(*corev1.PersistentVolume), nil
}

// ServiceAccountToken implements Sources with the hub's TokenRequest API.
func (s agentSources) ServiceAccountToken(ctx context.Context, pod *corev1.Pod, audience string, expirationSeconds int64) (string, time.Time, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if audience != "" {
		tr.Spec.Audiences = []string{audience}
	}
	if expirationSeconds > 0 {
		tr.Spec.ExpirationSeconds = &expirationSeconds
	}
	out, err := s.a.client.CreateToken(ctx, pod.Namespace, sa, tr, metav1.CreateOptions{})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("request token of service account %s/%s: %w", pod.Namespace, sa, err)
	}
	return out.Status.Token, out.Status.ExpirationTimestamp.Time, nil
}

// ServiceEnv implements Sources with the agent's Service informer. Like
// the kubelet, it refuses to answer for a pod of the API before the
// informer listed once (from the hub or from the local state), while
// static pods start with what it holds; a node that watches no Services
// gives no variables.
func (s agentSources) ServiceEnv(pod *corev1.Pod) (map[string]string, error) {
	w := s.a.services
	if w == nil {
		return map[string]string{}, nil
	}
	static := pod.Annotations[staticpods.AnnConfigSource] != "" && pod.Annotations[staticpods.AnnConfigSource] != "api"
	if !static && !w.servicesSynced() {
		return nil, errServicesNotSynced{}
	}
	objs := w.services.List()
	svcs := make([]*corev1.Service, 0, len(objs))
	for _, o := range objs {
		if svc, ok := o.(*corev1.Service); ok {
			svcs = append(svcs, svc)
		}
	}
	return ServiceEnv(pod, svcs), nil
}

// errServicesNotSynced is the kubelet's error for a container created
// before the node read the Services; it is an ErrSourceNotReady.
type errServicesNotSynced struct{}

func (errServicesNotSynced) Error() string {
	return "services have not yet been read at least once, cannot construct envvars"
}

func (errServicesNotSynced) Is(target error) bool { return target == ErrSourceNotReady }
