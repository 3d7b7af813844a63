package endpoints

//lint:file-ignore SA1019 EndpointSlice mirroring reads core/v1 Endpoints by definition

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPlanMirror checks the mirroring plan: at most 1000 addresses of a
// subset, ready ones first, no invalid or repeated addresses, one slice
// per address type and port list, the Endpoints' labels less skip-mirror,
// its annotations less the trigger time, and no writes when the slices
// already match.
func TestPlanMirror(t *testing.T) {
	var ready, notReady []corev1.EndpointAddress
	for i := range 1100 {
		ready = append(ready, corev1.EndpointAddress{IP: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1)})
	}
	notReady = append(notReady, corev1.EndpointAddress{IP: "10.9.0.1"})
	ep := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{
			Name: "db", Namespace: "ns", UID: "ep-uid",
			Labels:      map[string]string{"team": "a", LabelSkipMirror: "false"},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: "x", "note": "y"},
		},
		Subsets: []corev1.EndpointSubset{
			{Addresses: ready, NotReadyAddresses: notReady, Ports: []corev1.EndpointPort{{Name: "a", Port: 1, Protocol: corev1.ProtocolTCP}}},
			{Addresses: []corev1.EndpointAddress{{IP: "fd00::1"}, {IP: "fd00::1"}, {IP: "not-an-ip"}, {IP: "10.1.1.1"}},
				Ports: []corev1.EndpointPort{{Name: "a", Port: 1, Protocol: corev1.ProtocolTCP}}},
		},
	}
	p := planMirror(ep, nil, MaxMirroredPerSubset)
	if len(p.update)+len(p.delete) != 0 || len(p.create) != 3 {
		t.Fatalf("plan: %d creates, %d updates, %d deletes", len(p.create), len(p.update), len(p.delete))
	}
	count := map[discoveryv1.AddressType]int{}
	for _, s := range p.create {
		count[s.AddressType] += len(s.Endpoints)
		if len(s.Endpoints) > MaxMirroredPerSubset {
			t.Errorf("slice of %d endpoints", len(s.Endpoints))
		}
		if s.Labels["team"] != "a" || s.Labels[LabelManagedBy] != MirroringManagedByValue || s.Labels[LabelServiceName] != "db" {
			t.Errorf("labels %v", s.Labels)
		}
		if _, ok := s.Labels[LabelSkipMirror]; ok {
			t.Errorf("labels %v keep skip-mirror", s.Labels)
		}
		if len(s.Annotations) != 1 || s.Annotations["note"] != "y" {
			t.Errorf("annotations %v", s.Annotations)
		}
		if s.GenerateName != "db-" || s.OwnerReferences[0].UID != "ep-uid" {
			t.Errorf("name %q owners %v", s.GenerateName, s.OwnerReferences)
		}
		for _, e := range s.Endpoints {
			if e.Addresses[0] == "10.9.0.1" {
				t.Errorf("not-ready address past the subset's first 1000 mirrored")
			}
		}
	}
	// 1000 of the first subset's 1101, plus 10.1.1.1; one IPv6.
	if count[discoveryv1.AddressTypeIPv4] != 1001 || count[discoveryv1.AddressTypeIPv6] != 1 {
		t.Errorf("mirrored %v", count)
	}

	var existing []*discoveryv1.EndpointSlice
	for i, s := range p.create {
		s = s.DeepCopy()
		s.Name = fmt.Sprintf("db-%d", i)
		existing = append(existing, s)
	}
	if q := planMirror(ep, existing, MaxMirroredPerSubset); len(q.create)+len(q.update)+len(q.delete) != 0 {
		t.Errorf("plan over matching slices: %d creates, %d updates, %d deletes", len(q.create), len(q.update), len(q.delete))
	}
	ep.Subsets = ep.Subsets[1:]
	q := planMirror(ep, existing, MaxMirroredPerSubset)
	if len(q.create) != 0 || len(q.update) != 1 || len(q.delete) != 1 {
		t.Errorf("plan after a subset went: %d creates, %d updates, %d deletes", len(q.create), len(q.update), len(q.delete))
	}
}
