package fleetapi

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestWindowOpen(t *testing.T) {
	w := &MaintenanceWindow{Start: "23:00", Duration: metav1.Duration{Duration: 3 * time.Hour}, Days: []string{"Mon"}}
	for _, c := range []struct {
		at   string
		want bool
	}{
		{"2026-03-02T23:30:00Z", true},  // Monday, after the start
		{"2026-03-03T01:59:00Z", true},  // Tuesday, in Monday's opening
		{"2026-03-03T02:00:00Z", false}, // closed
		{"2026-03-03T23:30:00Z", false}, // Tuesday's start: not a day it opens
		{"2026-03-02T22:59:00Z", false},
	} {
		at, _ := time.Parse(time.RFC3339, c.at)
		if got, err := WindowOpen(w, at); err != nil || got != c.want {
			t.Errorf("WindowOpen at %s = %v, %v; want %v", c.at, got, err, c.want)
		}
	}
	if ok, err := WindowOpen(nil, time.Now()); !ok || err != nil {
		t.Errorf("nil window: %v, %v", ok, err)
	}
	if ok, err := WindowOpen(&MaintenanceWindow{Start: "25:00", Duration: metav1.Duration{Duration: time.Hour}}, time.Now()); ok || err == nil {
		t.Errorf("bad window: %v, %v", ok, err)
	}
}

func TestImageStagingCopyAndCodec(t *testing.T) {
	q := resource.MustParse("128Ki")
	s := &ImageStaging{
		ObjectMeta: metav1.ObjectMeta{Name: "s", UID: "u"},
		Spec: ImageStagingSpec{Images: []string{"a:v1"}, BandwidthLimit: &q,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"k": "v"}},
			Window:       &MaintenanceWindow{Start: "01:00", Days: []string{"Mon"}}},
		Status: ImageStagingStatus{Nodes: 2, Images: []ImageCount{{Image: "a:v1", Nodes: 1}}},
	}
	c := s.DeepCopy()
	if !equality.Semantic.DeepEqual(s, c) {
		t.Fatalf("copy differs: %+v", c)
	}
	c.Spec.Images[0] = "changed"
	c.Spec.Window.Days[0] = "Tue"
	if s.Spec.Images[0] != "a:v1" || s.Spec.Window.Days[0] != "Mon" {
		t.Error("the copy shares slices with the original")
	}
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var d ImageStaging
	if err := d.Unmarshal(b); err != nil || !equality.Semantic.DeepEqual(s, &d) {
		t.Errorf("round trip: %v, %+v", err, d)
	}
	if n, err := NormalizeImage("nginx"); err != nil || n != "docker.io/library/nginx:latest" {
		t.Errorf("NormalizeImage(nginx) = %q, %v", n, err)
	}
}
