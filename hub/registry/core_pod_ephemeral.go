package registry

import (
	"fmt"
	"reflect"
	"unicode"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ephemeralContainersUpdate is pods/ephemeralcontainers: a write keeps
// everything of the stored pod but spec.ephemeralContainers (and what
// the generic code owns: resourceVersion, managedFields) and may only add
// ephemeral containers, as upstream's ephemeral containers strategy does.
// Pod admission (service account, priority) does not run, as upstream
// runs it on the main resource only.
var ephemeralContainersUpdate = &SubresourceUpdate{
	PrepareForUpdate: func(obj, old runtime.Object) {
		keepOnlyEphemeralContainers(obj.(*corev1.Pod), old.(*corev1.Pod))
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		return validateEphemeralContainersUpdate(obj.(*corev1.Pod), old.(*corev1.Pod))
	},
}

// keepOnlyEphemeralContainers makes pod the stored old pod with pod's
// ephemeral containers: a write to the subresource changes nothing else.
// The identity and concurrency fields and managedFields stay pod's, as
// the generic code set them.
func keepOnlyEphemeralContainers(pod, old *corev1.Pod) {
	out := old.DeepCopy()
	out.Name, out.Namespace, out.UID = pod.Name, pod.Namespace, pod.UID
	out.ResourceVersion, out.Generation = pod.ResourceVersion, pod.Generation
	out.ManagedFields = pod.ManagedFields
	out.Spec.EphemeralContainers = pod.Spec.EphemeralContainers
	*pod = *out
}

// validateEphemeralContainersUpdate checks a write to
// pods/ephemeralcontainers: the pod as a whole must be valid, and the
// ephemeral containers already there may be neither removed nor changed.
func validateEphemeralContainersUpdate(pod, old *corev1.Pod) field.ErrorList {
	errs := validatePodSpec(&pod.Spec, field.NewPath("spec"))
	if _, ok := old.Annotations[corev1.MirrorPodAnnotationKey]; ok {
		return field.ErrorList{field.Forbidden(field.NewPath(""), "static pods do not support ephemeral containers")}
	}
	path := field.NewPath("spec", "ephemeralContainers")
	byName := make(map[string]*corev1.EphemeralContainer, len(pod.Spec.EphemeralContainers))
	for i := range pod.Spec.EphemeralContainers {
		byName[pod.Spec.EphemeralContainers[i].Name] = &pod.Spec.EphemeralContainers[i]
	}
	for _, o := range old.Spec.EphemeralContainers {
		n, ok := byName[o.Name]
		switch {
		case !ok:
			errs = append(errs, field.Forbidden(path, fmt.Sprintf("existing ephemeral containers %q may not be removed\n", o.Name)))
		case !apiequality.Semantic.DeepEqual(o, *n):
			errs = append(errs, field.Forbidden(path, fmt.Sprintf("existing ephemeral containers %q may not be changed\n%v", o.Name, cmp.Diff(o, *n))))
		}
	}
	return errs
}

// ephemeralAllowed are the container fields an ephemeral container may
// set; any other field set is forbidden. Ports, probes, lifecycle hooks
// and resources would make a debugging container part of the workload.
var ephemeralAllowed = sets.New("Name", "Image", "Command", "Args", "WorkingDir", "EnvFrom", "Env",
	"VolumeMounts", "VolumeDevices", "TerminationMessagePath", "TerminationMessagePolicy",
	"ImagePullPolicy", "SecurityContext", "Stdin", "StdinOnce", "TTY")

const ephemeralForbidden = "cannot be set for an Ephemeral Container"

// validateEphemeralContainers checks a pod spec's ephemeral containers:
// each is a valid container whose name is unique among all the pod's
// containers (names holds those of the init and app containers), that
// sets only the fields ephemeralAllowed lists and no subPath, and whose
// target, if any, is an init or app container.
func validateEphemeralContainers(ecs []corev1.EphemeralContainer, vols, names sets.Set[string], path *field.Path) field.ErrorList {
	if len(ecs) == 0 {
		return nil
	}
	others := names.Clone()
	cs := make([]corev1.Container, len(ecs))
	for i := range ecs {
		cs[i] = corev1.Container(ecs[i].EphemeralContainerCommon)
		// The field rules below speak of these; the container checks
		// must not report them twice.
		cs[i].Ports, cs[i].Resources, cs[i].RestartPolicy = nil, corev1.ResourceRequirements{}, nil
		cs[i].LivenessProbe, cs[i].ReadinessProbe, cs[i].StartupProbe = nil, nil, nil
	}
	errs := validateContainers(cs, vols, names.Clone(), path, false)
	for i := range ecs {
		ec := &ecs[i]
		p := path.Index(i)
		if ec.TargetContainerName != "" && !others.Has(ec.TargetContainerName) {
			errs = append(errs, field.NotFound(p.Child("targetContainerName"), ec.TargetContainerName))
		}
		errs = append(errs, forbidUnlisted(ec.EphemeralContainerCommon, ephemeralAllowed, p)...)
		for j, m := range ec.VolumeMounts {
			if m.SubPath != "" {
				errs = append(errs, field.Forbidden(p.Child("volumeMounts").Index(j).Child("subPath"), ephemeralForbidden))
			}
			if m.SubPathExpr != "" {
				errs = append(errs, field.Forbidden(p.Child("volumeMounts").Index(j).Child("subPathExpr"), ephemeralForbidden))
			}
		}
	}
	return errs
}

// forbidUnlisted reports every field of the struct v that is set and not
// in allowed, by its Go name with a lower-case first letter, as upstream
// names them.
func forbidUnlisted(v any, allowed sets.Set[string], path *field.Path) field.ErrorList {
	var errs field.ErrorList
	t, val := reflect.TypeOf(v), reflect.ValueOf(v)
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if allowed.Has(f.Name) || val.Field(i).IsZero() {
			continue
		}
		r := []rune(f.Name)
		r[0] = unicode.ToLower(r[0])
		errs = append(errs, field.Forbidden(path.Child(string(r)), ephemeralForbidden))
	}
	return errs
}

// validatePodCreate checks a new pod: its spec and disconnect policy;
// ephemeral containers are added to running pods only, through the
// subresource.
func validatePodCreate(pod *corev1.Pod) field.ErrorList {
	errs := validatePodSpec(&pod.Spec, field.NewPath("spec"))
	errs = append(errs, validateDisconnectPolicy(pod.Annotations, field.NewPath("metadata", "annotations"))...)
	if len(pod.Spec.EphemeralContainers) > 0 {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "ephemeralContainers"), "cannot be set on create"))
	}
	return errs
}
