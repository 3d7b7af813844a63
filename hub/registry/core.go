package registry

//lint:file-ignore SA1019 Kubernetes still serves core/v1 Endpoints and NodeSpec.ConfigSource, so the hub does too

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// coreKinds returns the served kinds of the core (legacy) group, v1, in
// discovery order.
func coreKinds() []*Kind {
	return []*Kind{
		configMapKind,
		endpointsKind,
		eventKind,
		limitRangeKind,
		namespaceKind,
		nodeKind,
		pvcKind,
		pvKind,
		podKind,
		podTemplateKind,
		replicationControllerKind,
		resourceQuotaKind,
		secretKind,
		serviceAccountKind,
		serviceKind,
	}
}

// maxConfigSize is the largest total size of a ConfigMap's or Secret's data.
const maxConfigSize = 1 << 20

// immutable reports a change to a field that may not change.
func immutable(newVal, oldVal any, path *field.Path) field.ErrorList {
	if apiequality.Semantic.DeepEqual(newVal, oldVal) {
		return nil
	}
	return field.ErrorList{field.Invalid(path, newVal, "field is immutable")}
}

// ---- Namespace ----

var namespaceKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("Namespace"),
	Resource:   "namespaces",
	Singular:   "namespace",
	ShortNames: []string{"ns"},
	HasStatus:  true,
	Verbs:      []string{"create", "delete", "get", "list", "patch", "update", "watch"},
	Default: func(obj runtime.Object) {
		ns := obj.(*corev1.Namespace)
		if ns.Name != "" {
			if ns.Labels == nil {
				ns.Labels = map[string]string{}
			}
			ns.Labels[corev1.LabelMetadataName] = ns.Name
		}
		if ns.Status.Phase == "" {
			ns.Status.Phase = corev1.NamespaceActive
		}
	},
	PrepareForCreate: func(obj runtime.Object) {
		ns := obj.(*corev1.Namespace)
		ns.Status = corev1.NamespaceStatus{Phase: corev1.NamespaceActive}
		if !containsFinalizer(ns.Spec.Finalizers, corev1.FinalizerKubernetes) {
			ns.Spec.Finalizers = append(ns.Spec.Finalizers, corev1.FinalizerKubernetes)
		}
		if ns.Name != "" {
			if ns.Labels == nil {
				ns.Labels = map[string]string{}
			}
			ns.Labels[corev1.LabelMetadataName] = ns.Name
		}
	},
	PrepareForUpdate: func(obj, old runtime.Object) {
		// Finalizers change only through the finalize subresource.
		obj.(*corev1.Namespace).Spec.Finalizers = old.(*corev1.Namespace).Spec.Finalizers
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateNamespaceFinalizers(obj.(*corev1.Namespace).Spec.Finalizers, field.NewPath("spec", "finalizers"))
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		ns := obj.(*corev1.Namespace)
		p := field.NewPath("status", "phase")
		if ns.DeletionTimestamp.IsZero() {
			if ns.Status.Phase != corev1.NamespaceActive {
				return field.ErrorList{field.Invalid(p, ns.Status.Phase, "A namespace may only be in active status if it does not have a deletion timestamp.")}
			}
		} else if ns.Status.Phase != corev1.NamespaceTerminating {
			return field.ErrorList{field.Invalid(p, ns.Status.Phase, "A namespace may only be in terminating status if it has a deletion timestamp.")}
		}
		return nil
	},
	NameRule: func(name string, prefix bool) []string {
		if prefix {
			name = maskTrailingDash(name)
		}
		return validation.IsDNS1123Label(name)
	},
	Fields: func(obj runtime.Object) fields.Set {
		ns := obj.(*corev1.Namespace)
		return fields.Set{"status.phase": string(ns.Status.Phase), "name": ns.Name}
	},
	FieldLabels: []string{"status.phase", "name"},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Status", "string", 0, "The status of the namespace"),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		ns := obj.(*corev1.Namespace)
		return []any{ns.Name, string(ns.Status.Phase), age(ns.CreationTimestamp, now)}
	},
}

func containsFinalizer(list []corev1.FinalizerName, f corev1.FinalizerName) bool {
	for _, x := range list {
		if x == f {
			return true
		}
	}
	return false
}

func validateNamespaceFinalizers(fs []corev1.FinalizerName, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range fs {
		name := string(f)
		for _, msg := range validation.IsQualifiedName(name) {
			errs = append(errs, field.Invalid(path, name, msg))
		}
		if !strings.Contains(name, "/") && f != corev1.FinalizerKubernetes {
			errs = append(errs, field.Invalid(path, name, "name is neither a standard finalizer name nor is it fully qualified"))
		}
	}
	return errs
}

// ---- Node ----

var nodeKind = &Kind{
	GVK:            corev1.SchemeGroupVersion.WithKind("Node"),
	Resource:       "nodes",
	Singular:       "node",
	ShortNames:     []string{"no"},
	HasStatus:      true,
	StatusOnCreate: true,
	Default: func(obj runtime.Object) {
		n := obj.(*corev1.Node)
		// The v1 API carries both podCIDR and podCIDRs; upstream's
		// conversion fills one from the other.
		if n.Spec.PodCIDR != "" && len(n.Spec.PodCIDRs) == 0 {
			n.Spec.PodCIDRs = []string{n.Spec.PodCIDR}
		} else if n.Spec.PodCIDR == "" && len(n.Spec.PodCIDRs) > 0 {
			n.Spec.PodCIDR = n.Spec.PodCIDRs[0]
		}
		if n.Status.Allocatable == nil && n.Status.Capacity != nil {
			n.Status.Allocatable = n.Status.Capacity.DeepCopy()
		}
	},
	PrepareForCreate: func(obj runtime.Object) {
		obj.(*corev1.Node).Spec.ConfigSource = nil
	},
	Validate: func(obj runtime.Object) field.ErrorList { return validateNode(obj.(*corev1.Node)) },
	Admit:    admitNode,
	Release:  releaseNode,
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		n, o := obj.(*corev1.Node), old.(*corev1.Node)
		errs := validateNode(n)
		sp := field.NewPath("spec")
		if len(o.Spec.PodCIDRs) > 0 && !apiequality.Semantic.DeepEqual(n.Spec.PodCIDRs, o.Spec.PodCIDRs) {
			errs = append(errs, field.Forbidden(sp.Child("podCIDRs"), "node updates may not change podCIDR except from \"\" to valid"))
		}
		if o.Spec.ProviderID != "" && n.Spec.ProviderID != o.Spec.ProviderID {
			errs = append(errs, field.Forbidden(sp.Child("providerID"), "node updates may not change providerID except from \"\" to valid"))
		}
		return errs
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		return validateNodeStatus(obj.(*corev1.Node))
	},
	Fields: func(obj runtime.Object) fields.Set {
		return fields.Set{"spec.unschedulable": strconv.FormatBool(obj.(*corev1.Node).Spec.Unschedulable)}
	},
	FieldLabels: []string{"spec.unschedulable"},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Status", "string", 0, "The status of the node"),
		column("Roles", "string", 0, "The roles of the node"),
		ageColumn,
		column("Version", "string", 0, "Kubelet Version reported by the node."),
		column("Internal-IP", "string", 1, "List of addresses reachable to the node."),
		column("External-IP", "string", 1, "List of addresses reachable to the node."),
		column("OS-Image", "string", 1, "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy))."),
		column("Kernel-Version", "string", 1, "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64)."),
		column("Container-Runtime", "string", 1, "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2)."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any { return nodeCells(obj.(*corev1.Node), now) },
}

func validateNode(n *corev1.Node) field.ErrorList {
	var errs field.ErrorList
	sp := field.NewPath("spec")
	if n.Spec.PodCIDR != "" && (len(n.Spec.PodCIDRs) == 0 || n.Spec.PodCIDRs[0] != n.Spec.PodCIDR) {
		errs = append(errs, field.Invalid(sp.Child("podCIDRs"), n.Spec.PodCIDRs, "first value must match `spec.podCIDR`"))
	}
	if len(n.Spec.PodCIDRs) > 2 {
		errs = append(errs, field.Invalid(sp.Child("podCIDRs"), n.Spec.PodCIDRs, "may specify no more than one CIDR for each IP family"))
	}
	for i, c := range n.Spec.PodCIDRs {
		if _, _, err := net.ParseCIDR(c); err != nil {
			errs = append(errs, field.Invalid(sp.Child("podCIDRs").Index(i), c, "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"))
		}
	}
	seen := sets.New[string]()
	for i, t := range n.Spec.Taints {
		p := sp.Child("taints").Index(i)
		for _, msg := range validation.IsQualifiedName(t.Key) {
			errs = append(errs, field.Invalid(p.Child("key"), t.Key, msg))
		}
		if t.Value != "" {
			for _, msg := range validation.IsValidLabelValue(t.Value) {
				errs = append(errs, field.Invalid(p.Child("value"), t.Value, msg))
			}
		}
		if t.Effect == "" {
			errs = append(errs, field.Required(p.Child("effect"), ""))
		} else if !supportedTaintEffects.Has(string(t.Effect)) {
			errs = append(errs, field.NotSupported(p.Child("effect"), t.Effect, sets.List(supportedTaintEffects)))
		}
		k := t.Key + "\x00" + string(t.Effect)
		if seen.Has(k) {
			errs = append(errs, field.Duplicate(p, "taints must be unique by key and effect pair"))
		}
		seen.Insert(k)
	}
	return append(errs, validateNodeStatus(n)...)
}

func validateNodeStatus(n *corev1.Node) field.ErrorList {
	var errs field.ErrorList
	sp := field.NewPath("status")
	for name, q := range n.Status.Capacity {
		errs = append(errs, validateResourceQuantity(name, q, sp.Child("capacity").Key(string(name)))...)
	}
	for name, q := range n.Status.Allocatable {
		errs = append(errs, validateResourceQuantity(name, q, sp.Child("allocatable").Key(string(name)))...)
	}
	return errs
}

func nodeCells(n *corev1.Node, now time.Time) []any {
	var status []string
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		if c.Status == corev1.ConditionTrue {
			status = append(status, "Ready")
		} else {
			status = append(status, "NotReady")
		}
		break
	}
	if len(status) == 0 {
		status = append(status, "Unknown")
	}
	if n.Spec.Unschedulable {
		status = append(status, "SchedulingDisabled")
	}
	roles := sets.New[string]()
	for k, v := range n.Labels {
		switch {
		case strings.HasPrefix(k, "node-role.kubernetes.io/"):
			if r := strings.TrimPrefix(k, "node-role.kubernetes.io/"); r != "" {
				roles.Insert(r)
			}
		case k == "kubernetes.io/role" && v != "":
			roles.Insert(v)
		}
	}
	roleStr := strings.Join(sets.List(roles), ",")
	if roleStr == "" {
		roleStr = "<none>"
	}
	info := n.Status.NodeInfo
	return []any{n.Name, strings.Join(status, ","), roleStr, age(n.CreationTimestamp, now), info.KubeletVersion,
		nodeAddress(n, corev1.NodeInternalIP), nodeAddress(n, corev1.NodeExternalIP),
		orUnknown(info.OSImage), orUnknown(info.KernelVersion), orUnknown(info.ContainerRuntimeVersion)}
}

func nodeAddress(n *corev1.Node, t corev1.NodeAddressType) string {
	for _, a := range n.Status.Addresses {
		if a.Type == t {
			return a.Address
		}
	}
	return "<none>"
}

func orUnknown(s string) string {
	if s == "" {
		return "<unknown>"
	}
	return s
}

// ---- ConfigMap ----

var configMapKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("ConfigMap"),
	Resource:   "configmaps",
	Singular:   "configmap",
	Namespaced: true,
	ShortNames: []string{"cm"},
	Validate:   func(obj runtime.Object) field.ErrorList { return validateConfigMap(obj.(*corev1.ConfigMap)) },
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		cm, o := obj.(*corev1.ConfigMap), old.(*corev1.ConfigMap)
		errs := validateConfigMap(cm)
		if o.Immutable != nil && *o.Immutable {
			if cm.Immutable == nil || !*cm.Immutable {
				errs = append(errs, field.Forbidden(field.NewPath("immutable"), "field is immutable when `immutable` is set"))
			}
			if !apiequality.Semantic.DeepEqual(cm.Data, o.Data) {
				errs = append(errs, field.Forbidden(field.NewPath("data"), "field is immutable when `immutable` is set"))
			}
			if !apiequality.Semantic.DeepEqual(cm.BinaryData, o.BinaryData) {
				errs = append(errs, field.Forbidden(field.NewPath("binaryData"), "field is immutable when `immutable` is set"))
			}
		}
		return errs
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Data", "string", 0, "Data contains the configuration data."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		cm := obj.(*corev1.ConfigMap)
		return []any{cm.Name, int64(len(cm.Data) + len(cm.BinaryData)), age(cm.CreationTimestamp, now)}
	},
}

func validateConfigMap(cm *corev1.ConfigMap) field.ErrorList {
	var errs field.ErrorList
	total := 0
	for k, v := range cm.Data {
		p := field.NewPath("data").Key(k)
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, field.Invalid(p, k, msg))
		}
		if _, dup := cm.BinaryData[k]; dup {
			errs = append(errs, field.Invalid(p, k, "duplicate of key present in binaryData"))
		}
		total += len(v)
	}
	for k, v := range cm.BinaryData {
		p := field.NewPath("binaryData").Key(k)
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, field.Invalid(p, k, msg))
		}
		if _, dup := cm.Data[k]; dup {
			errs = append(errs, field.Invalid(p, k, "duplicate of key present in data"))
		}
		total += len(v)
	}
	if total > maxConfigSize {
		errs = append(errs, field.TooLong(field.NewPath(""), "", maxConfigSize))
	}
	return errs
}

// ---- Secret ----

var secretKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("Secret"),
	Resource:   "secrets",
	Singular:   "secret",
	Namespaced: true,
	Default: func(obj runtime.Object) {
		s := obj.(*corev1.Secret)
		if s.Type == "" {
			s.Type = corev1.SecretTypeOpaque
		}
		// stringData is write-only: merge it into data.
		if len(s.StringData) > 0 {
			if s.Data == nil {
				s.Data = map[string][]byte{}
			}
			for k, v := range s.StringData {
				s.Data[k] = []byte(v)
			}
		}
		s.StringData = nil
	},
	Validate: func(obj runtime.Object) field.ErrorList { return validateSecret(obj.(*corev1.Secret)) },
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		s, o := obj.(*corev1.Secret), old.(*corev1.Secret)
		errs := validateSecret(s)
		errs = append(errs, immutable(s.Type, o.Type, field.NewPath("type"))...)
		if o.Immutable != nil && *o.Immutable {
			if s.Immutable == nil || !*s.Immutable {
				errs = append(errs, field.Forbidden(field.NewPath("immutable"), "field is immutable when `immutable` is set"))
			}
			if !apiequality.Semantic.DeepEqual(s.Data, o.Data) {
				errs = append(errs, field.Forbidden(field.NewPath("data"), "field is immutable when `immutable` is set"))
			}
		}
		return errs
	},
	Fields: func(obj runtime.Object) fields.Set {
		return fields.Set{"type": string(obj.(*corev1.Secret).Type)}
	},
	FieldLabels: []string{"type"},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Type", "string", 0, "Used to facilitate programmatic handling of secret data."),
		column("Data", "string", 0, "Data contains the secret data."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		s := obj.(*corev1.Secret)
		return []any{s.Name, string(s.Type), int64(len(s.Data)), age(s.CreationTimestamp, now)}
	},
}

func validateSecret(s *corev1.Secret) field.ErrorList {
	var errs field.ErrorList
	dp := field.NewPath("data")
	total := 0
	for k, v := range s.Data {
		for _, msg := range validation.IsConfigMapKey(k) {
			errs = append(errs, field.Invalid(dp.Key(k), k, msg))
		}
		total += len(v)
	}
	if total > maxConfigSize {
		errs = append(errs, field.TooLong(dp, "", maxConfigSize))
	}
	requireKey := func(k string) {
		if _, ok := s.Data[k]; !ok {
			errs = append(errs, field.Required(dp.Key(k), ""))
		}
	}
	jsonKey := func(k string) {
		v, ok := s.Data[k]
		if !ok {
			errs = append(errs, field.Required(dp.Key(k), ""))
			return
		}
		var x map[string]any
		if err := jsonUnmarshal(v, &x); err != nil {
			errs = append(errs, field.Invalid(dp.Key(k), "<secret contents redacted>", err.Error()))
		}
	}
	switch s.Type {
	case corev1.SecretTypeServiceAccountToken:
		if s.Annotations[corev1.ServiceAccountNameKey] == "" {
			errs = append(errs, field.Required(field.NewPath("metadata", "annotations").Key(corev1.ServiceAccountNameKey), ""))
		}
	case corev1.SecretTypeDockercfg:
		jsonKey(corev1.DockerConfigKey)
	case corev1.SecretTypeDockerConfigJson:
		jsonKey(corev1.DockerConfigJsonKey)
	case corev1.SecretTypeBasicAuth:
		_, u := s.Data[corev1.BasicAuthUsernameKey]
		_, p := s.Data[corev1.BasicAuthPasswordKey]
		if !u && !p {
			errs = append(errs, field.Required(dp.Key(corev1.BasicAuthUsernameKey), ""),
				field.Required(dp.Key(corev1.BasicAuthPasswordKey), ""))
		}
	case corev1.SecretTypeSSHAuth:
		requireKey(corev1.SSHAuthPrivateKey)
	case corev1.SecretTypeTLS:
		requireKey(corev1.TLSCertKey)
		requireKey(corev1.TLSPrivateKeyKey)
	}
	return errs
}

// ---- Endpoints ----

var endpointsKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("Endpoints"),
	Resource:   "endpoints",
	Singular:   "endpoints",
	Namespaced: true,
	ShortNames: []string{"ep"},
	Default: func(obj runtime.Object) {
		ep := obj.(*corev1.Endpoints)
		for i := range ep.Subsets {
			for j := range ep.Subsets[i].Ports {
				if ep.Subsets[i].Ports[j].Protocol == "" {
					ep.Subsets[i].Ports[j].Protocol = corev1.ProtocolTCP
				}
			}
		}
	},
	Validate: func(obj runtime.Object) field.ErrorList { return validateEndpoints(obj.(*corev1.Endpoints)) },
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Endpoints", "string", 0, "Endpoints of the service"),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		ep := obj.(*corev1.Endpoints)
		return []any{ep.Name, formatEndpoints(ep), age(ep.CreationTimestamp, now)}
	},
}

func validateEndpoints(ep *corev1.Endpoints) field.ErrorList {
	var errs field.ErrorList
	for i, ss := range ep.Subsets {
		p := field.NewPath("subsets").Index(i)
		if len(ss.Addresses) == 0 && len(ss.NotReadyAddresses) == 0 {
			errs = append(errs, field.Required(p, "must specify `addresses` or `notReadyAddresses`"))
		}
		check := func(addrs []corev1.EndpointAddress, ap *field.Path) {
			for j, a := range addrs {
				q := ap.Index(j)
				errs = append(errs, validation.IsValidIP(q.Child("ip"), a.IP)...)
				if ip := net.ParseIP(a.IP); ip != nil {
					if ip.IsLoopback() {
						errs = append(errs, field.Invalid(q.Child("ip"), a.IP, "may not be in the loopback range (127.0.0.0/8, ::1/128)"))
					}
					if ip.IsLinkLocalUnicast() {
						errs = append(errs, field.Invalid(q.Child("ip"), a.IP, "may not be in the link-local range (169.254.0.0/16, fe80::/10)"))
					}
				}
				if a.Hostname != "" {
					for _, msg := range validation.IsDNS1123Label(a.Hostname) {
						errs = append(errs, field.Invalid(q.Child("hostname"), a.Hostname, msg))
					}
				}
				if a.NodeName != nil {
					for _, msg := range validation.IsDNS1123Subdomain(*a.NodeName) {
						errs = append(errs, field.Invalid(q.Child("nodeName"), *a.NodeName, msg))
					}
				}
			}
		}
		check(ss.Addresses, p.Child("addresses"))
		check(ss.NotReadyAddresses, p.Child("notReadyAddresses"))
		for j, port := range ss.Ports {
			q := p.Child("ports").Index(j)
			if len(ss.Ports) > 1 && port.Name == "" {
				errs = append(errs, field.Required(q.Child("name"), ""))
			} else if port.Name != "" {
				for _, msg := range validation.IsDNS1123Label(port.Name) {
					errs = append(errs, field.Invalid(q.Child("name"), port.Name, msg))
				}
			}
			for _, msg := range validation.IsValidPortNum(int(port.Port)) {
				errs = append(errs, field.Invalid(q.Child("port"), port.Port, msg))
			}
			errs = append(errs, validateProtocol(port.Protocol, q.Child("protocol"))...)
		}
	}
	return errs
}

func formatEndpoints(ep *corev1.Endpoints) string {
	if len(ep.Subsets) == 0 {
		return "<none>"
	}
	const max = 3
	var list []string
	count := 0
	more := false
	for _, ss := range ep.Subsets {
		if len(ss.Ports) == 0 {
			count += len(ss.Addresses)
			for _, a := range ss.Addresses {
				if len(list) == max {
					more = true
					break
				}
				list = append(list, a.IP)
			}
			continue
		}
		for _, port := range ss.Ports {
			count += len(ss.Addresses)
			for _, a := range ss.Addresses {
				if len(list) == max {
					more = true
					break
				}
				list = append(list, net.JoinHostPort(a.IP, strconv.Itoa(int(port.Port))))
			}
		}
	}
	out := strings.Join(list, ",")
	if more {
		return fmt.Sprintf("%s + %d more...", out, count-max)
	}
	return out
}

// ---- Event ----

var eventKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("Event"),
	Resource:   "events",
	Singular:   "event",
	Namespaced: true,
	ShortNames: []string{"ev"},
	Validate:   func(obj runtime.Object) field.ErrorList { return validateEvent(obj.(*corev1.Event)) },
	Fields:     func(obj runtime.Object) fields.Set { return eventFields(obj.(*corev1.Event)) },
	FieldLabels: []string{"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
		"involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
		"reason", "reportingComponent", "source", "type"},
	Columns: []metav1.TableColumnDefinition{
		column("Last Seen", "string", 0, "The time at which the most recent occurrence of this event was recorded."),
		column("Type", "string", 0, "Type of this event (Normal, Warning), new types could be added in the future."),
		column("Reason", "string", 0, "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
		column("Object", "string", 0, "The object that this event is about."),
		column("Subobject", "string", 1, "The field of the object this event is about, if any."),
		column("Source", "string", 1, "The component reporting this event."),
		column("Message", "string", 0, "A human-readable description of the status of this operation."),
		column("First Seen", "string", 1, "The time at which the event was first recorded."),
		column("Count", "string", 1, "The number of times this event has occurred."),
		{Name: "Name", Type: "string", Format: "name", Priority: 1, Description: nameColumn.Description},
	},
	Cells: func(obj runtime.Object, now time.Time) []any { return eventCells(obj.(*corev1.Event), now) },
}

func validateEvent(e *corev1.Event) field.ErrorList {
	var errs field.ErrorList
	nsPath := field.NewPath("involvedObject", "namespace")
	if e.EventTime.IsZero() {
		if e.InvolvedObject.Namespace == "" {
			if e.Namespace != "" && e.Namespace != metav1.NamespaceDefault {
				errs = append(errs, field.Invalid(nsPath, e.InvolvedObject.Namespace, "does not match event.namespace"))
			}
		} else if e.Namespace != e.InvolvedObject.Namespace {
			errs = append(errs, field.Invalid(nsPath, e.InvolvedObject.Namespace, "does not match event.namespace"))
		}
	} else {
		if e.InvolvedObject.Namespace == "" && e.Namespace != metav1.NamespaceDefault && e.Namespace != metav1.NamespaceSystem {
			errs = append(errs, field.Invalid(nsPath, e.InvolvedObject.Namespace, "does not match event.namespace"))
		}
		if e.ReportingController == "" {
			errs = append(errs, field.Required(field.NewPath("reportingComponent"), ""))
		}
		for _, msg := range validation.IsQualifiedName(e.ReportingController) {
			errs = append(errs, field.Invalid(field.NewPath("reportingComponent"), e.ReportingController, msg))
		}
		lengths := []struct {
			name, val string
			max       int
		}{{"reportingInstance", e.ReportingInstance, 128}, {"action", e.Action, 128}, {"reason", e.Reason, 128}}
		for _, l := range lengths {
			if l.val == "" {
				errs = append(errs, field.Required(field.NewPath(l.name), ""))
			}
			if len(l.val) > l.max {
				errs = append(errs, field.Invalid(field.NewPath(l.name), "", fmt.Sprintf("can have at most %d characters", l.max)))
			}
		}
		if len(e.Message) > 1024 {
			errs = append(errs, field.Invalid(field.NewPath("message"), "", "can have at most 1024 characters"))
		}
	}
	for _, msg := range validation.IsDNS1123Subdomain(e.Namespace) {
		errs = append(errs, field.Invalid(field.NewPath("namespace"), e.Namespace, msg))
	}
	return errs
}

func microAge(t metav1.MicroTime, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return age(metav1.NewTime(t.Time), now)
}

func eventCells(e *corev1.Event, now time.Time) []any {
	first := age(e.FirstTimestamp, now)
	if e.FirstTimestamp.IsZero() {
		first = microAge(e.EventTime, now)
	}
	last := age(e.LastTimestamp, now)
	if e.LastTimestamp.IsZero() {
		last = first
	}
	count := e.Count
	if e.Series != nil {
		last = microAge(e.Series.LastObservedTime, now)
		count = e.Series.Count
	} else if count == 0 {
		count = 1
	}
	target := strings.ToLower(e.InvolvedObject.Kind)
	if e.InvolvedObject.Name != "" {
		target += "/" + e.InvolvedObject.Name
	}
	component := e.Source.Component
	if component == "" {
		component = e.ReportingController
	}
	host := e.Source.Host
	if host == "" {
		host = e.ReportingInstance
	}
	source := ""
	if component != "" {
		source = component
		if host != "" {
			source += ", " + host
		}
	}
	return []any{last, e.Type, e.Reason, target, e.InvolvedObject.FieldPath, source,
		strings.TrimSpace(e.Message), first, int64(count), e.Name}
}

// ---- ServiceAccount ----

var serviceAccountKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("ServiceAccount"),
	Resource:   "serviceaccounts",
	Singular:   "serviceaccount",
	Namespaced: true,
	ShortNames: []string{"sa"},
	Validate: func(obj runtime.Object) field.ErrorList {
		var errs field.ErrorList
		for i, s := range obj.(*corev1.ServiceAccount).ImagePullSecrets {
			if s.Name == "" {
				errs = append(errs, field.Required(field.NewPath("imagePullSecrets").Index(i).Child("name"), ""))
			}
		}
		return errs
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Secrets", "string", 0, "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		sa := obj.(*corev1.ServiceAccount)
		return []any{sa.Name, int64(len(sa.Secrets)), age(sa.CreationTimestamp, now)}
	},
}

// ---- PersistentVolume and PersistentVolumeClaim ----

var (
	supportedAccessModes = sets.New[string](string(corev1.ReadWriteOnce), string(corev1.ReadOnlyMany), string(corev1.ReadWriteMany), string(corev1.ReadWriteOncePod))
	supportedVolumeModes = sets.New[string](string(corev1.PersistentVolumeBlock), string(corev1.PersistentVolumeFilesystem))
	supportedReclaim     = sets.New[string](string(corev1.PersistentVolumeReclaimRecycle), string(corev1.PersistentVolumeReclaimDelete), string(corev1.PersistentVolumeReclaimRetain))
)

const betaStorageClassAnnotation = "volume.beta.kubernetes.io/storage-class"

func validateAccessModes(modes []corev1.PersistentVolumeAccessMode, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(modes) == 0 {
		return field.ErrorList{field.Required(path, "")}
	}
	for _, m := range modes {
		if !supportedAccessModes.Has(string(m)) {
			errs = append(errs, field.NotSupported(path, m, sets.List(supportedAccessModes)))
		}
		if m == corev1.ReadWriteOncePod && len(modes) > 1 {
			errs = append(errs, field.Forbidden(path, "may not use ReadWriteOncePod with other access modes"))
		}
	}
	return errs
}

func validateVolumeMode(m *corev1.PersistentVolumeMode, path *field.Path) field.ErrorList {
	if m != nil && !supportedVolumeModes.Has(string(*m)) {
		return field.ErrorList{field.NotSupported(path, *m, sets.List(supportedVolumeModes))}
	}
	return nil
}

func positiveQuantity(q resource.Quantity, path *field.Path) field.ErrorList {
	if q.Sign() <= 0 {
		return field.ErrorList{field.Invalid(path, q.String(), "must be greater than zero")}
	}
	return nil
}

func accessModesString(modes []corev1.PersistentVolumeAccessMode) string {
	has := func(m corev1.PersistentVolumeAccessMode) bool {
		for _, x := range modes {
			if x == m {
				return true
			}
		}
		return false
	}
	var out []string
	for _, m := range []struct {
		mode  corev1.PersistentVolumeAccessMode
		short string
	}{{corev1.ReadWriteOnce, "RWO"}, {corev1.ReadOnlyMany, "ROX"}, {corev1.ReadWriteMany, "RWX"}, {corev1.ReadWriteOncePod, "RWOP"}} {
		if has(m.mode) {
			out = append(out, m.short)
		}
	}
	return strings.Join(out, ",")
}

func volumeModeString(m *corev1.PersistentVolumeMode) string {
	if m == nil {
		return "<unset>"
	}
	return string(*m)
}

func ptrOrUnset(s *string) string {
	if s == nil {
		return "<unset>"
	}
	return *s
}

func storageClass(annotations map[string]string, name *string) string {
	if c, ok := annotations[betaStorageClassAnnotation]; ok {
		return c
	}
	if name != nil {
		return *name
	}
	return ""
}

var pvKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("PersistentVolume"),
	Resource:   "persistentvolumes",
	Singular:   "persistentvolume",
	ShortNames: []string{"pv"},
	HasStatus:  true,
	Default: func(obj runtime.Object) {
		pv := obj.(*corev1.PersistentVolume)
		if pv.Spec.PersistentVolumeReclaimPolicy == "" {
			pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
		}
		if pv.Spec.VolumeMode == nil {
			m := corev1.PersistentVolumeFilesystem
			pv.Spec.VolumeMode = &m
		}
		if pv.Status.Phase == "" {
			pv.Status.Phase = corev1.VolumePending
		}
		if hp := pv.Spec.HostPath; hp != nil && hp.Type == nil {
			t := corev1.HostPathUnset
			hp.Type = &t
		}
	},
	PrepareForCreate: func(obj runtime.Object) {
		now := metav1.Now()
		obj.(*corev1.PersistentVolume).Status = corev1.PersistentVolumeStatus{Phase: corev1.VolumePending, LastPhaseTransitionTime: &now}
	},
	Validate: func(obj runtime.Object) field.ErrorList { return validatePV(obj.(*corev1.PersistentVolume)) },
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		pv, o := obj.(*corev1.PersistentVolume), old.(*corev1.PersistentVolume)
		errs := validatePV(pv)
		if !apiequality.Semantic.DeepEqual(pv.Spec.PersistentVolumeSource, o.Spec.PersistentVolumeSource) {
			errs = append(errs, field.Forbidden(field.NewPath("spec", "persistentvolumesource"), "spec.persistentvolumesource is immutable after creation"))
		}
		errs = append(errs, immutable(pv.Spec.VolumeMode, o.Spec.VolumeMode, field.NewPath("spec", "volumeMode"))...)
		return errs
	},
	PrepareForUpdate: func(obj, old runtime.Object) {
		pv, o := obj.(*corev1.PersistentVolume), old.(*corev1.PersistentVolume)
		if pv.Status.Phase != o.Status.Phase {
			now := metav1.Now()
			pv.Status.LastPhaseTransitionTime = &now
		}
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		pv := obj.(*corev1.PersistentVolume)
		ok := sets.New(string(corev1.VolumePending), string(corev1.VolumeAvailable), string(corev1.VolumeBound), string(corev1.VolumeReleased), string(corev1.VolumeFailed))
		if pv.Status.Phase != "" && !ok.Has(string(pv.Status.Phase)) {
			return field.ErrorList{field.NotSupported(field.NewPath("status", "phase"), pv.Status.Phase, sets.List(ok))}
		}
		return nil
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Capacity", "string", 0, "capacity is the description of the persistent volume's resources and capacity."),
		column("Access Modes", "string", 0, "accessModes contains all ways the volume can be mounted."),
		column("Reclaim Policy", "string", 0, "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim."),
		column("Status", "string", 0, "phase indicates if a volume is available, bound to a claim, or released by a claim."),
		column("Claim", "string", 0, "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim."),
		column("StorageClass", "string", 0, "storageClassName is the name of StorageClass to which this persistent volume belongs."),
		column("VolumeAttributesClass", "string", 0, "Name of VolumeAttributesClass to which this persistent volume belongs."),
		column("Reason", "string", 0, "reason is a brief CamelCase string that describes any failure."),
		ageColumn,
		column("VolumeMode", "string", 1, "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		pv := obj.(*corev1.PersistentVolume)
		claim := ""
		if pv.Spec.ClaimRef != nil {
			claim = pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name
		}
		q := pv.Spec.Capacity[corev1.ResourceStorage]
		phase := string(pv.Status.Phase)
		if pv.DeletionTimestamp != nil {
			phase = "Terminating"
		}
		return []any{pv.Name, q.String(), accessModesString(pv.Spec.AccessModes), string(pv.Spec.PersistentVolumeReclaimPolicy),
			phase, claim, storageClass(pv.Annotations, &pv.Spec.StorageClassName), ptrOrUnset(pv.Spec.VolumeAttributesClassName),
			pv.Status.Reason, age(pv.CreationTimestamp, now), volumeModeString(pv.Spec.VolumeMode)}
	},
}

func validatePV(pv *corev1.PersistentVolume) field.ErrorList {
	sp := field.NewPath("spec")
	errs := validateAccessModes(pv.Spec.AccessModes, sp.Child("accessModes"))
	if len(pv.Spec.Capacity) == 0 {
		errs = append(errs, field.Required(sp.Child("capacity"), ""))
	} else if _, ok := pv.Spec.Capacity[corev1.ResourceStorage]; !ok || len(pv.Spec.Capacity) > 1 {
		errs = append(errs, field.NotSupported(sp.Child("capacity"), pv.Spec.Capacity, []string{string(corev1.ResourceStorage)}))
	}
	for name, q := range pv.Spec.Capacity {
		errs = append(errs, positiveQuantity(q, sp.Child("capacity").Key(string(name)))...)
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != "" && !supportedReclaim.Has(string(pv.Spec.PersistentVolumeReclaimPolicy)) {
		errs = append(errs, field.NotSupported(sp.Child("persistentVolumeReclaimPolicy"), pv.Spec.PersistentVolumeReclaimPolicy, sets.List(supportedReclaim)))
	}
	errs = append(errs, validateVolumeMode(pv.Spec.VolumeMode, sp.Child("volumeMode"))...)
	switch n := countSet(pv.Spec.PersistentVolumeSource); {
	case n == 0:
		errs = append(errs, field.Required(sp, "must specify a volume type"))
	case n > 1:
		errs = append(errs, field.Forbidden(sp, "may not specify more than 1 volume type"))
	}
	if hp := pv.Spec.HostPath; hp != nil && hp.Path == "" {
		errs = append(errs, field.Required(sp.Child("hostPath", "path"), ""))
	}
	if l := pv.Spec.Local; l != nil {
		if l.Path == "" {
			errs = append(errs, field.Required(sp.Child("local", "path"), ""))
		}
		if pv.Spec.NodeAffinity == nil {
			errs = append(errs, field.Required(sp.Child("nodeAffinity"), "Local volume requires node affinity"))
		}
	}
	if pv.Spec.StorageClassName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(pv.Spec.StorageClassName) {
			errs = append(errs, field.Invalid(sp.Child("storageClassName"), pv.Spec.StorageClassName, msg))
		}
	}
	return errs
}

var pvcKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaim"),
	Resource:   "persistentvolumeclaims",
	Singular:   "persistentvolumeclaim",
	Namespaced: true,
	ShortNames: []string{"pvc"},
	HasStatus:  true,
	Admit:      admitPVC,
	Default: func(obj runtime.Object) {
		pvc := obj.(*corev1.PersistentVolumeClaim)
		if pvc.Spec.VolumeMode == nil {
			m := corev1.PersistentVolumeFilesystem
			pvc.Spec.VolumeMode = &m
		}
		if pvc.Status.Phase == "" {
			pvc.Status.Phase = corev1.ClaimPending
		}
	},
	PrepareForCreate: func(obj runtime.Object) {
		obj.(*corev1.PersistentVolumeClaim).Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validatePVCSpec(&obj.(*corev1.PersistentVolumeClaim).Spec, field.NewPath("spec"))
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		return validatePVCUpdate(obj.(*corev1.PersistentVolumeClaim), old.(*corev1.PersistentVolumeClaim))
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		pvc := obj.(*corev1.PersistentVolumeClaim)
		var errs field.ErrorList
		for name, q := range pvc.Status.Capacity {
			errs = append(errs, validateResourceQuantity(name, q, field.NewPath("status", "capacity").Key(string(name)))...)
		}
		if len(pvc.Spec.AccessModes) > 0 {
			for _, m := range pvc.Status.AccessModes {
				if !supportedAccessModes.Has(string(m)) {
					errs = append(errs, field.NotSupported(field.NewPath("status", "accessModes"), m, sets.List(supportedAccessModes)))
				}
			}
		}
		return errs
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Status", "string", 0, "phase represents the current phase of PersistentVolumeClaim."),
		column("Volume", "string", 0, "volumeName is the binding reference to the PersistentVolume backing this claim."),
		column("Capacity", "string", 0, "capacity represents the actual resources of the underlying volume."),
		column("Access Modes", "string", 0, "accessModes contains the actual access modes the volume backing the PVC has."),
		column("StorageClass", "string", 0, "storageClassName is the name of the StorageClass required by the claim."),
		column("VolumeAttributesClass", "string", 0, "volumeAttributesClassName may be used to set the VolumeAttributesClass used by this claim."),
		ageColumn,
		column("VolumeMode", "string", 1, "volumeMode defines what type of volume is required by the claim."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		pvc := obj.(*corev1.PersistentVolumeClaim)
		phase := string(pvc.Status.Phase)
		if pvc.DeletionTimestamp != nil {
			phase = "Terminating"
		}
		capacity, modes := "", ""
		if pvc.Spec.VolumeName != "" {
			modes = accessModesString(pvc.Status.AccessModes)
			q := pvc.Status.Capacity[corev1.ResourceStorage]
			capacity = q.String()
		}
		return []any{pvc.Name, phase, pvc.Spec.VolumeName, capacity, modes,
			storageClass(pvc.Annotations, pvc.Spec.StorageClassName), ptrOrUnset(pvc.Spec.VolumeAttributesClassName),
			age(pvc.CreationTimestamp, now), volumeModeString(pvc.Spec.VolumeMode)}
	},
}

func validatePVCSpec(spec *corev1.PersistentVolumeClaimSpec, sp *field.Path) field.ErrorList {
	errs := validateAccessModes(spec.AccessModes, sp.Child("accessModes"))
	if spec.Selector != nil {
		errs = append(errs, validateLabelSelector(spec.Selector, sp.Child("selector"))...)
	}
	rp := sp.Child("resources", "requests").Key(string(corev1.ResourceStorage))
	if q, ok := spec.Resources.Requests[corev1.ResourceStorage]; !ok {
		errs = append(errs, field.Required(rp, ""))
	} else {
		errs = append(errs, positiveQuantity(q, rp)...)
	}
	for name, q := range spec.Resources.Requests {
		if name != corev1.ResourceStorage {
			errs = append(errs, validateResourceQuantity(name, q, sp.Child("resources", "requests").Key(string(name)))...)
		}
	}
	errs = append(errs, validateVolumeMode(spec.VolumeMode, sp.Child("volumeMode"))...)
	if spec.StorageClassName != nil && *spec.StorageClassName != "" {
		for _, msg := range validation.IsDNS1123Subdomain(*spec.StorageClassName) {
			errs = append(errs, field.Invalid(sp.Child("storageClassName"), *spec.StorageClassName, msg))
		}
	}
	return errs
}

func validatePVCUpdate(pvc, old *corev1.PersistentVolumeClaim) field.ErrorList {
	sp := field.NewPath("spec")
	errs := validatePVCSpec(&pvc.Spec, sp)
	munged := pvc.Spec.DeepCopy()
	// Binding may set the volume name once.
	if old.Spec.VolumeName == "" {
		munged.VolumeName = old.Spec.VolumeName
	}
	munged.VolumeAttributesClassName = old.Spec.VolumeAttributesClassName
	bound := old.Status.Phase == corev1.ClaimBound
	if bound {
		munged.Resources.Requests = old.Spec.Resources.Requests
		// Only a shrinking request is checked against the capacity: a
		// claim bound to a larger volume keeps its smaller request.
		newQ := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
		oldQ := old.Spec.Resources.Requests[corev1.ResourceStorage]
		if capQ, ok := old.Status.Capacity[corev1.ResourceStorage]; ok && newQ.Cmp(oldQ) < 0 && newQ.Cmp(capQ) <= 0 {
			errs = append(errs, field.Forbidden(sp.Child("resources", "requests", "storage"), "field can not be less than status.capacity"))
		}
	}
	if !apiequality.Semantic.DeepEqual(*munged, old.Spec) {
		errs = append(errs, field.Forbidden(sp, "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"))
	}
	return errs
}

// ---- ResourceQuota ----

var supportedQuotaScopes = sets.New[string](string(corev1.ResourceQuotaScopeTerminating), string(corev1.ResourceQuotaScopeNotTerminating),
	string(corev1.ResourceQuotaScopeBestEffort), string(corev1.ResourceQuotaScopeNotBestEffort),
	string(corev1.ResourceQuotaScopePriorityClass), string(corev1.ResourceQuotaScopeCrossNamespacePodAffinity),
	string(corev1.ResourceQuotaScopeVolumeAttributesClass))

var resourceQuotaKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("ResourceQuota"),
	Resource:   "resourcequotas",
	Singular:   "resourcequota",
	Namespaced: true,
	ShortNames: []string{"quota"},
	HasStatus:  true,
	Validate: func(obj runtime.Object) field.ErrorList {
		q := obj.(*corev1.ResourceQuota)
		sp := field.NewPath("spec")
		errs := validateQuotaList(q.Spec.Hard, sp.Child("hard"))
		for i, s := range q.Spec.Scopes {
			if !supportedQuotaScopes.Has(string(s)) {
				errs = append(errs, field.NotSupported(sp.Child("scopes").Index(i), s, sets.List(supportedQuotaScopes)))
			}
		}
		if sel := q.Spec.ScopeSelector; sel != nil {
			for i, e := range sel.MatchExpressions {
				p := sp.Child("scopeSelector", "matchExpressions").Index(i)
				if !supportedQuotaScopes.Has(string(e.ScopeName)) {
					errs = append(errs, field.NotSupported(p.Child("scopeName"), e.ScopeName, sets.List(supportedQuotaScopes)))
				}
				switch e.Operator {
				case corev1.ScopeSelectorOpIn, corev1.ScopeSelectorOpNotIn:
					if len(e.Values) == 0 {
						errs = append(errs, field.Required(p.Child("values"), "must be at least one value when `operator` is 'In' or 'NotIn' for scope selector"))
					}
				case corev1.ScopeSelectorOpExists, corev1.ScopeSelectorOpDoesNotExist:
					if len(e.Values) != 0 {
						errs = append(errs, field.Invalid(p.Child("values"), e.Values, "must be no value when `operator` is 'Exist' or 'DoesNotExist' for scope selector"))
					}
				default:
					errs = append(errs, field.NotSupported(p.Child("operator"), e.Operator, []string{"DoesNotExist", "Exists", "In", "NotIn"}))
				}
			}
		}
		return errs
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		q := obj.(*corev1.ResourceQuota)
		errs := validateQuotaList(q.Status.Hard, field.NewPath("status", "hard"))
		return append(errs, validateQuotaList(q.Status.Used, field.NewPath("status", "used"))...)
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		ageColumn,
		column("Request", "string", 0, "Request represents a minimum amount of cpu/memory that a container may consume."),
		column("Limit", "string", 0, "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		q := obj.(*corev1.ResourceQuota)
		names := make([]string, 0, len(q.Status.Hard))
		for n := range q.Status.Hard {
			names = append(names, string(n))
		}
		sort.Strings(names)
		var req, lim []string
		for _, n := range names {
			used := q.Status.Used[corev1.ResourceName(n)]
			hard := q.Status.Hard[corev1.ResourceName(n)]
			s := fmt.Sprintf("%s: %s/%s", n, used.String(), hard.String())
			if parts := strings.Split(n, "."); len(parts) > 1 && parts[0] == "limits" {
				lim = append(lim, s)
			} else {
				req = append(req, s)
			}
		}
		return []any{q.Name, age(q.CreationTimestamp, now), strings.Join(req, ", "), strings.Join(lim, ", ")}
	},
}

func validateQuotaList(list corev1.ResourceList, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for name, q := range list {
		p := path.Key(string(name))
		for _, msg := range validation.IsQualifiedName(string(name)) {
			errs = append(errs, field.Invalid(p, name, msg))
		}
		if q.Sign() < 0 {
			errs = append(errs, field.Invalid(p, q.String(), "must be greater than or equal to 0"))
		}
	}
	return errs
}

// ---- LimitRange ----

var supportedLimitTypes = sets.New[string](string(corev1.LimitTypePod), string(corev1.LimitTypeContainer), string(corev1.LimitTypePersistentVolumeClaim))

var limitRangeKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("LimitRange"),
	Resource:   "limitranges",
	Singular:   "limitrange",
	Namespaced: true,
	ShortNames: []string{"limits"},
	Default: func(obj runtime.Object) {
		lr := obj.(*corev1.LimitRange)
		for i := range lr.Spec.Limits {
			item := &lr.Spec.Limits[i]
			if item.Type != corev1.LimitTypeContainer {
				continue
			}
			if item.Default == nil {
				item.Default = corev1.ResourceList{}
			}
			if item.DefaultRequest == nil {
				item.DefaultRequest = corev1.ResourceList{}
			}
			for k, v := range item.Max {
				if _, ok := item.Default[k]; !ok {
					item.Default[k] = v.DeepCopy()
				}
			}
			for k, v := range item.Default {
				if _, ok := item.DefaultRequest[k]; !ok {
					item.DefaultRequest[k] = v.DeepCopy()
				}
			}
			for k, v := range item.Min {
				if _, ok := item.DefaultRequest[k]; !ok {
					item.DefaultRequest[k] = v.DeepCopy()
				}
			}
		}
	},
	Validate: func(obj runtime.Object) field.ErrorList { return validateLimitRange(obj.(*corev1.LimitRange)) },
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Created At", "date", 0, "CreationTimestamp is a timestamp representing the server time when this object was created."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		lr := obj.(*corev1.LimitRange)
		return []any{lr.Name, lr.CreationTimestamp.UTC().Format(time.RFC3339)}
	},
}

func validateLimitRange(lr *corev1.LimitRange) field.ErrorList {
	var errs field.ErrorList
	seen := sets.New[string]()
	for i, item := range lr.Spec.Limits {
		p := field.NewPath("spec", "limits").Index(i)
		if !supportedLimitTypes.Has(string(item.Type)) {
			errs = append(errs, field.NotSupported(p.Child("type"), item.Type, sets.List(supportedLimitTypes)))
		}
		if seen.Has(string(item.Type)) {
			errs = append(errs, field.Duplicate(p.Child("type"), item.Type))
		}
		seen.Insert(string(item.Type))
		for _, l := range []struct {
			name string
			list corev1.ResourceList
		}{{"max", item.Max}, {"min", item.Min}, {"default", item.Default}, {"defaultRequest", item.DefaultRequest}, {"maxLimitRequestRatio", item.MaxLimitRequestRatio}} {
			errs = append(errs, validateQuotaList(l.list, p.Child(l.name))...)
		}
		if item.Type == corev1.LimitTypePod {
			if len(item.Default) > 0 {
				errs = append(errs, field.Forbidden(p.Child("default"), "may not be specified when `type` is 'Pod'"))
			}
			if len(item.DefaultRequest) > 0 {
				errs = append(errs, field.Forbidden(p.Child("defaultRequest"), "may not be specified when `type` is 'Pod'"))
			}
		}
		if item.Type == corev1.LimitTypePersistentVolumeClaim {
			_, minOK := item.Min[corev1.ResourceStorage]
			_, maxOK := item.Max[corev1.ResourceStorage]
			if !minOK && !maxOK {
				errs = append(errs, field.Required(p.Child("limits"), "either minimum or maximum storage value is required, but neither was provided"))
			}
		}
		for k, minQ := range item.Min {
			if maxQ, ok := item.Max[k]; ok && minQ.Cmp(maxQ) > 0 {
				errs = append(errs, field.Invalid(p.Child("min").Key(string(k)), minQ.String(), fmt.Sprintf("min value %s is greater than max value %s", minQ.String(), maxQ.String())))
			}
		}
		for k, d := range item.Default {
			if minQ, ok := item.Min[k]; ok && minQ.Cmp(d) > 0 {
				errs = append(errs, field.Invalid(p.Child("default").Key(string(k)), d.String(), fmt.Sprintf("min value %s is greater than default value %s", minQ.String(), d.String())))
			}
			if maxQ, ok := item.Max[k]; ok && d.Cmp(maxQ) > 0 {
				errs = append(errs, field.Invalid(p.Child("default").Key(string(k)), d.String(), fmt.Sprintf("default value %s is greater than max value %s", d.String(), maxQ.String())))
			}
		}
		for k, r := range item.DefaultRequest {
			if minQ, ok := item.Min[k]; ok && minQ.Cmp(r) > 0 {
				errs = append(errs, field.Invalid(p.Child("defaultRequest").Key(string(k)), r.String(), fmt.Sprintf("min value %s is greater than default request value %s", minQ.String(), r.String())))
			}
			if maxQ, ok := item.Max[k]; ok && r.Cmp(maxQ) > 0 {
				errs = append(errs, field.Invalid(p.Child("defaultRequest").Key(string(k)), r.String(), fmt.Sprintf("default request value %s is greater than max value %s", r.String(), maxQ.String())))
			}
			if d, ok := item.Default[k]; ok && r.Cmp(d) > 0 {
				errs = append(errs, field.Invalid(p.Child("defaultRequest").Key(string(k)), r.String(), fmt.Sprintf("default request value %s is greater than default limit value %s", r.String(), d.String())))
			}
		}
		for k, ratio := range item.MaxLimitRequestRatio {
			if ratio.Cmp(resource.MustParse("1")) < 0 {
				errs = append(errs, field.Invalid(p.Child("maxLimitRequestRatio").Key(string(k)), ratio.String(), fmt.Sprintf("ratio %s is less than 1", ratio.String())))
			}
		}
	}
	return errs
}

// eventFields returns an event's selectable fields; events.k8s.io/v1 Events
// select on the same ones, as upstream.
func eventFields(e *corev1.Event) fields.Set {
	return fields.Set{
		"involvedObject.kind":            e.InvolvedObject.Kind,
		"involvedObject.namespace":       e.InvolvedObject.Namespace,
		"involvedObject.name":            e.InvolvedObject.Name,
		"involvedObject.uid":             string(e.InvolvedObject.UID),
		"involvedObject.apiVersion":      e.InvolvedObject.APIVersion,
		"involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
		"involvedObject.fieldPath":       e.InvolvedObject.FieldPath,
		"reason":                         e.Reason,
		"reportingComponent":             e.ReportingController,
		"source":                         e.Source.Component,
		"type":                           e.Type,
	}
}
