package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// EventSink writes core/v1 Events for client-go's event broadcaster
// (record.EventSink), each in the namespace the event names, as the typed
// client's EventSinkImpl does.
type EventSink struct {
	c *Client
}

// Events returns the sink of the client's Events.
func (c *Client) Events() *EventSink { return &EventSink{c: c} }

// Create creates ev.
func (s *EventSink) Create(ev *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.c.core.Post().
		NamespaceIfScoped(ev.Namespace, ev.Namespace != "").
		Resource("events").
		Body(ev).
		Do(context.Background()).
		Into(out)
	return out, err
}

// Update replaces ev; it carries the resourceVersion it replaces.
func (s *EventSink) Update(ev *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.c.core.Put().
		NamespaceIfScoped(ev.Namespace, ev.Namespace != "").
		Resource("events").
		Name(ev.Name).
		Body(ev).
		Do(context.Background()).
		Into(out)
	return out, err
}

// Patch applies the strategic merge patch data to the event ev names
// (the broadcaster's count and timestamps of a repeated event).
func (s *EventSink) Patch(ev *corev1.Event, data []byte) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.c.core.Patch(types.StrategicMergePatchType).
		NamespaceIfScoped(ev.Namespace, ev.Namespace != "").
		Resource("events").
		Name(ev.Name).
		Body(data).
		Do(context.Background()).
		Into(out)
	return out, err
}
