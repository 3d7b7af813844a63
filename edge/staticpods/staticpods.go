// Package staticpods turns a node's manifest directory into static pods,
// as the kubelet's staticPodPath does: every file of the directory (or the
// one file named) that holds a Pod in YAML or JSON is a pod the node runs
// without the hub. Files whose name starts with a dot are ignored.
//
// Vocabulary:
//   - manifest: a file of the directory, at most 1 MiB, holding one Pod.
//   - static pod: the pod a manifest makes ([Decode]): named
//     <name>-<node>, bound to the node, its UID a hash of the manifest,
//     the node and the file (so a changed file is another pod), carrying
//     the annotations kubernetes.io/config.source=file, config.hash (the
//     UID) and config.seen, defaulted as the hub defaults API pods, and
//     refused when it refers to other API objects (the node could not
//     read them).
//   - mirror pod: the read-only copy of a static pod the agent keeps on
//     the hub, marked by kubernetes.io/config.mirror ([IsMirror]).
//   - [Reader]: reads the directory's static pods, logging each bad
//     manifest once; [Watch] calls back on every change of the directory
//     (inotify) and at every full rescan.
//
// The agent (package edge) keeps the static pods in its local state, runs
// them and keeps their mirror pods.
package staticpods

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Annotations of static and mirror pods.
const (
	AnnConfigSource = "kubernetes.io/config.source"
	AnnConfigHash   = "kubernetes.io/config.hash"
	AnnConfigSeen   = "kubernetes.io/config.seen"
	AnnConfigMirror = "kubernetes.io/config.mirror"
)

// IsMirror tells whether an API pod is the mirror of a static pod.
func IsMirror(p *corev1.Pod) bool {
	_, ok := p.Annotations[AnnConfigMirror]
	return ok
}

// Decode decodes a manifest read from file and makes it a static pod of
// node seen at now, as the kubelet's file source does. refs names the API
// objects a pod refers to ("secret db-password"), which a static pod may
// not; nil means none.
func Decode(manifest []byte, file, node string, now time.Time, refs func(*corev1.Pod) []string) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096).Decode(pod); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if pod.APIVersion != "v1" || pod.Kind != "Pod" {
		return nil, fmt.Errorf("want apiVersion v1 and kind Pod, got %q %q", pod.APIVersion, pod.Kind)
	}
	if pod.Name == "" {
		return nil, errors.New("no metadata.name")
	}
	if pod.UID == "" {
		enc, err := json.Marshal(pod)
		if err != nil {
			return nil, err
		}
		h := md5.New()
		h.Write(enc)
		fmt.Fprintf(h, "host:%s", node)
		fmt.Fprintf(h, "file:%s", file)
		pod.UID = types.UID(hex.EncodeToString(h.Sum(nil)))
	}
	pod.Name = pod.Name + "-" + strings.ToLower(node)
	if errs := validation.IsDNS1123Subdomain(pod.Name); len(errs) > 0 {
		return nil, fmt.Errorf("name %q: %s", pod.Name, strings.Join(errs, "; "))
	}
	if pod.Namespace == "" {
		pod.Namespace = metav1.NamespaceDefault
	}
	pod.Spec.NodeName = node
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnConfigHash] = string(pod.UID)
	pod.Annotations[AnnConfigSource] = "file"
	pod.Annotations[AnnConfigSeen] = now.UTC().Format(time.RFC3339Nano)
	delete(pod.Annotations, AnnConfigMirror)
	pod.ResourceVersion, pod.Generation, pod.ManagedFields = "", 0, nil
	pod.Status = corev1.PodStatus{Phase: corev1.PodPending}
	setDefaults(pod)
	if err := check(pod, refs); err != nil {
		return nil, err
	}
	return pod, nil
}

// check refuses what a static pod cannot have.
func check(pod *corev1.Pod, refs func(*corev1.Pod) []string) error {
	if len(pod.Spec.Containers) == 0 {
		return errors.New("no containers")
	}
	names := map[string]bool{}
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		if errs := validation.IsDNS1123Label(c.Name); len(errs) > 0 {
			return fmt.Errorf("container name %q: %s", c.Name, strings.Join(errs, "; "))
		}
		if names[c.Name] {
			return fmt.Errorf("container name %q used twice", c.Name)
		}
		names[c.Name] = true
		if c.Image == "" {
			return fmt.Errorf("container %s has no image", c.Name)
		}
	}
	var named []string
	if pod.Spec.ServiceAccountName != "" || pod.Spec.DeprecatedServiceAccount != "" {
		named = append(named, "service account")
	}
	if refs != nil {
		named = append(named, refs(pod)...)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.ServiceAccountToken != nil {
					named = append(named, "service account token")
				}
			}
		}
	}
	if len(named) > 0 {
		return fmt.Errorf("static pods cannot refer to other API objects: %s", strings.Join(named, ", "))
	}
	return nil
}

// setDefaults sets the defaults the hub gives API pods, which static pods
// never get from it.
func setDefaults(pod *corev1.Pod) {
	spec := &pod.Spec
	if spec.RestartPolicy == "" {
		spec.RestartPolicy = corev1.RestartPolicyAlways
	}
	if spec.DNSPolicy == "" {
		spec.DNSPolicy = corev1.DNSClusterFirst
	}
	if spec.TerminationGracePeriodSeconds == nil {
		g := int64(corev1.DefaultTerminationGracePeriodSeconds)
		spec.TerminationGracePeriodSeconds = &g
	}
	if spec.SchedulerName == "" {
		spec.SchedulerName = corev1.DefaultSchedulerName
	}
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	if spec.EnableServiceLinks == nil {
		v := corev1.DefaultEnableServiceLinks
		spec.EnableServiceLinks = &v
	}
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range list {
			c := &list[i]
			if c.TerminationMessagePath == "" {
				c.TerminationMessagePath = corev1.TerminationMessagePathDefault
			}
			if c.TerminationMessagePolicy == "" {
				c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
			}
			if c.ImagePullPolicy == "" {
				c.ImagePullPolicy = corev1.PullIfNotPresent
				if tag := imageTag(c.Image); tag == "" || tag == "latest" {
					c.ImagePullPolicy = corev1.PullAlways
				}
			}
			for j := range c.Ports {
				if c.Ports[j].Protocol == "" {
					c.Ports[j].Protocol = corev1.ProtocolTCP
				}
				if spec.HostNetwork && c.Ports[j].HostPort == 0 {
					c.Ports[j].HostPort = c.Ports[j].ContainerPort
				}
			}
		}
	}
	// Node problems never evict a static pod: its node runs it anyway.
	spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})
}

// imageTag returns the tag of an image reference, "" when it has none
// (a digest counts as a tag).
func imageTag(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		return image[i+1:]
	}
	if i := strings.LastIndex(image, ":"); i >= 0 && !strings.Contains(image[i:], "/") {
		return image[i+1:]
	}
	return ""
}
