package registry

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// accountLister serves the given service accounts; after is how many
// lookups find nothing before they appear (as when the serviceaccount
// controller creates them a moment after the namespace).
type accountLister struct {
	accounts []*corev1.ServiceAccount
	after    int
	calls    int
}

func (l *accountLister) List(_ context.Context, resource, ns string) ([]runtime.Object, error) {
	switch resource {
	case "priorityclasses.scheduling.k8s.io":
		return nil, nil
	case "serviceaccounts":
		l.calls++
		if l.calls <= l.after {
			return nil, nil
		}
		var out []runtime.Object
		for _, sa := range l.accounts {
			if sa.Namespace == ns {
				out = append(out, sa)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected resource %q", resource)
}

func account(name string, automount *bool) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		AutomountServiceAccountToken: automount}
}

func newPod() *corev1.Pod {
	p := &corev1.Pod{}
	p.Name, p.Namespace = "web", "default"
	p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "busybox"}}
	p.Spec.Containers = []corev1.Container{{Name: "app", Image: "nginx"}, {Name: "side", Image: "busybox"}}
	defaultPod(p)
	return p
}

// TestAdmitServiceAccountMountsToken: a pod of an existing account gets
// upstream's kube-api-access projected volume, mounted read-only in every
// init container and container, and the pod validates.
func TestAdmitServiceAccountMountsToken(t *testing.T) {
	p := newPod()
	if err := mutatePod(context.Background(), &accountLister{accounts: []*corev1.ServiceAccount{account("default", nil)}}, p, nil); err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.Volumes) != 1 {
		t.Fatalf("volumes %+v", p.Spec.Volumes)
	}
	v := p.Spec.Volumes[0]
	if !strings.HasPrefix(v.Name, "kube-api-access-") || len(v.Name) != len("kube-api-access-")+5 {
		t.Errorf("volume name %q", v.Name)
	}
	want := &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To(int32(420)),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To(int64(3607))}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace",
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
	}
	if diff := cmp.Diff(want, v.Projected); diff != "" {
		t.Errorf("projected volume (-want +got):\n%s", diff)
	}
	mount := corev1.VolumeMount{Name: v.Name, ReadOnly: true, MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		if len(c.VolumeMounts) != 1 || !cmp.Equal(c.VolumeMounts[0], mount) {
			t.Errorf("container %s mounts %+v", c.Name, c.VolumeMounts)
		}
	}
	podKind.PrepareForCreate(p)
	if errs := podKind.Validate(p); len(errs) > 0 {
		t.Errorf("admitted pod does not validate: %v", errs)
	}
}

// TestAdmitServiceAccountAutomount: the pod's automountServiceAccountToken
// decides, then the account's; a container that mounts something at the
// path keeps it, and a kube-api-access volume the pod has is reused.
func TestAdmitServiceAccountAutomount(t *testing.T) {
	tests := []struct {
		name        string
		pod, sa     *bool
		wantVolumes int
	}{
		{"default", nil, nil, 1},
		{"pod opts out", ptr.To(false), nil, 0},
		{"account opts out", nil, ptr.To(false), 0},
		{"pod overrides account", ptr.To(true), ptr.To(false), 1},
		{"pod opts out over account", ptr.To(false), ptr.To(true), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPod()
			p.Spec.ServiceAccountName = "robot"
			p.Spec.AutomountServiceAccountToken = tt.pod
			if err := mutatePod(context.Background(), &accountLister{accounts: []*corev1.ServiceAccount{account("robot", tt.sa)}}, p, nil); err != nil {
				t.Fatal(err)
			}
			if len(p.Spec.Volumes) != tt.wantVolumes {
				t.Errorf("volumes %+v", p.Spec.Volumes)
			}
			for _, c := range p.Spec.Containers {
				if len(c.VolumeMounts) != tt.wantVolumes {
					t.Errorf("container %s mounts %+v", c.Name, c.VolumeMounts)
				}
			}
		})
	}

	p := newPod()
	own := corev1.VolumeMount{Name: "mine", MountPath: ServiceAccountMountPath}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{own}
	p.Spec.Volumes = []corev1.Volume{{Name: "mine", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	if err := mutatePod(context.Background(), &accountLister{accounts: []*corev1.ServiceAccount{account("default", nil)}}, p, nil); err != nil {
		t.Fatal(err)
	}
	if m := p.Spec.Containers[0].VolumeMounts; len(m) != 1 || !cmp.Equal(m[0], own) {
		t.Errorf("container with its own mount got %+v", m)
	}
	if m := p.Spec.Containers[1].VolumeMounts; len(m) != 1 || !strings.HasPrefix(m[0].Name, "kube-api-access-") {
		t.Errorf("other container got %+v", m)
	}

	p = newPod()
	p.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: ServiceAccountTokenVolume()}}}
	if err := mutatePod(context.Background(), &accountLister{accounts: []*corev1.ServiceAccount{account("default", nil)}}, p, nil); err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.Volumes) != 1 || p.Spec.Containers[0].VolumeMounts[0].Name != "kube-api-access-abcde" {
		t.Errorf("existing token volume not reused: %+v %+v", p.Spec.Volumes, p.Spec.Containers[0].VolumeMounts)
	}
}

// TestAdmitServiceAccountMissing: a pod whose account does not exist is
// refused with upstream's message; the default account is looked up again
// for a while, since the serviceaccount controller creates it a moment
// after its namespace. Mirror pods and updates are left alone.
func TestAdmitServiceAccountMissing(t *testing.T) {
	p := newPod()
	p.Spec.ServiceAccountName = "robot"
	l := &accountLister{accounts: []*corev1.ServiceAccount{account("default", nil)}}
	err := mutatePod(context.Background(), l, p, nil)
	const want = `pods "web" is forbidden: error looking up service account default/robot: serviceaccount "robot" not found`
	if !apierrors.IsForbidden(err) || err.Error() != want {
		t.Fatalf("err = %v, want 403 %q", err, want)
	}
	if l.calls != 1 {
		t.Errorf("named account looked up %d times, want once", l.calls)
	}

	late := &accountLister{accounts: []*corev1.ServiceAccount{account("default", nil)}, after: 2}
	if err := mutatePod(context.Background(), late, newPod(), nil); err != nil || late.calls != 3 {
		t.Errorf("default account appearing late: %v after %d lookups", err, late.calls)
	}

	mirror := newPod()
	mirror.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "hash"}
	if err := mutatePod(context.Background(), &accountLister{}, mirror, nil); err != nil || mirror.Spec.ServiceAccountName != "" || len(mirror.Spec.Volumes) != 0 {
		t.Errorf("mirror pod: %v, account %q, volumes %+v", err, mirror.Spec.ServiceAccountName, mirror.Spec.Volumes)
	}

	old := newPod()
	up := newPod()
	if err := mutatePod(context.Background(), &accountLister{}, up, old); err != nil || len(up.Spec.Volumes) != 0 {
		t.Errorf("update: %v, volumes %+v", err, up.Spec.Volumes)
	}
}
