package localstate

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

func TestBrokenStream(t *testing.T) {
	for _, tc := range []struct {
		name string
		ev   watch.Event
		want bool
	}{
		{"client-go's read failure", watch.Event{Type: watch.Error, Object: &metav1.Status{Code: 500, Reason: metav1.StatusReasonInternalError,
			Message: `an error on the server ("unable to decode an event from the watch stream: stream reset") has prevented the request from succeeding`}}, true},
		{"read failure in the causes", watch.Event{Type: watch.Error, Object: &metav1.Status{Code: 500, Reason: metav1.StatusReasonInternalError,
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Message: "unable to decode an event from the watch stream: EOF"}}}}}, true},
		{"410 Gone from the hub", watch.Event{Type: watch.Error, Object: &metav1.Status{Code: 410, Reason: metav1.StatusReasonExpired}}, false},
		{"another error of the hub", watch.Event{Type: watch.Error, Object: &metav1.Status{Code: 500, Message: "etcdserver: leader changed"}}, false},
		{"not an error", watch.Event{Type: watch.Added, Object: &metav1.Status{Code: 500, Message: "unable to decode an event from the watch stream"}}, false},
	} {
		if got := BrokenStream(tc.ev); got != tc.want {
			t.Errorf("%s: BrokenStream = %v, want %v", tc.name, got, tc.want)
		}
	}
}
