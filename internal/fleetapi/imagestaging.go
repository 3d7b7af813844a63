package fleetapi

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/distribution/reference"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// ImageStagings: pulling images onto nodes before pods need them, so that
// a site's thin uplink carries them at a time of the operator's choosing
// and a pod starts from what its node already holds.
//
// Its nouns:
//
//   - An ImageStaging names images and the nodes that are to hold them
//     (a label selector), with a per-node bandwidth cap and a daily window.
//   - An agent stages an image when a staging that selects its node names
//     it: it pulls the image (through the same path as pods' pulls, peers
//     of its site first) and keeps it from image garbage collection while
//     a staging names it.
//   - A node holds an image when its Node's status.images lists the
//     image's reference; the imagestaging controller counts those.

// Resource and kind of ImageStagings.
var (
	ImageStagingsResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "imagestagings"}
	ImageStagingKind      = schema.GroupVersionKind{Group: Group, Version: Version, Kind: "ImageStaging"}
)

// ImageStaging asks the nodes it selects to pull its images and keep them.
type ImageStaging struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ImageStagingSpec   `json:"spec"`
	Status            ImageStagingStatus `json:"status,omitempty"`
}

// ImageStagingSpec is what to stage where.
type ImageStagingSpec struct {
	// Images are image references as pods name them ("registry/app:v2",
	// "nginx", "repo@sha256:...").
	Images []string `json:"images"`
	// NodeSelector picks the nodes; empty or absent selects every node.
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// BandwidthLimit caps each node's download, in bytes per second;
	// absent: no cap.
	BandwidthLimit *resource.Quantity `json:"bandwidthLimit,omitempty"`
	// Window restricts when nodes start pulling; absent: at any time. A
	// pull that started in the window finishes after it closes.
	Window *MaintenanceWindow `json:"window,omitempty"`
}

// ImageStagingStatus is what the selected nodes hold, as their Nodes'
// status.images report it.
type ImageStagingStatus struct {
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase is one of the StagingPhase constants.
	Phase string `json:"phase,omitempty"`
	// Nodes counts the selected nodes; Staged those that hold every
	// image.
	Nodes  int32 `json:"nodes"`
	Staged int32 `json:"staged"`
	// Images count, per image of the spec, the selected nodes holding it.
	Images []ImageCount `json:"images,omitempty"`
	// Conditions: Staged.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ImageCount is how many selected nodes hold one image.
type ImageCount struct {
	Image string `json:"image"`
	Nodes int32  `json:"nodes"`
}

// Phases of an ImageStaging.
const (
	// StagingPending: nodes lack images and the window is open (or
	// there is none).
	StagingPending = "Pending"
	// StagingWaiting: nodes lack images and the window is closed.
	StagingWaiting = "Waiting"
	// StagingStaged: every selected node holds every image (also when
	// no node is selected).
	StagingStaged = "Staged"
)

// ConditionStaged is the ImageStaging condition that says whether every
// selected node holds every image.
const ConditionStaged = "Staged"

// ReasonImageStagingFailed is the reason of the Warning Event an agent
// records on an ImageStaging whose image it could not pull.
const ReasonImageStagingFailed = "ImageStagingFailed"

// ImageStagingList is a list of ImageStagings.
type ImageStagingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ImageStaging `json:"items"`
}

// AddImageStagingToScheme registers ImageStaging and its list in s (for
// clients that decode them, as the agent's).
func AddImageStagingToScheme(s *runtime.Scheme) error {
	gv := schema.GroupVersion{Group: Group, Version: Version}
	s.AddKnownTypes(gv, &ImageStaging{}, &ImageStagingList{})
	metav1.AddToGroupVersion(s, gv)
	return nil
}

// DeepCopyInto copies s into out.
func (s *ImageStaging) DeepCopyInto(out *ImageStaging) {
	*out = *s
	s.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec.Images = append([]string(nil), s.Spec.Images...)
	if s.Spec.NodeSelector != nil {
		out.Spec.NodeSelector = s.Spec.NodeSelector.DeepCopy()
	}
	if s.Spec.BandwidthLimit != nil {
		q := s.Spec.BandwidthLimit.DeepCopy()
		out.Spec.BandwidthLimit = &q
	}
	if s.Spec.Window != nil {
		w := *s.Spec.Window
		w.Days = append([]string(nil), w.Days...)
		out.Spec.Window = &w
	}
	out.Status.Images = append([]ImageCount(nil), s.Status.Images...)
	if s.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(s.Status.Conditions))
		for i := range s.Status.Conditions {
			s.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
}

// DeepCopy returns a copy of s.
func (s *ImageStaging) DeepCopy() *ImageStaging {
	if s == nil {
		return nil
	}
	out := &ImageStaging{}
	s.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (s *ImageStaging) DeepCopyObject() runtime.Object { return s.DeepCopy() }

// DeepCopyObject implements runtime.Object.
func (l *ImageStagingList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &ImageStagingList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	for i := range l.Items {
		out.Items = append(out.Items, *l.Items[i].DeepCopy())
	}
	return out
}

// Marshal encodes s as JSON. The agent's local state stores its objects
// with Marshal and Unmarshal; custom kinds have no protobuf.
func (s *ImageStaging) Marshal() ([]byte, error) { return json.Marshal(s) }

// Unmarshal decodes s from what Marshal wrote.
func (s *ImageStaging) Unmarshal(b []byte) error {
	*s = ImageStaging{}
	return json.Unmarshal(b, s)
}

// NormalizeImage returns the full reference containerd stores an image
// under (nginx → docker.io/library/nginx:latest), which is also the name
// agents report in status.images.
func NormalizeImage(image string) (string, error) {
	named, err := reference.ParseDockerRef(image)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", image, err)
	}
	return named.String(), nil
}

// HoldsImage reports whether names, a Node's status.images names, hold
// image (normalized, as NormalizeImage returns it).
func HoldsImage(names []string, image string) bool {
	for _, n := range names {
		if n == image {
			return true
		}
	}
	return false
}

// WindowOpen reports whether w is open at now; a nil w always is. A
// window that does not parse is never open, and the error says why.
func WindowOpen(w *MaintenanceWindow, now time.Time) (bool, error) {
	if w == nil {
		return true, nil
	}
	hh, mm, ok := strings.Cut(w.Start, ":")
	h, err1 := strconv.Atoi(hh)
	m, err2 := strconv.Atoi(mm)
	if !ok || err1 != nil || err2 != nil || h < 0 || h > 23 || m < 0 || m > 59 {
		return false, fmt.Errorf("window start %q: want HH:MM", w.Start)
	}
	d := w.Duration.Duration
	if d <= 0 || d > 24*time.Hour {
		return false, fmt.Errorf("window duration %v: want more than 0 and at most 24h", d)
	}
	loc := time.UTC
	if w.TimeZone != "" {
		l, err := time.LoadLocation(w.TimeZone)
		if err != nil {
			return false, fmt.Errorf("window time zone %q: %w", w.TimeZone, err)
		}
		loc = l
	}
	t := now.In(loc)
	// An opening lasts at most a day: it began today or yesterday.
	for back := 0; back <= 1; back++ {
		day := t.AddDate(0, 0, -back)
		open := time.Date(day.Year(), day.Month(), day.Day(), h, m, 0, 0, loc)
		if !t.Before(open) && t.Before(open.Add(d)) && windowDay(w.Days, open.Weekday()) {
			return true, nil
		}
	}
	return false, nil
}

// windowDay reports whether days (empty: every day) hold d.
func windowDay(days []string, d time.Weekday) bool {
	if len(days) == 0 {
		return true
	}
	name := d.String()[:3]
	for _, x := range days {
		if strings.EqualFold(x, name) {
			return true
		}
	}
	return false
}
