package apiserver

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/registry"
)

// Media types the server reads and writes.
const (
	mediaJSON     = "application/json"
	mediaYAML     = "application/yaml"
	mediaProtobuf = "application/vnd.kubernetes.protobuf"
)

// output is what a response should look like.
type output struct {
	info runtime.SerializerInfo
	// as is "", "Table", "PartialObjectMetadata" or
	// "PartialObjectMetadataList"; asVersion the meta.k8s.io version.
	as        string
	asVersion string
}

// toStatus turns any error into a *apierrors.StatusError.
func toStatus(err error) *apierrors.StatusError {
	var se *apierrors.StatusError
	if errors.As(err, &se) {
		return se
	}
	var as apierrors.APIStatus
	if errors.As(err, &as) {
		return &apierrors.StatusError{ErrStatus: as.Status()}
	}
	return apierrors.NewInternalError(err)
}

func (s *Server) writeError(w http.ResponseWriter, err error) {
	st := toStatus(err).ErrStatus
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	if st.Status == "" {
		st.Status = metav1.StatusFailure
	}
	if st.Details == nil {
		// Clients read details without checking for them (kubectl debug
		// reads the name of a 404's), so every failure carries them, if
		// only empty, as upstream's not-found routes do.
		st.Details = &metav1.StatusDetails{}
	}
	code := int(st.Code)
	if code == 0 {
		code = http.StatusInternalServerError
		st.Code = int32(code)
	}
	if st.Reason == metav1.StatusReasonTooManyRequests && st.Details != nil && st.Details.RetryAfterSeconds > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(st.Details.RetryAfterSeconds))
	}
	auditStatus(w, &st)
	s.writeRawJSON(w, code, &st)
}

func (s *Server) writeRawJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code = http.StatusInternalServerError
		b = []byte(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"encode response","reason":"InternalError","details":{},"code":500}`)
	}
	w.Header().Set("Content-Type", mediaJSON)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(b)
	_, _ = w.Write([]byte("\n"))
}

// serializerFor returns the serializer for a bare media type.
func (s *Server) serializerFor(media string) (runtime.SerializerInfo, bool) {
	for _, info := range s.codecs.SupportedMediaTypes() {
		if info.MediaType == media {
			return info, true
		}
	}
	return runtime.SerializerInfo{}, false
}

// negotiate picks the response format from the Accept header. allowAs
// lists which "as=" transformations the endpoint can produce.
func (s *Server) negotiate(r *http.Request, allowAs ...string) (output, error) {
	return s.negotiateFor(r, false, allowAs...)
}

// negotiateKind is negotiate for a response about kind k: a kind that is
// not served as protobuf (custom resources) gets protobuf only for its
// metadata (PartialObjectMetadata), as upstream.
func (s *Server) negotiateKind(r *http.Request, k *registry.Kind, allowAs ...string) (output, error) {
	return s.negotiateFor(r, k.NoProtobuf, allowAs...)
}

func (s *Server) negotiateFor(r *http.Request, noProtobuf bool, allowAs ...string) (output, error) {
	accept := r.Header.Get("Accept")
	if strings.TrimSpace(accept) == "" {
		info, _ := s.serializerFor(mediaJSON)
		return output{info: info}, nil
	}
	for _, part := range strings.Split(accept, ",") {
		media, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch media {
		case "*/*", "application/*":
			media = mediaJSON
		case mediaJSON, mediaYAML, mediaProtobuf:
		default:
			continue
		}
		info, ok := s.serializerFor(media)
		if !ok {
			continue
		}
		as := params["as"]
		if noProtobuf && media == mediaProtobuf && !strings.HasPrefix(as, "PartialObjectMetadata") {
			continue
		}
		if as == "" {
			return output{info: info}, nil
		}
		if params["g"] != metav1.GroupName || (params["v"] != "v1" && params["v"] != "v1beta1") {
			continue
		}
		for _, a := range allowAs {
			if a == as {
				return output{info: info, as: as, asVersion: params["v"]}, nil
			}
		}
	}
	return output{}, statusErr(http.StatusNotAcceptable, fmt.Sprintf("only the following media types are accepted: %s", strings.Join(s.acceptedTypes(), ", ")))
}

func (s *Server) acceptedTypes() []string {
	var out []string
	for _, info := range s.codecs.SupportedMediaTypes() {
		out = append(out, info.MediaType)
	}
	return out
}

// setKind fills obj's TypeMeta from the scheme, preferring gv.
func (s *Server) setKind(obj runtime.Object, gv schema.GroupVersion) error {
	gvks, _, err := s.scheme.ObjectKinds(obj)
	if err != nil {
		return fmt.Errorf("find kind of %T: %w", obj, err)
	}
	pick := gvks[0]
	for _, g := range gvks {
		if g.GroupVersion() == gv {
			pick = g
			break
		}
	}
	obj.GetObjectKind().SetGroupVersionKind(pick)
	return nil
}

// kindOf returns the kind setKind would give obj.
func (s *Server) kindOf(obj runtime.Object, gv schema.GroupVersion) (schema.GroupVersionKind, error) {
	gvks, _, err := s.scheme.ObjectKinds(obj)
	if err != nil {
		return schema.GroupVersionKind{}, fmt.Errorf("find kind of %T: %w", obj, err)
	}
	for _, g := range gvks {
		if g.GroupVersion() == gv {
			return g, nil
		}
	}
	return gvks[0], nil
}

// encode serializes obj with the output's serializer after setting its
// TypeMeta. An object that already has the right TypeMeta is only read, so
// objects shared between watches can be encoded concurrently; one that
// needs another TypeMeta is copied first.
func (s *Server) encode(out output, obj runtime.Object, gv schema.GroupVersion, w io.Writer) error {
	gvk, err := s.kindOf(obj, gv)
	if err != nil {
		return err
	}
	if obj.GetObjectKind().GroupVersionKind() != gvk {
		obj = obj.DeepCopyObject()
		obj.GetObjectKind().SetGroupVersionKind(gvk)
	}
	if u, ok := obj.(*unstructured.Unstructured); ok && out.info.MediaType == mediaJSON {
		// The JSON serializer has encoding/json call the object's
		// MarshalJSON, then validate and compact its output, which is
		// compact already: the same bytes, without the second pass.
		b, err := u.MarshalJSON()
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return out.info.Serializer.Encode(obj, w)
}

// writeObject writes obj with status code under the negotiated format.
func (s *Server) writeObject(w http.ResponseWriter, r *http.Request, code int, out output, obj runtime.Object, gv schema.GroupVersion) {
	var buf strings.Builder
	if err := s.encode(out, obj, gv, &buf); err != nil {
		s.writeError(w, apierrors.NewInternalError(fmt.Errorf("encode response: %w", err)))
		return
	}
	w.Header().Set("Content-Type", out.info.MediaType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	body := buf.String()
	auditResponse(r, out.info.MediaType, body, obj)
	writeBody(w, r, code, len(body), func(w io.Writer) error {
		_, err := io.WriteString(w, body)
		return err
	})
}

// readBody reads a request body up to the size limit.
func (s *Server) readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	if r.ContentLength > s.maxBody {
		return nil, tooLarge(s.maxBody)
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, s.maxBody+1))
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("read request body: %v", err))
	}
	if int64(len(b)) > s.maxBody {
		return nil, tooLarge(s.maxBody)
	}
	auditRequestBody(r, b)
	return b, nil
}

func tooLarge(limit int64) error {
	return apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("limit is %d", limit))
}

// bodySerializer returns the serializer for the request's Content-Type.
func (s *Server) bodySerializer(r *http.Request) (runtime.SerializerInfo, error) {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		ct = mediaJSON
	}
	media, _, err := mime.ParseMediaType(ct)
	if err == nil {
		if info, ok := s.serializerFor(media); ok {
			return info, nil
		}
	}
	return runtime.SerializerInfo{}, unsupportedMedia(ct, s.acceptedTypes())
}

// decodeBody decodes a request body into a new object of gvk, honouring
// fieldValidation. It returns warnings for fieldValidation=Warn. A body
// that is not an object of gvk is refused as upstream refuses it.
func (s *Server) decodeBody(r *http.Request, body []byte, gvk schema.GroupVersionKind, validation string) (runtime.Object, []string, error) {
	info, err := s.bodySerializer(r)
	if err != nil {
		return nil, nil, err
	}
	into, err := s.scheme.New(gvk)
	if err != nil {
		return nil, nil, apierrors.NewInternalError(fmt.Errorf("create %s: %w", gvk, err))
	}
	obj, actual, warnings, err := decodeValidated(info, body, gvk, into, validation)
	if err != nil {
		return nil, nil, decodeError(err, actual, gvk, body)
	}
	if actual != nil && actual.Kind != gvk.Kind {
		// Upstream decodes the body as what it says it is, then fails to
		// convert that into the endpoint's kind.
		return nil, nil, decodeError(fmt.Errorf("converting (%s) to (%s): unknown conversion", typeName(obj), internalTypeName(gvk)), actual, gvk, body)
	}
	if actual != nil && actual.GroupVersion() != gvk.GroupVersion() {
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("the API version in the data (%s) does not match the expected API version (%s)", actual.GroupVersion(), gvk.GroupVersion()))
	}
	return obj, warnings, nil
}

// decodeValidated decodes body with info's serializer, strictly unless
// validation is Ignore; with Warn, strict decoding errors become warnings.
func decodeValidated(info runtime.SerializerInfo, body []byte, gvk schema.GroupVersionKind, into runtime.Object, validation string) (runtime.Object, *schema.GroupVersionKind, []string, error) {
	dec := info.Serializer
	if validation != metav1.FieldValidationIgnore && info.StrictSerializer != nil {
		dec = info.StrictSerializer
	}
	obj, actual, err := dec.Decode(body, &gvk, into)
	if err == nil {
		return obj, actual, nil, nil
	}
	strict, ok := runtime.AsStrictDecodingError(err)
	if !ok || obj == nil || validation != metav1.FieldValidationWarn {
		return nil, actual, nil, err
	}
	var warnings []string
	for _, e := range strict.Errors() {
		warnings = append(warnings, e.Error())
	}
	return obj, actual, warnings, nil
}

// decodeError is upstream's 400 for a body that does not decode as want:
// it names the kind and version the body claimed when it could be read,
// and otherwise shows the start of the body.
func decodeError(err error, actual *schema.GroupVersionKind, want schema.GroupVersionKind, body []byte) error {
	if actual != nil && actual.Kind != "" {
		return apierrors.NewBadRequest(fmt.Sprintf("%s in version %q cannot be handled as a %s: %v", actual.Kind, actual.Version, want.Kind, err))
	}
	return apierrors.NewBadRequest(fmt.Sprintf("the object provided is unrecognized (must be of type %s): %v (%s)", want.Kind, err, summarizeBody(body, 30)))
}

// summarizeBody shows up to n bytes of a body: as text when it looks like
// JSON, in hex otherwise.
func summarizeBody(b []byte, n int) string {
	more := ""
	if len(b) > n {
		b, more = b[:n], " ..."
	}
	switch {
	case len(b) == 0:
		return "<empty>"
	case b[0] == '{':
		return string(b) + more
	default:
		return hex.EncodeToString(b) + more
	}
}

// typeName is the Go type of obj as conversion errors print it: v1.Pod.
func typeName(obj runtime.Object) string {
	t := reflect.TypeOf(obj)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.String()
}

// internalTypeName is the name upstream's internal type for gvk has in
// conversion errors: core.Namespace, apps.Deployment, and core.Event for
// events.k8s.io, whose objects are core Events.
func internalTypeName(gvk schema.GroupVersionKind) string {
	group := gvk.Group
	for _, k := range registry.All() {
		if k.GVK == gvk && !k.StoredAs.Empty() {
			group = k.StoredAs.Group
		}
	}
	if group == "" {
		return "core." + gvk.Kind
	}
	pkg, _, _ := strings.Cut(group, ".")
	return pkg + "." + gvk.Kind
}

// decodeWith decodes a patched object for the patch handler.
func (s *Server) decodeWith(info runtime.SerializerInfo, body []byte, gvk schema.GroupVersionKind, into runtime.Object, validation string) (runtime.Object, []string, error) {
	if len(body) == 0 {
		return nil, nil, apierrors.NewBadRequest("the body of the request was empty")
	}
	obj, actual, warnings, err := decodeValidated(info, body, gvk, into, validation)
	if err != nil {
		if _, ok := runtime.AsStrictDecodingError(err); ok {
			return nil, nil, apierrors.NewBadRequest(err.Error())
		}
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("error decoding %s: %v", strings.ToUpper(strings.TrimPrefix(info.MediaType, "application/")), err))
	}
	if actual != nil && actual.GroupVersion() != gvk.GroupVersion() {
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("the API version in the data (%s) does not match the expected API version (%s)", actual.GroupVersion(), gvk.GroupVersion()))
	}
	if actual != nil && actual.Kind != gvk.Kind {
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("the kind in the data (%s) does not match the expected kind (%s)", actual.Kind, gvk.Kind))
	}
	return obj, warnings, nil
}

// addWarnings sets HTTP Warning headers as upstream does (code 299).
func addWarnings(w http.ResponseWriter, warnings []string) {
	for _, m := range warnings {
		w.Header().Add("Warning", fmt.Sprintf("299 - %q", m))
	}
}

func unsupportedMedia(ct string, accepted []string) error {
	return statusErr(http.StatusUnsupportedMediaType, fmt.Sprintf("the body of the request was in an unknown format - accepted media types include: %s", strings.Join(accepted, ", ")))
}

// statusErr builds a failure Status with the reason upstream uses for code.
func statusErr(code int, message string) *apierrors.StatusError {
	reason := metav1.StatusReasonUnknown
	switch code {
	case http.StatusNotFound:
		reason = metav1.StatusReasonNotFound
	case http.StatusNotAcceptable:
		reason = metav1.StatusReasonNotAcceptable
	case http.StatusUnsupportedMediaType:
		reason = metav1.StatusReasonUnsupportedMediaType
	case http.StatusUnprocessableEntity:
		reason = metav1.StatusReasonInvalid
	case http.StatusBadRequest:
		reason = metav1.StatusReasonBadRequest
	case http.StatusServiceUnavailable:
		reason = metav1.StatusReasonServiceUnavailable
	}
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: message,
		Details: &metav1.StatusDetails{}}}
}
