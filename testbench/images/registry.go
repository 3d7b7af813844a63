package images

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Registry serves the images of an OCI archive (as WriteArchive writes
// them) over the read side of the OCI distribution API: enough for
// containerd to resolve and pull them. With User set, every request needs
// HTTP basic credentials, as a private registry asks. Tests run it on
// loopback with httptest; it keeps everything in memory.
type Registry struct {
	// User and Password, when User is not empty, are the only credentials
	// accepted.
	User, Password string

	manifests map[string]string // "repo:tag" → manifest digest
	blobs     map[string][]byte // digest → content
	types     map[string]string // manifest digest → media type

	mu       sync.Mutex
	resolves map[string]int // "repo:tag" → manifest requests by tag
	refusals int
}

// NewRegistry loads the images of the OCI archive at path. An image named
// docker.io/tether/echo:v1 is served as repository tether/echo, tag v1.
func NewRegistry(path string) (*Registry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := &Registry{manifests: map[string]string{}, blobs: map[string][]byte{}, types: map[string]string{}, resolves: map[string]int{}}
	var index []byte
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		switch {
		case h.Name == "index.json":
			index = b
		case strings.HasPrefix(h.Name, "blobs/sha256/"):
			r.blobs["sha256:"+strings.TrimPrefix(h.Name, "blobs/sha256/")] = b
		}
	}
	var idx struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(index, &idx); err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", path, err)
	}
	for _, m := range idx.Manifests {
		name := m.Annotations["io.containerd.image.name"]
		i := strings.LastIndex(name, ":")
		if i < 0 {
			continue
		}
		repo, tag := name[:i], name[i+1:]
		if j := strings.Index(repo, "/"); j >= 0 && strings.ContainsAny(repo[:j], ".:") {
			repo = repo[j+1:] // drop the registry host
		}
		r.manifests[repo+":"+tag] = m.Digest
		r.types[m.Digest] = m.MediaType
	}
	return r, nil
}

// Resolves is how many times the manifest of repo:tag was asked for by
// its tag (HEAD or GET), which every pull does.
func (r *Registry) Resolves(ref string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resolves[ref]
}

// Refusals is how many requests were refused for lack of credentials.
func (r *Registry) Refusals() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refusals
}

func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		registryError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "this registry is read-only")
		return
	}
	if r.User != "" {
		u, p, ok := req.BasicAuth()
		if !ok || u != r.User || p != r.Password {
			r.mu.Lock()
			r.refusals++
			r.mu.Unlock()
			w.Header().Set("WWW-Authenticate", `Basic realm="tether-test-registry"`)
			registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
			return
		}
	}
	path := req.URL.Path
	if path == "/v2/" || path == "/v2" {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		w.WriteHeader(http.StatusOK)
		return
	}
	rest, ok := strings.CutPrefix(path, "/v2/")
	if !ok {
		registryError(w, http.StatusNotFound, "NOT_FOUND", "not found")
		return
	}
	if i := strings.LastIndex(rest, "/manifests/"); i > 0 {
		repo, ref := rest[:i], rest[i+len("/manifests/"):]
		d := ref
		if !strings.HasPrefix(ref, "sha256:") {
			d = r.manifests[repo+":"+ref]
		} else if _, known := r.types[d]; !known {
			d = ""
		}
		b, found := r.blobs[d]
		if d == "" || !found {
			registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest unknown: "+repo+":"+ref)
			return
		}
		if !strings.HasPrefix(ref, "sha256:") {
			r.mu.Lock()
			r.resolves[repo+":"+ref]++
			r.mu.Unlock()
		}
		serveBlob(w, req, r.types[d], d, b)
		return
	}
	if i := strings.LastIndex(rest, "/blobs/"); i > 0 {
		d := rest[i+len("/blobs/"):]
		b, found := r.blobs[d]
		if !found {
			registryError(w, http.StatusNotFound, "BLOB_UNKNOWN", "blob unknown: "+d)
			return
		}
		serveBlob(w, req, "application/octet-stream", d, b)
		return
	}
	registryError(w, http.StatusNotFound, "NOT_FOUND", "not found")
}

func serveBlob(w http.ResponseWriter, req *http.Request, mediaType, digest string, b []byte) {
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Docker-Content-Digest", digest)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	if req.Method == http.MethodGet {
		w.Write(b)
	}
}

func registryError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": code, "message": msg}}})
}
