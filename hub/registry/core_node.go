package registry

//lint:file-ignore SA1019 Kubernetes still serves NodeSpec.ConfigSource, so the hub does too

import (
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// newNodeKind returns the Node kind, giving pod CIDRs from a.
func newNodeKind(a *podCIDRAllocator) *Kind {
	return &Kind{
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
		Admit:    a.admitNode,
		Release:  a.releaseNode,
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
