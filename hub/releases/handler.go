package releases

import (
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// DefaultMaxImportBytes is the largest executable an import takes unless
// Config says otherwise.
const DefaultMaxImportBytes = 512 << 20

// Config is what a Store works with.
type Config struct {
	// Dir holds the blobs and deltas (the hub's DATA/releases). Required.
	Dir string
	// Signer returns the release signer's key and certificate PEM, at
	// each import (see pki.Authority.ReleaseSigner). Required.
	Signer func() (crypto.Signer, []byte, error)
	// Client returns the API client that reads and creates Releases, at
	// its first use. Required.
	Client func() (dynamic.Interface, error)
	// MaxImportBytes caps an imported executable; zero means
	// DefaultMaxImportBytes.
	MaxImportBytes int64
	Logger         *slog.Logger
}

// Store serves the release store over HTTP: imports at fleetapi.ImportPath
// and downloads below it. The API server authorizes each request before
// it reaches the Store.
type Store struct {
	cfg         Config
	blobs       *blobs
	log         *slog.Logger
	clientCache clientOnce
}

// New opens the store in cfg.Dir, creating it if needed.
func New(cfg Config) (*Store, error) {
	if cfg.Dir == "" || cfg.Signer == nil || cfg.Client == nil {
		return nil, errors.New("release store: Dir, Signer and Client are required")
	}
	if cfg.MaxImportBytes <= 0 {
		cfg.MaxImportBytes = DefaultMaxImportBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	b, err := openBlobs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	return &Store{cfg: cfg, blobs: b, log: cfg.Logger}, nil
}

// releasesResource is the group/resource errors about Releases name.
var releasesResource = schema.GroupResource{Group: fleetapi.Group, Resource: fleetapi.ReleasesResource.Resource}

// ServeHTTP implements http.Handler.
func (s *Store) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case path == fleetapi.ImportPath:
		if r.Method != http.MethodPost {
			writeStatus(w, apierrors.NewMethodNotSupported(releasesResource, r.Method))
			return
		}
		s.serveImport(w, r)
	case strings.HasPrefix(path, fleetapi.ImportPath+"/"):
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeStatus(w, apierrors.NewMethodNotSupported(releasesResource, r.Method))
			return
		}
		s.serveDownload(w, r, strings.TrimPrefix(path, fleetapi.ImportPath+"/"))
	default:
		writeStatus(w, notFound("the server could not find the requested resource"))
	}
}

// serveDownload answers a GET of a blob, or with ?from= of a delta.
func (s *Store) serveDownload(w http.ResponseWriter, r *http.Request, digest string) {
	hex, err := fleetapi.ParseDigest(digest)
	if err != nil || !s.blobs.has(hex) {
		writeStatus(w, notFound(fmt.Sprintf("the hub holds no release executable %q", digest)))
		return
	}
	path, etag, contentType := s.blobs.blobPath(hex), digest, "application/octet-stream"
	if from := r.URL.Query().Get("from"); from != "" {
		oldHex, err := fleetapi.ParseDigest(from)
		if err != nil || oldHex == hex || !s.blobs.has(oldHex) {
			writeStatus(w, notFound(fmt.Sprintf("the hub holds no delta from %q to %q: download the whole executable", from, digest)))
			return
		}
		if path, etag, err = s.blobs.delta(r.Context(), hex, oldHex); err != nil {
			if r.Context().Err() != nil {
				return
			}
			s.log.Error("releases: compute delta", "to", digest, "from", from, "err", err)
			writeStatus(w, apierrors.NewInternalError(fmt.Errorf("compute the delta from %s: %w", from, err)))
			return
		}
		w.Header().Set(fleetapi.DeltaHeader, etag)
		contentType = "application/zstd"
	}
	f, err := os.Open(path)
	if err != nil {
		writeStatus(w, apierrors.NewInternalError(err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeStatus(w, apierrors.NewInternalError(err))
		return
	}
	// A delta no smaller than the executable is no delta to give.
	if etag != digest {
		if whole, err := os.Stat(s.blobs.blobPath(hex)); err == nil && fi.Size() >= whole.Size() {
			w.Header().Del(fleetapi.DeltaHeader)
			writeStatus(w, notFound(fmt.Sprintf("the delta to %q is no smaller than the executable: download the whole executable", digest)))
			return
		}
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("ETag", `"`+etag+`"`)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// serveImport answers a POST of an executable.
func (s *Store) serveImport(w http.ResponseWriter, r *http.Request) {
	limit := s.cfg.MaxImportBytes
	if r.ContentLength > limit {
		writeStatus(w, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("the executable is larger than the hub's limit of %d bytes", limit)))
		return
	}
	st, err := s.blobs.stage(r.Body, limit)
	if errors.Is(err, errTooLarge) {
		writeStatus(w, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("the executable is larger than the hub's limit of %d bytes", limit)))
		return
	}
	if err != nil {
		if r.Context().Err() == nil {
			s.log.Error("releases: receive an executable", "err", err)
		}
		writeStatus(w, apierrors.NewInternalError(err))
		return
	}
	obj, created, err := s.importStaged(r.Context(), st)
	if err != nil {
		writeStatus(w, err)
		return
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
		s.log.Info("releases: imported", "release", obj.Name, "digest", obj.Spec.Digest, "size", obj.Spec.Size)
	}
	writeJSON(w, code, obj)
}

// statusOf turns err into the Status an answer carries.
func statusOf(err error) metav1.Status {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return se.Status()
	}
	return apierrors.NewInternalError(err).Status()
}

// writeStatus writes err as a metav1.Status, as the API server does.
func writeStatus(w http.ResponseWriter, err error) {
	st := statusOf(err)
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	if st.Status == "" {
		st.Status = metav1.StatusFailure
	}
	if st.Details == nil {
		st.Details = &metav1.StatusDetails{}
	}
	code := int(st.Code)
	if code == 0 {
		code = http.StatusInternalServerError
		st.Code = int32(code)
	}
	writeJSON(w, code, &st)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

func notFound(msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound,
		Reason: metav1.StatusReasonNotFound, Message: msg}}
}
