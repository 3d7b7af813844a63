package localstate

import (
	"net/http"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// The rules below are the agent's for every watch of the hub, kept or
// not: edge's list-watchers for client-go's reflectors follow them too.

// MinWatchTimeout spaces re-watches of idle watches: each costs a request
// on the uplink, and a watch carries nothing while nothing changes.
const MinWatchTimeout = 30 * time.Minute

// BrokenStream reports the error event client-go makes up when it cannot
// read the next event because the connection failed, as opposed to an
// error the hub sent (such as 410 Gone).
func BrokenStream(ev watch.Event) bool {
	if ev.Type != watch.Error {
		return false
	}
	st, ok := ev.Object.(*metav1.Status)
	if !ok || st.Code != http.StatusInternalServerError {
		return false
	}
	if strings.Contains(st.Message, decodeFailure) {
		return true
	}
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			if strings.Contains(c.Message, decodeFailure) {
				return true
			}
		}
	}
	return false
}

// decodeFailure starts the message of client-go's stream watcher when
// reading an event failed.
const decodeFailure = "unable to decode an event from the watch stream"
