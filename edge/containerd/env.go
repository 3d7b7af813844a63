package containerd

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tether-edge/tether/edge"
)

// containerEnv resolves a container's environment: envFrom first, then
// env, later entries winning, with $(VAR) references expanded against what
// came before, as the kubelet does.
func (r *Runtime) containerEnv(pod *corev1.Pod, c *corev1.Container, podIPs []string, nodeAllocatable corev1.ResourceList) ([]string, error) {
	src := r.sources()
	svcEnv, err := serviceEnv(src, pod)
	if err != nil {
		return nil, err
	}
	vars := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			optional := ef.ConfigMapRef.Optional != nil && *ef.ConfigMapRef.Optional
			cm, err := getConfigMap(src, pod.Namespace, ef.ConfigMapRef.Name)
			if err != nil {
				if optional && errors.Is(err, edge.ErrSourceNotFound) {
					continue
				}
				return nil, err
			}
			keys := sortedKeys(cm.Data)
			for _, k := range keys {
				set(ef.Prefix+k, cm.Data[k])
			}
		case ef.SecretRef != nil:
			optional := ef.SecretRef.Optional != nil && *ef.SecretRef.Optional
			s, err := getSecret(src, pod.Namespace, ef.SecretRef.Name)
			if err != nil {
				if optional && errors.Is(err, edge.ErrSourceNotFound) {
					continue
				}
				return nil, err
			}
			keys := make([]string, 0, len(s.Data))
			for k := range s.Data {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				set(ef.Prefix+k, string(s.Data[k]))
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expandWith(e.Value, lookupIn(vars, svcEnv)))
			continue
		}
		v, skip, err := r.envValue(src, pod, c, e.ValueFrom, podIPs, nodeAllocatable)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if !skip {
			set(e.Name, v)
		}
	}
	out := make([]string, 0, len(order)+len(svcEnv))
	for _, k := range order {
		out = append(out, k+"="+vars[k])
	}
	return append(out, remainingServiceEnv(svcEnv, vars)...), nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func getConfigMap(src edge.Sources, ns, name string) (*corev1.ConfigMap, error) {
	if src == nil {
		return nil, fmt.Errorf("configmap %s/%s: no source of API objects", ns, name)
	}
	return src.ConfigMap(ns, name)
}

func getSecret(src edge.Sources, ns, name string) (*corev1.Secret, error) {
	if src == nil {
		return nil, fmt.Errorf("secret %s/%s: no source of API objects", ns, name)
	}
	return src.Secret(ns, name)
}

func (r *Runtime) envValue(src edge.Sources, pod *corev1.Pod, c *corev1.Container, from *corev1.EnvVarSource, podIPs []string, alloc corev1.ResourceList) (v string, skip bool, err error) {
	switch {
	case from.FieldRef != nil:
		v, err := podField(pod, from.FieldRef.FieldPath, podIPs)
		return v, false, err
	case from.ResourceFieldRef != nil:
		v, err := resourceField(pod, c, from.ResourceFieldRef, alloc)
		return v, false, err
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		optional := ref.Optional != nil && *ref.Optional
		cm, err := getConfigMap(src, pod.Namespace, ref.Name)
		if err != nil {
			if optional && errors.Is(err, edge.ErrSourceNotFound) {
				return "", true, nil
			}
			return "", false, err
		}
		if v, ok := cm.Data[ref.Key]; ok {
			return v, false, nil
		}
		if v, ok := cm.BinaryData[ref.Key]; ok {
			return string(v), false, nil
		}
		if optional {
			return "", true, nil
		}
		return "", false, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		optional := ref.Optional != nil && *ref.Optional
		s, err := getSecret(src, pod.Namespace, ref.Name)
		if err != nil {
			if optional && errors.Is(err, edge.ErrSourceNotFound) {
				return "", true, nil
			}
			return "", false, err
		}
		if v, ok := s.Data[ref.Key]; ok {
			return string(v), false, nil
		}
		if optional {
			return "", true, nil
		}
		return "", false, fmt.Errorf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)
	}
	return "", false, errors.New("unsupported value source")
}

// podField is a downward API field of the pod.
func podField(pod *corev1.Pod, path string, podIPs []string) (string, error) {
	if k, ok := strings.CutPrefix(path, "metadata.labels['"); ok {
		return pod.Labels[strings.TrimSuffix(k, "']")], nil
	}
	if k, ok := strings.CutPrefix(path, "metadata.annotations['"); ok {
		return pod.Annotations[strings.TrimSuffix(k, "']")], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		if len(podIPs) > 0 {
			return podIPs[0], nil
		}
		return "", nil
	case "status.podIPs":
		return strings.Join(podIPs, ","), nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "status.hostIPs":
		var ips []string
		for _, h := range pod.Status.HostIPs {
			ips = append(ips, h.IP)
		}
		return strings.Join(ips, ","), nil
	}
	return "", fmt.Errorf("unsupported field path %q", path)
}

func formatMap(m map[string]string) string {
	var b strings.Builder
	for _, k := range sortedKeys(m) {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// resourceField is a container's request or limit in units of the
// divisor, rounded up; an unset limit is the node's allocatable.
func resourceField(pod *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector, alloc corev1.ResourceList) (string, error) {
	if ref.ContainerName != "" {
		if cc := containerSpec(pod, ref.ContainerName); cc != nil {
			c = cc
		}
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", fmt.Errorf("unsupported resource %q", ref.Resource)
	}
	var q resource.Quantity
	var found bool
	switch kind {
	case "limits":
		q, found = c.Resources.Limits[corev1.ResourceName(name)]
		if !found {
			q, found = alloc[corev1.ResourceName(name)]
		}
	case "requests":
		q, found = c.Resources.Requests[corev1.ResourceName(name)]
	default:
		return "", fmt.Errorf("unsupported resource %q", ref.Resource)
	}
	if !found {
		return "0", nil
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	if name == "cpu" {
		v := int64(math.Ceil(float64(q.MilliValue()) / float64(div.MilliValue())))
		return strconv.FormatInt(v, 10), nil
	}
	v := int64(math.Ceil(float64(q.Value()) / float64(div.Value())))
	return strconv.FormatInt(v, 10), nil
}

// expand replaces $(VAR) with the value of VAR when it is defined and
// $$ with $, leaving other references as they are.
func expand(s string, vars map[string]string) string {
	return expandWith(s, lookupIn(vars, nil))
}

// expandWith is expand with the variables given by lookup.
func expandWith(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}
