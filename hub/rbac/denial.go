package rbac

import (
	"net/http"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
)

// sanitizer escapes what upstream escapes in a 403's message.
var sanitizer = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// denial is the 403 kube-apiserver answers to a request no authorizer
// allowed. It keeps only what the answer is made of and implements
// apierrors.APIStatus: Status and Error form upstream's message, and the
// metav1.Status that apierrors.NewForbidden would build from it, when
// they are called. A decision thus costs one small allocation; many
// denials are never shown to anyone (access reviews, escalation checks,
// the certificate signer's own checks read only whether the answer is
// nil or the reason after the message).
type denial struct {
	user, verb, path                                  string
	group, kind, subresource, namespace, name, reason string
	resource                                          bool
}

// forbidden returns the denial of at for u, reason appended to the
// message when there is one.
func forbidden(u *auth.User, at apiserver.Attributes, reason string) error {
	d := &denial{user: u.Name, verb: at.Verb, reason: reason, resource: at.Resource}
	if at.Resource {
		d.group, d.kind, d.subresource, d.namespace, d.name = at.Group, at.Kind, at.Subresource, at.Namespace, at.Name
	} else {
		d.path = at.Path
	}
	return d
}

// Error returns the 403's message.
func (d *denial) Error() string { return d.message() }

// Status returns the 403 as apierrors.NewForbidden builds it.
func (d *denial) Status() metav1.Status {
	details := &metav1.StatusDetails{}
	if d.resource {
		details.Group, details.Kind, details.Name = d.group, d.kind, d.name
	}
	return metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusForbidden,
		Reason:  metav1.StatusReasonForbidden,
		Details: details,
		Message: d.message(),
	}
}

// message forms upstream's message without fmt, in one allocation for
// the plain names that requests almost always carry.
func (d *denial) message() string {
	var buf [256]byte
	b := buf[:0]
	switch {
	case !d.resource || d.kind == "" && d.group == "":
		b = append(b, "forbidden: "...)
	default:
		b = append(b, d.kind...)
		if d.group != "" {
			b = append(b, '.')
			b = append(b, d.group...)
		}
		if d.name != "" {
			b = append(b, ' ')
			b = appendQuoted(b, d.name, "")
		}
		b = append(b, " is forbidden: "...)
	}
	start := len(b)
	b = append(b, "User "...)
	b = appendQuoted(b, d.user, "")
	b = append(b, " cannot "...)
	b = append(b, d.verb...)
	if !d.resource {
		b = append(b, " path "...)
		b = appendQuoted(b, d.path, "")
	} else {
		b = append(b, " resource "...)
		b = appendQuoted(b, d.kind, d.subresource)
		b = append(b, " in API group "...)
		b = appendQuoted(b, d.group, "")
		if d.namespace != "" {
			b = append(b, " in the namespace "...)
			b = appendQuoted(b, d.namespace, "")
		} else {
			b = append(b, " at the cluster scope"...)
		}
	}
	if end := len(b); needsEscape(b[start:end]) {
		b = append(b[:start], sanitizer.Replace(string(b[start:end]))...)
	}
	if d.reason != "" {
		b = append(b, ": "...)
		b = append(b, d.reason...)
	}
	return string(b)
}

func needsEscape(s []byte) bool {
	for _, c := range s {
		if c == '&' || c == '<' || c == '>' {
			return true
		}
	}
	return false
}

// appendQuoted appends s, or s/sub when sub is not empty, as
// strconv.Quote (and so fmt's %q) would, without its cost for the plain
// names that requests almost always carry.
func appendQuoted(b []byte, s, sub string) []byte {
	if plain(s) && plain(sub) {
		b = append(b, '"')
		b = append(b, s...)
		if sub != "" {
			b = append(b, '/')
			b = append(b, sub...)
		}
		return append(b, '"')
	}
	if sub != "" {
		s += "/" + sub
	}
	return strconv.AppendQuote(b, s)
}

func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
