package registry

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// defaultPodSpec sets upstream defaults on a pod spec (also used for pod templates).
func defaultPodSpec(spec *corev1.PodSpec) {
	if spec.RestartPolicy == "" {
		spec.RestartPolicy = corev1.RestartPolicyAlways
	}
	if spec.DNSPolicy == "" {
		spec.DNSPolicy = corev1.DNSClusterFirst
	}
	if spec.TerminationGracePeriodSeconds == nil {
		v := int64(corev1.DefaultTerminationGracePeriodSeconds)
		spec.TerminationGracePeriodSeconds = &v
	}
	if spec.SchedulerName == "" {
		spec.SchedulerName = corev1.DefaultSchedulerName
	}
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	if spec.ServiceAccountName == "" && spec.DeprecatedServiceAccount != "" {
		spec.ServiceAccountName = spec.DeprecatedServiceAccount
	}
	spec.DeprecatedServiceAccount = spec.ServiceAccountName
	for i := range spec.InitContainers {
		defaultContainer(&spec.InitContainers[i])
	}
	for i := range spec.Containers {
		defaultContainer(&spec.Containers[i])
	}
	for i := range spec.EphemeralContainers {
		// EphemeralContainerCommon has exactly Container's fields, and
		// upstream defaults them the same way.
		defaultContainer((*corev1.Container)(&spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
	for i := range spec.Volumes {
		defaultVolumeSource(&spec.Volumes[i].VolumeSource)
	}
}

// defaultPod sets the defaults upstream gives pods but not pod templates:
// service links, host ports on the host network and requests from limits.
// The default service account and tolerations come from admission
// (mutatePod).
func defaultPod(pod *corev1.Pod) {
	spec := &pod.Spec
	defaultPodSpec(spec)
	if spec.EnableServiceLinks == nil {
		v := corev1.DefaultEnableServiceLinks
		spec.EnableServiceLinks = &v
	}
	all := [][]corev1.Container{spec.InitContainers, spec.Containers}
	for _, cs := range all {
		for i := range cs {
			if spec.HostNetwork {
				defaultHostPorts(cs[i].Ports)
			}
			defaultRequestsFromLimits(&cs[i].Resources)
		}
	}
}

// defaultRequestsFromLimits copies limits to requests that are not set.
func defaultRequestsFromLimits(r *corev1.ResourceRequirements) {
	if len(r.Limits) == 0 {
		return
	}
	if r.Requests == nil {
		r.Requests = corev1.ResourceList{}
	}
	for k, v := range r.Limits {
		if _, ok := r.Requests[k]; !ok {
			r.Requests[k] = v.DeepCopy()
		}
	}
}

func defaultHostPorts(ports []corev1.ContainerPort) {
	for i := range ports {
		if ports[i].HostPort == 0 {
			ports[i].HostPort = ports[i].ContainerPort
		}
	}
}

func defaultPullPolicy(image string) corev1.PullPolicy {
	ref := image
	if i := strings.Index(ref, "@"); i >= 0 {
		return corev1.PullIfNotPresent
	}
	tag := ""
	if i := strings.LastIndex(ref, ":"); i >= 0 && !strings.Contains(ref[i:], "/") {
		tag = ref[i+1:]
	}
	if tag == "" || tag == "latest" {
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}

func defaultContainer(c *corev1.Container) {
	if c.TerminationMessagePath == "" {
		c.TerminationMessagePath = corev1.TerminationMessagePathDefault
	}
	if c.TerminationMessagePolicy == "" {
		c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	}
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = defaultPullPolicy(c.Image)
	}
	for i := range c.Ports {
		if c.Ports[i].Protocol == "" {
			c.Ports[i].Protocol = corev1.ProtocolTCP
		}
	}
	for i := range c.Env {
		if vf := c.Env[i].ValueFrom; vf != nil && vf.FieldRef != nil && vf.FieldRef.APIVersion == "" {
			vf.FieldRef.APIVersion = "v1"
		}
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		defaultProbe(p)
	}
}

func defaultProbe(p *corev1.Probe) {
	if p == nil {
		return
	}
	if p.TimeoutSeconds == 0 {
		p.TimeoutSeconds = 1
	}
	if p.PeriodSeconds == 0 {
		p.PeriodSeconds = 10
	}
	if p.SuccessThreshold == 0 {
		p.SuccessThreshold = 1
	}
	if p.FailureThreshold == 0 {
		p.FailureThreshold = 3
	}
	if h := p.HTTPGet; h != nil {
		if h.Path == "" {
			h.Path = "/"
		}
		if h.Scheme == "" {
			h.Scheme = corev1.URISchemeHTTP
		}
	}
	if g := p.GRPC; g != nil && g.Service == nil {
		s := ""
		g.Service = &s
	}
}

func defaultVolumeSource(v *corev1.VolumeSource) {
	if v.HostPath == nil && v.EmptyDir == nil && v.GitRepo == nil && v.Secret == nil && v.NFS == nil &&
		v.ISCSI == nil && v.Glusterfs == nil && v.PersistentVolumeClaim == nil && v.RBD == nil &&
		v.FlexVolume == nil && v.Cinder == nil && v.CephFS == nil && v.Flocker == nil && v.DownwardAPI == nil &&
		v.FC == nil && v.AzureFile == nil && v.ConfigMap == nil && v.VsphereVolume == nil && v.Quobyte == nil &&
		v.AzureDisk == nil && v.PhotonPersistentDisk == nil && v.Projected == nil && v.PortworxVolume == nil &&
		v.ScaleIO == nil && v.StorageOS == nil && v.CSI == nil && v.Ephemeral == nil && v.Image == nil &&
		v.GCEPersistentDisk == nil && v.AWSElasticBlockStore == nil {
		v.EmptyDir = &corev1.EmptyDirVolumeSource{}
	}
	mode := int32(corev1.ConfigMapVolumeSourceDefaultMode)
	if v.HostPath != nil && v.HostPath.Type == nil {
		t := corev1.HostPathUnset
		v.HostPath.Type = &t
	}
	if v.ConfigMap != nil && v.ConfigMap.DefaultMode == nil {
		m := mode
		v.ConfigMap.DefaultMode = &m
	}
	if v.Secret != nil && v.Secret.DefaultMode == nil {
		m := int32(corev1.SecretVolumeSourceDefaultMode)
		v.Secret.DefaultMode = &m
	}
	if v.DownwardAPI != nil {
		if v.DownwardAPI.DefaultMode == nil {
			m := int32(corev1.DownwardAPIVolumeSourceDefaultMode)
			v.DownwardAPI.DefaultMode = &m
		}
		for i := range v.DownwardAPI.Items {
			if f := v.DownwardAPI.Items[i].FieldRef; f != nil && f.APIVersion == "" {
				f.APIVersion = "v1"
			}
		}
	}
	if v.Projected != nil {
		if v.Projected.DefaultMode == nil {
			m := int32(corev1.ProjectedVolumeSourceDefaultMode)
			v.Projected.DefaultMode = &m
		}
		for i := range v.Projected.Sources {
			s := &v.Projected.Sources[i]
			if s.ServiceAccountToken != nil && s.ServiceAccountToken.ExpirationSeconds == nil {
				e := int64(3600)
				s.ServiceAccountToken.ExpirationSeconds = &e
			}
			if s.DownwardAPI != nil {
				for j := range s.DownwardAPI.Items {
					if f := s.DownwardAPI.Items[j].FieldRef; f != nil && f.APIVersion == "" {
						f.APIVersion = "v1"
					}
				}
			}
		}
	}
	if v.ISCSI != nil && v.ISCSI.ISCSIInterface == "" {
		v.ISCSI.ISCSIInterface = "default"
	}
}

// validateObjectMetaLabels checks label keys and values as upstream does.
func validateObjectMetaLabels(labels map[string]string, path *field.Path) field.ErrorList {
	return metav1validation.ValidateLabels(labels, path)
}

// validatePodTemplateSpec checks template metadata (labels, annotations and
// the disconnect policy they carry) and spec.
func validatePodTemplateSpec(t *corev1.PodTemplateSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateObjectMetaLabels(t.Labels, path.Child("metadata", "labels"))...)
	errs = append(errs, validateAnnotations(t.Annotations, path.Child("metadata", "annotations"))...)
	errs = append(errs, validateDisconnectPolicy(t.Annotations, path.Child("metadata", "annotations"))...)
	errs = append(errs, validatePodSpec(&t.Spec, path.Child("spec"))...)
	if len(t.Spec.EphemeralContainers) > 0 {
		errs = append(errs, field.Forbidden(path.Child("spec", "ephemeralContainers"), "ephemeral containers not allowed in pod template"))
	}
	return errs
}

// validateAnnotations checks annotation keys and their total size.
func validateAnnotations(ann map[string]string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	total := 0
	for k, v := range ann {
		for _, msg := range validation.IsQualifiedName(strings.ToLower(k)) {
			errs = append(errs, field.Invalid(path, k, msg))
		}
		total += len(k) + len(v)
	}
	if total > 256*1024 {
		errs = append(errs, field.TooLong(path, "", 256*1024))
	}
	return errs
}

var (
	supportedRestartPolicies = sets.New[string](string(corev1.RestartPolicyAlways), string(corev1.RestartPolicyOnFailure), string(corev1.RestartPolicyNever))
	supportedDNSPolicies     = sets.New[string](string(corev1.DNSClusterFirstWithHostNet), string(corev1.DNSClusterFirst), string(corev1.DNSDefault), string(corev1.DNSNone))
	supportedPortProtocols   = sets.New[string](string(corev1.ProtocolTCP), string(corev1.ProtocolUDP), string(corev1.ProtocolSCTP))
	supportedPullPolicies    = sets.New[string](string(corev1.PullAlways), string(corev1.PullIfNotPresent), string(corev1.PullNever))
	supportedTermMsgPolicies = sets.New[string](string(corev1.TerminationMessageReadFile), string(corev1.TerminationMessageFallbackToLogsOnError))
	supportedTaintEffects    = sets.New[string](string(corev1.TaintEffectNoSchedule), string(corev1.TaintEffectPreferNoSchedule), string(corev1.TaintEffectNoExecute))
)

// validatePodSpec checks a pod spec; path is e.g. field.NewPath("spec") or field.NewPath("spec","template","spec").
func validatePodSpec(spec *corev1.PodSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	vols, verrs := validateVolumes(spec.Volumes, path.Child("volumes"))
	errs = append(errs, verrs...)

	names := sets.New[string]()
	errs = append(errs, validateContainers(spec.InitContainers, vols, names, path.Child("initContainers"), true)...)
	if len(spec.Containers) == 0 {
		errs = append(errs, field.Required(path.Child("containers"), ""))
	}
	errs = append(errs, validateContainers(spec.Containers, vols, names, path.Child("containers"), false)...)
	errs = append(errs, validateEphemeralContainers(spec.EphemeralContainers, vols, names, path.Child("ephemeralContainers"))...)

	if spec.RestartPolicy == "" {
		errs = append(errs, field.Required(path.Child("restartPolicy"), ""))
	} else if !supportedRestartPolicies.Has(string(spec.RestartPolicy)) {
		errs = append(errs, field.NotSupported(path.Child("restartPolicy"), spec.RestartPolicy, sets.List(supportedRestartPolicies)))
	}
	if spec.DNSPolicy == "" {
		errs = append(errs, field.Required(path.Child("dnsPolicy"), ""))
	} else if !supportedDNSPolicies.Has(string(spec.DNSPolicy)) {
		errs = append(errs, field.NotSupported(path.Child("dnsPolicy"), spec.DNSPolicy, sets.List(supportedDNSPolicies)))
	}
	errs = append(errs, validatePodDNSConfig(spec.DNSConfig, spec.DNSPolicy, path.Child("dnsConfig"))...)
	for k, v := range spec.NodeSelector {
		_ = v
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(path.Child("nodeSelector"), k, msg))
		}
	}
	if spec.ServiceAccountName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(spec.ServiceAccountName) {
			errs = append(errs, field.Invalid(path.Child("serviceAccountName"), spec.ServiceAccountName, msg))
		}
	}
	if spec.NodeName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(spec.NodeName) {
			errs = append(errs, field.Invalid(path.Child("nodeName"), spec.NodeName, msg))
		}
	}
	if spec.ActiveDeadlineSeconds != nil && *spec.ActiveDeadlineSeconds <= 0 {
		errs = append(errs, field.Invalid(path.Child("activeDeadlineSeconds"), *spec.ActiveDeadlineSeconds, "must be between 1 and 2147483647, inclusive"))
	}
	if spec.Hostname != "" {
		for _, msg := range validation.IsDNS1123Label(spec.Hostname) {
			errs = append(errs, field.Invalid(path.Child("hostname"), spec.Hostname, msg))
		}
	}
	if spec.Subdomain != "" {
		for _, msg := range validation.IsDNS1123Label(spec.Subdomain) {
			errs = append(errs, field.Invalid(path.Child("subdomain"), spec.Subdomain, msg))
		}
	}
	errs = append(errs, validateTolerations(spec.Tolerations, path.Child("tolerations"))...)
	for i, s := range spec.ImagePullSecrets {
		if s.Name == "" {
			errs = append(errs, field.Required(path.Child("imagePullSecrets").Index(i).Child("name"), ""))
		}
	}
	return errs
}

func validateTolerations(ts []corev1.Toleration, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, t := range ts {
		p := path.Index(i)
		if t.Key != "" {
			for _, msg := range validation.IsQualifiedName(t.Key) {
				errs = append(errs, field.Invalid(p.Child("key"), t.Key, msg))
			}
		}
		if t.Key == "" && t.Operator != corev1.TolerationOpExists {
			errs = append(errs, field.Invalid(p.Child("operator"), t.Operator, "operator must be Exists when `key` is empty, which means \"match all values and all keys\""))
		}
		if t.TolerationSeconds != nil && t.Effect != corev1.TaintEffectNoExecute {
			errs = append(errs, field.Invalid(p.Child("effect"), t.Effect, "effect must be 'NoExecute' when `tolerationSeconds` is set"))
		}
		switch t.Operator {
		case corev1.TolerationOpEqual, "":
			for _, msg := range validation.IsValidLabelValue(t.Value) {
				errs = append(errs, field.Invalid(p.Child("operator"), t.Value, msg))
			}
		case corev1.TolerationOpExists:
			if t.Value != "" {
				errs = append(errs, field.Invalid(p.Child("operator"), t, "value must be empty when `operator` is 'Exists'"))
			}
		default:
			errs = append(errs, field.NotSupported(p.Child("operator"), t.Operator, []string{string(corev1.TolerationOpEqual), string(corev1.TolerationOpExists)}))
		}
		if t.Effect != "" && !supportedTaintEffects.Has(string(t.Effect)) {
			errs = append(errs, field.NotSupported(p.Child("effect"), t.Effect, sets.List(supportedTaintEffects)))
		}
	}
	return errs
}

func volumeSourceCount(v *corev1.VolumeSource) int {
	n := 0
	for _, set := range []bool{v.HostPath != nil, v.EmptyDir != nil, v.GitRepo != nil, v.Secret != nil, v.NFS != nil,
		v.ISCSI != nil, v.Glusterfs != nil, v.PersistentVolumeClaim != nil, v.RBD != nil, v.FlexVolume != nil,
		v.Cinder != nil, v.CephFS != nil, v.Flocker != nil, v.DownwardAPI != nil, v.FC != nil, v.AzureFile != nil,
		v.ConfigMap != nil, v.VsphereVolume != nil, v.Quobyte != nil, v.AzureDisk != nil, v.PhotonPersistentDisk != nil,
		v.Projected != nil, v.PortworxVolume != nil, v.ScaleIO != nil, v.StorageOS != nil, v.CSI != nil,
		v.Ephemeral != nil, v.Image != nil, v.GCEPersistentDisk != nil, v.AWSElasticBlockStore != nil} {
		if set {
			n++
		}
	}
	return n
}

func validateVolumes(vs []corev1.Volume, path *field.Path) (sets.Set[string], field.ErrorList) {
	var errs field.ErrorList
	names := sets.New[string]()
	for i, v := range vs {
		p := path.Index(i)
		if v.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), ""))
		} else {
			for _, msg := range validation.IsDNS1123Label(v.Name) {
				errs = append(errs, field.Invalid(p.Child("name"), v.Name, msg))
			}
			if names.Has(v.Name) {
				errs = append(errs, field.Duplicate(p.Child("name"), v.Name))
			}
			names.Insert(v.Name)
		}
		switch n := volumeSourceCount(&v.VolumeSource); {
		case n == 0:
			errs = append(errs, field.Required(p, "must specify a volume type"))
		case n > 1:
			errs = append(errs, field.Forbidden(p, "may not specify more than 1 volume type"))
		}
		if v.ConfigMap != nil && v.ConfigMap.Name == "" {
			errs = append(errs, field.Required(p.Child("configMap", "name"), ""))
		}
		if v.Secret != nil && v.Secret.SecretName == "" {
			errs = append(errs, field.Required(p.Child("secret", "secretName"), ""))
		}
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == "" {
			errs = append(errs, field.Required(p.Child("persistentVolumeClaim", "claimName"), ""))
		}
		if v.HostPath != nil && v.HostPath.Path == "" {
			errs = append(errs, field.Required(p.Child("hostPath", "path"), ""))
		}
	}
	return names, errs
}

func validateContainers(cs []corev1.Container, vols, names sets.Set[string], path *field.Path, init bool) field.ErrorList {
	var errs field.ErrorList
	for i := range cs {
		c := &cs[i]
		p := path.Index(i)
		if c.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), ""))
		} else {
			for _, msg := range validation.IsDNS1123Label(c.Name) {
				errs = append(errs, field.Invalid(p.Child("name"), c.Name, msg))
			}
			if names.Has(c.Name) {
				errs = append(errs, field.Duplicate(p.Child("name"), c.Name))
			}
			names.Insert(c.Name)
		}
		if c.Image == "" {
			errs = append(errs, field.Required(p.Child("image"), ""))
		} else if strings.TrimSpace(c.Image) != c.Image {
			errs = append(errs, field.Invalid(p.Child("image"), c.Image, "must not have leading or trailing whitespace"))
		}
		if c.ImagePullPolicy == "" {
			errs = append(errs, field.Required(p.Child("imagePullPolicy"), ""))
		} else if !supportedPullPolicies.Has(string(c.ImagePullPolicy)) {
			errs = append(errs, field.NotSupported(p.Child("imagePullPolicy"), c.ImagePullPolicy, sets.List(supportedPullPolicies)))
		}
		if c.TerminationMessagePolicy == "" {
			errs = append(errs, field.Required(p.Child("terminationMessagePolicy"), "must be 'File' or 'FallbackToLogsOnError'"))
		} else if !supportedTermMsgPolicies.Has(string(c.TerminationMessagePolicy)) {
			errs = append(errs, field.Invalid(p.Child("terminationMessagePolicy"), c.TerminationMessagePolicy, "must be 'File' or 'FallbackToLogsOnError'"))
		}
		errs = append(errs, validateContainerPorts(c.Ports, p.Child("ports"))...)
		errs = append(errs, validateEnv(c.Env, p.Child("env"))...)
		errs = append(errs, validateVolumeMounts(c.VolumeMounts, vols, p.Child("volumeMounts"))...)
		errs = append(errs, validateResources(&c.Resources, p.Child("resources"))...)
		if init && c.RestartPolicy == nil {
			for name, pr := range map[string]*corev1.Probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe, "startupProbe": c.StartupProbe} {
				if pr != nil {
					errs = append(errs, field.Forbidden(p.Child(name), "may not be set for init containers without restartPolicy=Always"))
				}
			}
		} else {
			errs = append(errs, validateProbe(c.LivenessProbe, p.Child("livenessProbe"))...)
			errs = append(errs, validateProbe(c.ReadinessProbe, p.Child("readinessProbe"))...)
			errs = append(errs, validateProbe(c.StartupProbe, p.Child("startupProbe"))...)
			if c.LivenessProbe != nil && c.LivenessProbe.SuccessThreshold != 1 {
				errs = append(errs, field.Invalid(p.Child("livenessProbe", "successThreshold"), c.LivenessProbe.SuccessThreshold, "must be 1"))
			}
			if c.StartupProbe != nil && c.StartupProbe.SuccessThreshold != 1 {
				errs = append(errs, field.Invalid(p.Child("startupProbe", "successThreshold"), c.StartupProbe.SuccessThreshold, "must be 1"))
			}
		}
		if !init && c.RestartPolicy != nil {
			errs = append(errs, field.Forbidden(p.Child("restartPolicy"), "may not be set for non-init containers"))
		}
		if init && c.RestartPolicy != nil && *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			errs = append(errs, field.NotSupported(p.Child("restartPolicy"), *c.RestartPolicy, []string{string(corev1.ContainerRestartPolicyAlways)}))
		}
	}
	return errs
}

func validateContainerPorts(ports []corev1.ContainerPort, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	names := sets.New[string]()
	for i, pt := range ports {
		p := path.Index(i)
		if pt.Name != "" {
			for _, msg := range validation.IsValidPortName(pt.Name) {
				errs = append(errs, field.Invalid(p.Child("name"), pt.Name, msg))
			}
			if names.Has(pt.Name) {
				errs = append(errs, field.Duplicate(p.Child("name"), pt.Name))
			}
			names.Insert(pt.Name)
		}
		if pt.ContainerPort == 0 {
			errs = append(errs, field.Required(p.Child("containerPort"), ""))
		} else {
			for _, msg := range validation.IsValidPortNum(int(pt.ContainerPort)) {
				errs = append(errs, field.Invalid(p.Child("containerPort"), pt.ContainerPort, msg))
			}
		}
		if pt.HostPort != 0 {
			for _, msg := range validation.IsValidPortNum(int(pt.HostPort)) {
				errs = append(errs, field.Invalid(p.Child("hostPort"), pt.HostPort, msg))
			}
		}
		errs = append(errs, validateProtocol(pt.Protocol, p.Child("protocol"))...)
	}
	return errs
}

func validateProtocol(proto corev1.Protocol, path *field.Path) field.ErrorList {
	if proto == "" {
		return field.ErrorList{field.Required(path, "")}
	}
	if !supportedPortProtocols.Has(string(proto)) {
		return field.ErrorList{field.NotSupported(path, proto, sets.List(supportedPortProtocols))}
	}
	return nil
}

func validateEnv(env []corev1.EnvVar, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, e := range env {
		p := path.Index(i)
		if e.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), ""))
		} else {
			for _, msg := range validation.IsEnvVarName(e.Name) {
				errs = append(errs, field.Invalid(p.Child("name"), e.Name, msg))
			}
		}
		if vf := e.ValueFrom; vf != nil {
			n := 0
			if vf.FieldRef != nil {
				n++
			}
			if vf.ResourceFieldRef != nil {
				n++
			}
			if vf.ConfigMapKeyRef != nil {
				n++
			}
			if vf.SecretKeyRef != nil {
				n++
			}
			if vf.FileKeyRef != nil {
				n++
			}
			if e.Value != "" && n > 0 {
				errs = append(errs, field.Invalid(p.Child("valueFrom"), "", "may not be specified when `value` is not empty"))
			}
			if n == 0 {
				errs = append(errs, field.Invalid(p.Child("valueFrom"), "", "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"))
			} else if n > 1 {
				errs = append(errs, field.Invalid(p.Child("valueFrom"), "", "may not have more than one field specified at a time"))
			}
			if vf.ConfigMapKeyRef != nil && vf.ConfigMapKeyRef.Key == "" {
				errs = append(errs, field.Required(p.Child("valueFrom", "configMapKeyRef", "key"), ""))
			}
			if vf.SecretKeyRef != nil && vf.SecretKeyRef.Key == "" {
				errs = append(errs, field.Required(p.Child("valueFrom", "secretKeyRef", "key"), ""))
			}
			if vf.FieldRef != nil && vf.FieldRef.FieldPath == "" {
				errs = append(errs, field.Required(p.Child("valueFrom", "fieldRef", "fieldPath"), ""))
			}
		}
	}
	return errs
}

func validateVolumeMounts(ms []corev1.VolumeMount, vols sets.Set[string], path *field.Path) field.ErrorList {
	var errs field.ErrorList
	paths := sets.New[string]()
	for i, m := range ms {
		p := path.Index(i)
		if m.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), ""))
		} else if !vols.Has(m.Name) {
			errs = append(errs, field.NotFound(p.Child("name"), m.Name))
		}
		if m.MountPath == "" {
			errs = append(errs, field.Required(p.Child("mountPath"), ""))
		} else if paths.Has(m.MountPath) {
			errs = append(errs, field.Invalid(p.Child("mountPath"), m.MountPath, "must be unique"))
		}
		paths.Insert(m.MountPath)
		if strings.HasPrefix(m.SubPath, "/") {
			errs = append(errs, field.Invalid(p.Child("subPath"), m.SubPath, "must be a relative path"))
		}
	}
	return errs
}

func validateResources(r *corev1.ResourceRequirements, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for name, q := range r.Limits {
		errs = append(errs, validateResourceQuantity(name, q, path.Child("limits").Key(string(name)))...)
	}
	for name, q := range r.Requests {
		p := path.Child("requests").Key(string(name))
		errs = append(errs, validateResourceQuantity(name, q, p)...)
		if l, ok := r.Limits[name]; ok && q.Cmp(l) > 0 {
			errs = append(errs, field.Invalid(p, q.String(), fmt.Sprintf("must be less than or equal to %s limit of %s", name, l.String())))
		}
	}
	return errs
}

func validateResourceQuantity(name corev1.ResourceName, q resource.Quantity, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if !strings.Contains(string(name), "/") || strings.HasPrefix(string(name), "kubernetes.io/") {
		for _, msg := range validation.IsQualifiedName(string(name)) {
			errs = append(errs, field.Invalid(path, name, msg))
		}
	}
	if q.Sign() < 0 {
		errs = append(errs, field.Invalid(path, q.String(), "must be greater than or equal to 0"))
	}
	if strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix) || (strings.Contains(string(name), "/") && !strings.HasPrefix(string(name), "kubernetes.io/")) {
		if q.MilliValue()%1000 != 0 {
			errs = append(errs, field.Invalid(path, q.String(), "must be an integer"))
		}
	}
	return errs
}

func validateProbe(pr *corev1.Probe, path *field.Path) field.ErrorList {
	if pr == nil {
		return nil
	}
	var errs field.ErrorList
	n := 0
	if pr.Exec != nil {
		n++
	}
	if pr.HTTPGet != nil {
		n++
		for _, msg := range validatePortOrName(pr.HTTPGet.Port) {
			errs = append(errs, field.Invalid(path.Child("httpGet", "port"), pr.HTTPGet.Port.String(), msg))
		}
	}
	if pr.TCPSocket != nil {
		n++
		for _, msg := range validatePortOrName(pr.TCPSocket.Port) {
			errs = append(errs, field.Invalid(path.Child("tcpSocket", "port"), pr.TCPSocket.Port.String(), msg))
		}
	}
	if pr.GRPC != nil {
		n++
		for _, msg := range validation.IsValidPortNum(int(pr.GRPC.Port)) {
			errs = append(errs, field.Invalid(path.Child("grpc", "port"), pr.GRPC.Port, msg))
		}
	}
	if n == 0 {
		errs = append(errs, field.Required(path, "must specify a handler type"))
	} else if n > 1 {
		errs = append(errs, field.Forbidden(path, "may not specify more than 1 handler type"))
	}
	for _, f := range []struct {
		name string
		v    int32
	}{{"initialDelaySeconds", pr.InitialDelaySeconds}, {"timeoutSeconds", pr.TimeoutSeconds}, {"periodSeconds", pr.PeriodSeconds}, {"successThreshold", pr.SuccessThreshold}, {"failureThreshold", pr.FailureThreshold}} {
		if f.v < 0 {
			errs = append(errs, field.Invalid(path.Child(f.name), f.v, "must be greater than or equal to 0"))
		}
	}
	return errs
}

func validatePortOrName(p intstrOrString) []string {
	if p.Type == 0 {
		return validation.IsValidPortNum(int(p.IntVal))
	}
	return validation.IsValidPortName(p.StrVal)
}

type intstrOrString = intstr.IntOrString
