// Package auth authenticates requests to the hub: client certificates signed
// by the hub's CA (CN = user, O = groups) and bearer tokens. It defines the
// authenticated [User] the rest of the hub reads from the request context.
package auth

import (
	"context"
	"net/http"
)

// User is an authenticated identity.
type User struct {
	// Name is the user name: a certificate's CN, or the name a token maps to.
	Name string
	// UID is optional.
	UID string
	// Groups always includes "system:authenticated" for authenticated users.
	Groups []string
	// Extra holds further attributes (keys are lower case), as
	// impersonation's Impersonate-Extra-<key> headers set them.
	Extra map[string][]string
}

// Names of the identity a request without credentials authenticates as, as
// upstream's anonymous authenticator assigns it.
const (
	// Anonymous is the user name of requests that carry no credentials.
	Anonymous = "system:anonymous"
	// GroupUnauthenticated is the group of requests that carry no
	// credentials.
	GroupUnauthenticated = "system:unauthenticated"
)

// AnonymousUser returns the identity of a request without credentials.
func AnonymousUser() *User {
	return &User{Name: Anonymous, Groups: []string{GroupUnauthenticated}}
}

// InGroup reports whether u is a member of group g.
func (u *User) InGroup(g string) bool {
	for _, x := range u.Groups {
		if x == g {
			return true
		}
	}
	return false
}

// Authenticator identifies the user behind a request.
type Authenticator interface {
	// Authenticate returns the user and true when the request carries
	// credentials it accepts; false with a nil error when it carries none
	// this authenticator knows; an error when credentials were presented
	// but are invalid (expired, unknown token, bad signature). Safe for
	// concurrent use.
	Authenticate(r *http.Request) (*User, bool, error)
}

type userKey struct{}

type audiencesKey struct{}

// WithAudiences returns a context asking the authenticators that know the
// audiences of their tokens to accept tokens for audiences instead of the
// API's own, as a TokenReview with spec.audiences does.
func WithAudiences(ctx context.Context, audiences []string) context.Context {
	return context.WithValue(ctx, audiencesKey{}, audiences)
}

// AudiencesFrom returns the audiences WithAudiences put in ctx.
func AudiencesFrom(ctx context.Context) ([]string, bool) {
	a, ok := ctx.Value(audiencesKey{}).([]string)
	return a, ok
}

// WithUser returns a context carrying u.
func WithUser(ctx context.Context, u *User) context.Context {
	return context.WithValue(ctx, userKey{}, u)
}

// UserFrom returns the user a context carries.
func UserFrom(ctx context.Context) (*User, bool) {
	u, ok := ctx.Value(userKey{}).(*User)
	return u, ok
}
