package apiserver

import (
	"net/http"
	"sync"

	"k8s.io/apiserver/pkg/warning"
)

// warningHeaders records the warnings that admission (webhooks,
// ValidatingAdmissionPolicies) adds to a request's context as HTTP
// Warning headers, once each, as upstream's recorder does. Validating
// webhooks run in parallel, so it locks.
type warningHeaders struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	seen map[string]bool
}

var _ warning.Recorder = (*warningHeaders)(nil)

// AddWarning implements warning.Recorder.
func (h *warningHeaders) AddWarning(_, text string) {
	if text == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen[text] {
		return
	}
	if h.seen == nil {
		h.seen = map[string]bool{}
	}
	h.seen[text] = true
	addWarnings(h.w, []string{text})
}
