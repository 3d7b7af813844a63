package registry

//lint:file-ignore SA1019 Kubernetes still serves core/v1 Endpoints, so the hub does too

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

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
