package apiserver

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/tether-edge/tether/hub/audit"
	"github.com/tether-edge/tether/hub/auth"
)

// The audit hook. With Config.Audit set, Handler wraps every request in
// an auditRecord carried by the request context; the pipeline reports to
// it what it learns (the authenticated user, the attributes and decision
// of authorization, the request object, the response status and, at
// RequestResponse level, the response body), and the record emits the
// stages the policy asks for: RequestReceived once authorization has run,
// ResponseStarted when a long-running response (a watch, logs, exec, a
// proxy) writes its header, ResponseComplete when the handler returns.
// Without Config.Audit the handler is not wrapped and every report is a
// nil check of a context value.

const (
	decisionAnnotation = "authorization.k8s.io/decision"
	reasonAnnotation   = "authorization.k8s.io/reason"
)

type auditKey struct{}

// auditRecord is the audit state of one request. The handler goroutine
// (or the pooled worker it waits for) is its only writer.
type auditRecord struct {
	log      *audit.Log
	ev       auditv1.Event
	authUser *auth.User
	// user is the user authorization saw: authUser, or whom it
	// impersonates.
	user        *auth.User
	attrs       *audit.Attributes
	decision    audit.Decision
	evaluated   bool
	longRunning bool
	started     bool
	// anonymous is set when the request carries no credentials.
	anonymous bool
	reqBody   []byte
	respBody  []byte
}

func auditFrom(ctx context.Context) *auditRecord {
	rec, _ := ctx.Value(auditKey{}).(*auditRecord)
	return rec
}

// requestID is the request's audit ID when audit is on (so the Audit-Id
// header names the logged events), a fresh ID otherwise.
func requestID(r *http.Request) string {
	if rec := auditFrom(r.Context()); rec != nil {
		return string(rec.ev.AuditID)
	}
	return newRequestID()
}

// withAudit wraps next in the audit hook when the server has an audit log.
func (s *Server) withAudit(next http.Handler) http.Handler {
	if s.cfg.Audit == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &auditRecord{log: s.cfg.Audit}
		id := r.Header.Get("Audit-Id")
		if id == "" {
			id = uuid.NewString()
		}
		rec.ev = auditv1.Event{
			AuditID:                  types.UID(id),
			RequestURI:               r.URL.RequestURI(),
			Verb:                     strings.ToLower(r.Method),
			UserAgent:                r.UserAgent(),
			RequestReceivedTimestamp: metav1.NewMicroTime(time.Now()),
		}
		for _, ip := range utilnet.SourceIPs(r) {
			rec.ev.SourceIPs = append(rec.ev.SourceIPs, ip.String())
		}
		rec.anonymous = localUser(r.Context()) == nil && r.Header.Get("Authorization") == "" &&
			(r.TLS == nil || len(r.TLS.PeerCertificates) == 0)
		aw := &auditWriter{ResponseWriter: w, rec: rec}
		defer func() { rec.complete(aw.code) }()
		next.ServeHTTP(aw, r.WithContext(context.WithValue(r.Context(), auditKey{}, rec)))
	})
}

// auditAuthenticated reports the authenticated user (nil when
// authentication failed).
func auditAuthenticated(r *http.Request, u *auth.User) {
	if rec := auditFrom(r.Context()); rec != nil {
		rec.authUser = u
	}
}

// authorize asks the authorizer about a request and reports the request's
// attributes and the decision to the audit record. It is called once per
// request, for the request itself, with the user it acts as (the
// impersonated one when impersonating): checks of other attributes, such
// as the impersonate verb, call the Authorizer directly. The first call
// fixes the policy's decision and emits RequestReceived.
func (s *Server) authorize(r *http.Request, u *auth.User, a Attributes) error {
	err := s.authz.Authorize(u, a)
	if rec := auditFrom(r.Context()); rec != nil {
		rec.authorized(u, a, err)
	}
	return err
}

// auditDenied reports a denial by a later authorization step (the
// create-time check of CreateAuthorizer).
func auditDenied(r *http.Request, err error) {
	if rec := auditFrom(r.Context()); rec != nil {
		rec.annotate(decisionAnnotation, "forbid")
		rec.annotate(reasonAnnotation, toStatus(err).ErrStatus.Message)
	}
}

// auditRequestBody reports the raw body of a request.
func auditRequestBody(r *http.Request, body []byte) {
	if rec := auditFrom(r.Context()); rec != nil && rec.decision.Logs(auditv1.LevelRequest) {
		rec.reqBody = body
	}
}

// auditRequestObject reports the decoded object of a write: it completes
// the event's objectRef (a create's name is only in the body), and stands
// for the body when that was not JSON.
func auditRequestObject(r *http.Request, obj runtime.Object) {
	rec := auditFrom(r.Context())
	if rec == nil || rec.ev.ObjectRef == nil {
		return
	}
	if m, err := meta.Accessor(obj); err == nil {
		ref := rec.ev.ObjectRef
		if ref.Namespace == "" {
			ref.Namespace = m.GetNamespace()
		}
		if ref.Name == "" {
			ref.Name = m.GetName()
		}
		if ref.UID == "" {
			ref.UID = m.GetUID()
		}
		if ref.ResourceVersion == "" {
			ref.ResourceVersion = m.GetResourceVersion()
		}
	}
	if rec.decision.Logs(auditv1.LevelRequest) && !json.Valid(rec.reqBody) {
		if b, err := json.Marshal(obj); err == nil {
			rec.reqBody = b
		}
	}
}

// auditResponse reports a response object and its encoding.
func auditResponse(r *http.Request, mediaType, body string, obj runtime.Object) {
	if !auditsResponseBody(r.Context()) {
		return
	}
	rec := auditFrom(r.Context())
	if strings.HasPrefix(mediaType, "application/json") {
		rec.respBody = []byte(body)
	} else if b, err := json.Marshal(obj); err == nil {
		rec.respBody = b
	}
}

// auditsResponseBody reports whether the request's audit event records
// the response body (level RequestResponse, not a watch): such a response
// must go through auditResponse.
func auditsResponseBody(ctx context.Context) bool {
	rec := auditFrom(ctx)
	return rec != nil && !rec.longRunning && rec.decision.Logs(auditv1.LevelRequestResponse)
}

// auditStatus reports the Status of a failed request.
func auditStatus(w http.ResponseWriter, st *metav1.Status) {
	for w != nil {
		if aw, ok := w.(*auditWriter); ok {
			aw.rec.ev.ResponseStatus = &metav1.Status{Status: st.Status, Message: st.Message,
				Reason: st.Reason, Details: st.Details, Code: st.Code}
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

func (rec *auditRecord) annotate(k, v string) {
	if rec.ev.Annotations == nil {
		rec.ev.Annotations = map[string]string{}
	}
	rec.ev.Annotations[k] = v
}

func (rec *auditRecord) authorized(u *auth.User, a Attributes, err error) {
	rec.user = u
	rec.ev.Verb = a.Verb
	rec.attrs = &audit.Attributes{User: rec.authUser, Verb: a.Verb, ResourceRequest: a.Resource, Path: a.Path}
	if rec.attrs.User == nil {
		rec.attrs.User = u
	}
	if a.Resource {
		rec.attrs.APIGroup, rec.attrs.Resource, rec.attrs.Subresource = a.Group, a.Kind, a.Subresource
		rec.attrs.Namespace, rec.attrs.Name = a.Namespace, a.Name
		rec.ev.ObjectRef = &auditv1.ObjectReference{Resource: a.Kind, Namespace: a.Namespace, Name: a.Name,
			APIGroup: a.Group, APIVersion: a.Version, Subresource: a.Subresource}
		rec.longRunning = longRunning(a.Verb, a.Subresource)
	}
	if err != nil {
		rec.annotate(decisionAnnotation, "forbid")
		rec.annotate(reasonAnnotation, toStatus(err).ErrStatus.Message)
	} else {
		rec.annotate(decisionAnnotation, "allow")
		rec.annotate(reasonAnnotation, "")
	}
	rec.evaluate()
	rec.emit(auditv1.StageRequestReceived, time.Now())
}

// evaluate applies the policy, once; requests that end before
// authorization (failed authentication, unknown paths, health checks)
// are evaluated as non-resource requests of their path.
func (rec *auditRecord) evaluate() {
	if rec.evaluated {
		return
	}
	rec.evaluated = true
	if rec.attrs == nil {
		u := rec.authUser
		rec.attrs = &audit.Attributes{User: u, Verb: rec.ev.Verb, Path: strings.SplitN(rec.ev.RequestURI, "?", 2)[0]}
	}
	rec.decision = rec.log.Evaluate(rec.attrs)
}

// emit records stage if the policy logs it.
func (rec *auditRecord) emit(stage auditv1.Stage, now time.Time) {
	if rec.decision.Level == auditv1.LevelNone || rec.decision.Omits(stage) {
		return
	}
	ev := rec.ev
	ev.Level = rec.decision.Level
	ev.Stage = stage
	ev.StageTimestamp = metav1.NewMicroTime(now)
	if u := rec.authUser; u != nil {
		ev.User = userInfo(u)
		if rec.user != nil && rec.user != u && (rec.user.Name != u.Name || rec.user.UID != u.UID) {
			iu := userInfo(rec.user)
			ev.ImpersonatedUser = &iu
		}
	} else if rec.user != nil {
		ev.User = userInfo(rec.user)
	} else if rec.anonymous {
		ev.User = authnv1.UserInfo{Username: "system:anonymous", Groups: []string{"system:unauthenticated"}}
	}
	if ev.ObjectRef != nil {
		ref := *ev.ObjectRef
		ev.ObjectRef = &ref
	}
	if ev.ResponseStatus != nil {
		st := *ev.ResponseStatus
		ev.ResponseStatus = &st
	}
	if len(rec.ev.Annotations) > 0 {
		ev.Annotations = make(map[string]string, len(rec.ev.Annotations))
		for k, v := range rec.ev.Annotations {
			ev.Annotations[k] = v
		}
	}
	if stage == auditv1.StageResponseComplete || stage == auditv1.StageResponseStarted {
		if rec.decision.Logs(auditv1.LevelRequest) && len(rec.reqBody) > 0 && json.Valid(rec.reqBody) {
			ev.RequestObject = &runtime.Unknown{Raw: rec.omitManagedFields(rec.reqBody), ContentType: runtime.ContentTypeJSON}
		}
		if stage == auditv1.StageResponseComplete && rec.decision.Logs(auditv1.LevelRequestResponse) && len(rec.respBody) > 0 {
			ev.ResponseObject = &runtime.Unknown{Raw: rec.omitManagedFields(rec.respBody), ContentType: runtime.ContentTypeJSON}
		}
	}
	rec.log.Record(&ev)
}

// omitManagedFields drops metadata.managedFields from a JSON object, from
// each item of a list and from each row's object of a Table, when the
// policy asks to, as kube-apiserver does.
func (rec *auditRecord) omitManagedFields(b []byte) []byte {
	if !rec.decision.OmitManagedFields || !strings.Contains(string(b), `"managedFields"`) {
		return b
	}
	out, changed := editJSONObject(b, func(m map[string]json.RawMessage) bool {
		changed := dropManagedFields(m)
		if items, ok := editJSONArray(m["items"], func(item []byte) ([]byte, bool) {
			return editJSONObject(item, dropManagedFields)
		}); ok {
			m["items"], changed = items, true
		}
		if rows, ok := editJSONArray(m["rows"], func(row []byte) ([]byte, bool) {
			return editJSONObject(row, func(r map[string]json.RawMessage) bool {
				obj, ok := editJSONObject(r["object"], dropManagedFields)
				if ok {
					r["object"] = obj
				}
				return ok
			})
		}); ok {
			m["rows"], changed = rows, true
		}
		return changed
	})
	if !changed {
		return b
	}
	return out
}

// editJSONArray applies edit to each element of the JSON array b and
// returns the array encoded again if any element changed.
func editJSONArray(b []byte, edit func([]byte) ([]byte, bool)) ([]byte, bool) {
	var elems []json.RawMessage
	if json.Unmarshal(b, &elems) != nil {
		return b, false
	}
	edited := false
	for i := range elems {
		var c bool
		elems[i], c = edit(elems[i])
		edited = edited || c
	}
	if !edited {
		return b, false
	}
	out, err := json.Marshal(elems)
	if err != nil {
		return b, false
	}
	return out, true
}

// editJSONObject applies edit to the JSON object b and returns it encoded
// again if edit reports a change; b itself otherwise, or when b is no
// object.
func editJSONObject(b []byte, edit func(map[string]json.RawMessage) bool) ([]byte, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil || m == nil || !edit(m) {
		return b, false
	}
	out, err := json.Marshal(m)
	if err != nil {
		return b, false
	}
	return out, true
}

// dropManagedFields removes metadata.managedFields from an object.
func dropManagedFields(obj map[string]json.RawMessage) bool {
	md, changed := editJSONObject(obj["metadata"], func(md map[string]json.RawMessage) bool {
		_, ok := md["managedFields"]
		delete(md, "managedFields")
		return ok
	})
	if changed {
		obj["metadata"] = md
	}
	return changed
}

// started emits ResponseStarted for a long-running request.
func (rec *auditRecord) responseStarted(code int) {
	if rec.started {
		return
	}
	rec.started = true
	if !rec.longRunning {
		return
	}
	rec.setCode(code)
	rec.evaluate()
	rec.emit(auditv1.StageResponseStarted, time.Now())
}

func (rec *auditRecord) setCode(code int) {
	if rec.ev.ResponseStatus == nil {
		rec.ev.ResponseStatus = &metav1.Status{}
	}
	rec.ev.ResponseStatus.Code = int32(code)
}

func (rec *auditRecord) complete(code int) {
	if code == 0 {
		code = http.StatusOK
	}
	rec.setCode(code)
	rec.evaluate()
	rec.emit(auditv1.StageResponseComplete, time.Now())
}

// auditWriter reports the response's start to its record.
type auditWriter struct {
	http.ResponseWriter
	rec  *auditRecord
	code int
}

func (w *auditWriter) WriteHeader(code int) {
	if w.code == 0 && code >= 200 {
		w.code = code
		w.rec.responseStarted(code)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *auditWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
		w.rec.responseStarted(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *auditWriter) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
		w.rec.responseStarted(http.StatusOK)
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *auditWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
