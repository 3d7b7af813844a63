package staticpods

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// maxSize caps a manifest file.
const maxSize = 1 << 20

// Reader reads the static pods of a manifest directory. It is used from
// one goroutine.
type Reader struct {
	path string
	node string
	refs func(*corev1.Pod) []string
	log  *slog.Logger

	failed map[string]string // file → the error last logged
}

// NewReader returns a reader of path, a directory of manifests or one
// manifest file, making static pods of node; refs is Decode's. Bad
// manifests are logged to log, each once until its error changes.
func NewReader(path, node string, refs func(*corev1.Pod) []string, log *slog.Logger) *Reader {
	return &Reader{path: path, node: node, refs: refs, log: log, failed: map[string]string{}}
}

// Read returns the valid static pods of the directory by UID. A pod of
// known (by UID) is returned as known holds it, so an unchanged manifest
// yields the same value.
func (s *Reader) Read(known map[types.UID]*corev1.Pod) map[types.UID]*corev1.Pod {
	files, err := manifestFiles(s.path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.warnOnce(s.path, err)
		}
		return map[types.UID]*corev1.Pod{}
	}
	out := map[types.UID]*corev1.Pod{}
	names := map[string]string{} // pod → file
	seen := map[string]bool{}
	for _, f := range files {
		seen[f] = true
		p, err := s.load(f)
		if err != nil {
			s.warnOnce(f, err)
			continue
		}
		key := p.Namespace + "/" + p.Name
		if other, ok := names[key]; ok {
			s.warnOnce(f, fmt.Errorf("pod %s is already defined in %s", key, other))
			continue
		}
		delete(s.failed, f)
		names[key] = f
		if old, ok := known[p.UID]; ok {
			p = old // unchanged: the pod the manager has
		}
		out[p.UID] = p
	}
	for f := range s.failed {
		if !seen[f] && f != s.path {
			delete(s.failed, f)
		}
	}
	return out
}

// warnOnce logs a file's error when it is new.
func (s *Reader) warnOnce(file string, err error) {
	if s.failed[file] == err.Error() {
		return
	}
	s.failed[file] = err.Error()
	s.log.Warn("static pod manifest ignored", "file", file, "err", err)
}

// manifestFiles lists the manifests of path: the files of a directory
// (not those starting with a dot), or path itself when it is a file.
func manifestFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		f := filepath.Join(path, e.Name())
		if st, err := os.Stat(f); err == nil && st.Mode().IsRegular() {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out, nil
}

// load reads one manifest as a static pod of this node.
func (s *Reader) load(file string) (*corev1.Pod, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSize {
		return nil, fmt.Errorf("larger than %d bytes", maxSize)
	}
	return Decode(b, file, s.node, time.Now(), s.refs)
}
