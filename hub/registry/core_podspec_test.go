package registry

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func validPod() *corev1.Pod {
	p := &corev1.Pod{}
	p.Name, p.Namespace = "web", "default"
	p.Spec.Containers = []corev1.Container{{Name: "app", Image: "nginx:1.27",
		Ports: []corev1.ContainerPort{{ContainerPort: 80}}}}
	defaultPod(p)
	if err := mutatePod(context.Background(), classLister(nil), p, nil); err != nil {
		panic(err)
	}
	return p
}

func TestDefaultPodSpec(t *testing.T) {
	spec := corev1.PodSpec{
		Containers: []corev1.Container{{
			Name: "app", Image: "nginx",
			Ports:          []corev1.ContainerPort{{ContainerPort: 80}},
			Env:            []corev1.EnvVar{{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
			LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{}}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}},
			Resources:      corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}},
		}},
		Volumes: []corev1.Volume{
			{Name: "a"},
			{Name: "b", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}},
			{Name: "c", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s"}}},
			{Name: "d", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/x"}}},
		},
	}
	pod := &corev1.Pod{Spec: spec}
	defaultPod(pod)
	spec = pod.Spec
	c := spec.Containers[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"restartPolicy", spec.RestartPolicy, corev1.RestartPolicyAlways},
		{"dnsPolicy", spec.DNSPolicy, corev1.DNSClusterFirst},
		{"terminationGracePeriodSeconds", *spec.TerminationGracePeriodSeconds, int64(30)},
		{"schedulerName", spec.SchedulerName, "default-scheduler"},
		{"securityContext", spec.SecurityContext != nil, true},
		{"enableServiceLinks", *spec.EnableServiceLinks, true},
		{"terminationMessagePath", c.TerminationMessagePath, "/dev/termination-log"},
		{"terminationMessagePolicy", c.TerminationMessagePolicy, corev1.TerminationMessageReadFile},
		{"imagePullPolicy", c.ImagePullPolicy, corev1.PullAlways},
		{"port protocol", c.Ports[0].Protocol, corev1.ProtocolTCP},
		{"fieldRef apiVersion", c.Env[0].ValueFrom.FieldRef.APIVersion, "v1"},
		{"probe timeout", c.LivenessProbe.TimeoutSeconds, int32(1)},
		{"probe period", c.LivenessProbe.PeriodSeconds, int32(10)},
		{"probe success", c.LivenessProbe.SuccessThreshold, int32(1)},
		{"probe failure", c.LivenessProbe.FailureThreshold, int32(3)},
		{"httpGet path", c.LivenessProbe.HTTPGet.Path, "/"},
		{"httpGet scheme", c.LivenessProbe.HTTPGet.Scheme, corev1.URISchemeHTTP},
		{"requests from limits", c.Resources.Requests.Cpu().String(), "1"},
		{"emptyDir", spec.Volumes[0].EmptyDir != nil, true},
		{"configMap mode", *spec.Volumes[1].ConfigMap.DefaultMode, int32(0644)},
		{"secret mode", *spec.Volumes[2].Secret.DefaultMode, int32(0644)},
		{"hostPath type", *spec.Volumes[3].HostPath.Type, corev1.HostPathUnset},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestMirrorPodHasNoServiceAccount: a pod gets the default service
// account, a mirror pod none, as upstream's ServiceAccount admission does.
func TestMirrorPodHasNoServiceAccount(t *testing.T) {
	if p := validPod(); p.Spec.ServiceAccountName != "default" {
		t.Errorf("pod's service account %q, want default", p.Spec.ServiceAccountName)
	}
	p := &corev1.Pod{}
	p.Name, p.Namespace = "etcd-n1", "default"
	p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "hash"}
	p.Spec.Containers = []corev1.Container{{Name: "app", Image: "etcd"}}
	defaultPod(p)
	if err := mutatePod(context.Background(), classLister(nil), p, nil); err != nil {
		t.Fatal(err)
	}
	if p.Spec.ServiceAccountName != "" || p.Spec.DeprecatedServiceAccount != "" {
		t.Errorf("mirror pod's service account %q, want none", p.Spec.ServiceAccountName)
	}
}

func TestDefaultPodTemplateSpec(t *testing.T) {
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}}
	defaultPodSpec(&spec)
	// Pod-only defaults stay off templates, as upstream.
	if spec.EnableServiceLinks != nil || len(spec.Tolerations) != 0 || spec.Priority != nil || spec.ServiceAccountName != "" ||
		spec.Containers[0].Resources.Requests != nil {
		t.Errorf("template got pod-only defaults: %+v", spec)
	}
	if spec.RestartPolicy != corev1.RestartPolicyAlways || spec.SchedulerName != corev1.DefaultSchedulerName || spec.SecurityContext == nil {
		t.Errorf("template missing spec defaults: %+v", spec)
	}
}

func TestDefaultPullPolicy(t *testing.T) {
	tests := []struct {
		image string
		want  corev1.PullPolicy
	}{
		{"nginx", corev1.PullAlways},
		{"nginx:latest", corev1.PullAlways},
		{"nginx:1.27", corev1.PullIfNotPresent},
		{"registry:5000/nginx", corev1.PullAlways},
		{"registry:5000/nginx:1.0", corev1.PullIfNotPresent},
		{"nginx@sha256:abcd", corev1.PullIfNotPresent},
	}
	for _, tt := range tests {
		if got := defaultPullPolicy(tt.image); got != tt.want {
			t.Errorf("defaultPullPolicy(%q) = %s, want %s", tt.image, got, tt.want)
		}
	}
}

func TestTolerationNotDuplicated(t *testing.T) {
	secs := int64(10)
	spec := corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &secs}}}
	pod := &corev1.Pod{Spec: spec}
	admitTolerations(pod, nil)
	if len(pod.Spec.Tolerations) != 2 || *pod.Spec.Tolerations[0].TolerationSeconds != 10 {
		t.Errorf("tolerations = %+v", pod.Spec.Tolerations)
	}
	pod = &corev1.Pod{Spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}}
	admitTolerations(pod, nil)
	if len(pod.Spec.Tolerations) != 1 {
		t.Errorf("wildcard toleration: got %d tolerations, want 1", len(pod.Spec.Tolerations))
	}
}

// wantErr checks that errs holds an error of the given type at the given path.
func wantErr(t *testing.T, errs field.ErrorList, typ field.ErrorType, path string) {
	t.Helper()
	for _, e := range errs {
		if e.Type == typ && e.Field == path {
			return
		}
	}
	t.Errorf("want %s at %s, got %v", typ, path, errs)
}

func TestValidatePodSpec(t *testing.T) {
	if errs := validatePodSpec(&validPod().Spec, field.NewPath("spec")); len(errs) > 0 {
		t.Fatalf("valid pod: %v", errs)
	}
	neg := resource.MustParse("-1")
	tests := []struct {
		name   string
		mutate func(*corev1.PodSpec)
		typ    field.ErrorType
		path   string
	}{
		{"no containers", func(s *corev1.PodSpec) { s.Containers = nil }, field.ErrorTypeRequired, "spec.containers"},
		{"no image", func(s *corev1.PodSpec) { s.Containers[0].Image = "" }, field.ErrorTypeRequired, "spec.containers[0].image"},
		{"bad container name", func(s *corev1.PodSpec) { s.Containers[0].Name = "App_1" }, field.ErrorTypeInvalid, "spec.containers[0].name"},
		{"duplicate container", func(s *corev1.PodSpec) { s.Containers = append(s.Containers, s.Containers[0]) }, field.ErrorTypeDuplicate, "spec.containers[1].name"},
		{"port zero", func(s *corev1.PodSpec) { s.Containers[0].Ports[0].ContainerPort = 0 }, field.ErrorTypeRequired, "spec.containers[0].ports[0].containerPort"},
		{"port too big", func(s *corev1.PodSpec) { s.Containers[0].Ports[0].ContainerPort = 70000 }, field.ErrorTypeInvalid, "spec.containers[0].ports[0].containerPort"},
		{"bad protocol", func(s *corev1.PodSpec) { s.Containers[0].Ports[0].Protocol = "ICMP" }, field.ErrorTypeNotSupported, "spec.containers[0].ports[0].protocol"},
		{"bad restart policy", func(s *corev1.PodSpec) { s.RestartPolicy = "Sometimes" }, field.ErrorTypeNotSupported, "spec.restartPolicy"},
		{"bad dns policy", func(s *corev1.PodSpec) { s.DNSPolicy = "Google" }, field.ErrorTypeNotSupported, "spec.dnsPolicy"},
		{"bad env name", func(s *corev1.PodSpec) { s.Containers[0].Env = []corev1.EnvVar{{Name: "1=A"}} }, field.ErrorTypeInvalid, "spec.containers[0].env[0].name"},
		{"negative request", func(s *corev1.PodSpec) {
			s.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: neg}
		}, field.ErrorTypeInvalid, "spec.containers[0].resources.requests[cpu]"},
		{"request above limit", func(s *corev1.PodSpec) {
			s.Containers[0].Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}
		}, field.ErrorTypeInvalid, "spec.containers[0].resources.requests[memory]"},
		{"duplicate volume", func(s *corev1.PodSpec) {
			v := corev1.Volume{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
			s.Volumes = []corev1.Volume{v, v}
		}, field.ErrorTypeDuplicate, "spec.volumes[1].name"},
		{"two volume sources", func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}, HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
		}, field.ErrorTypeForbidden, "spec.volumes[0]"},
		{"mount of unknown volume", func(s *corev1.PodSpec) {
			s.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "nope", MountPath: "/data"}}
		}, field.ErrorTypeNotFound, "spec.containers[0].volumeMounts[0].name"},
		{"probe without handler", func(s *corev1.PodSpec) {
			s.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1}
		}, field.ErrorTypeRequired, "spec.containers[0].readinessProbe"},
		{"liveness success threshold", func(s *corev1.PodSpec) {
			s.Containers[0].LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{}}, SuccessThreshold: 2}
		}, field.ErrorTypeInvalid, "spec.containers[0].livenessProbe.successThreshold"},
		{"bad toleration effect", func(s *corev1.PodSpec) {
			s.Tolerations = append(s.Tolerations, corev1.Toleration{Key: "k", Operator: corev1.TolerationOpExists, Effect: "Never"})
		}, field.ErrorTypeNotSupported, "spec.tolerations[2].effect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := validPod()
			tt.mutate(&p.Spec)
			wantErr(t, validatePodSpec(&p.Spec, field.NewPath("spec")), tt.typ, tt.path)
		})
	}
}

func TestValidatePodTemplateSpec(t *testing.T) {
	tmpl := &corev1.PodTemplateSpec{Spec: validPod().Spec}
	tmpl.Labels = map[string]string{"app": "web"}
	path := field.NewPath("spec", "template")
	if errs := validatePodTemplateSpec(tmpl, path); len(errs) > 0 {
		t.Fatalf("valid template: %v", errs)
	}
	tmpl.Labels = map[string]string{"app": "bad value!"}
	tmpl.Spec.Containers[0].Image = ""
	errs := validatePodTemplateSpec(tmpl, path)
	wantErr(t, errs, field.ErrorTypeInvalid, "spec.template.metadata.labels")
	wantErr(t, errs, field.ErrorTypeRequired, "spec.template.spec.containers[0].image")
}
