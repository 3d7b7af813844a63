package edge

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/tether-edge/tether/edge/state"
)

// Static pods, as the kubelet's staticPodPath: every file of the manifest
// directory (Config.PodManifestPath) that holds a Pod in YAML or JSON runs
// on the node without the hub. Files whose name starts with a dot are
// ignored. The agent watches the directory (inotify, and a full read every
// staticRescan): a new file starts its pod, a changed one replaces it, a
// removed one stops it. As upstream, a static pod is named
// <name>-<node>, its UID is a hash of its manifest, the node and the file
// (so a change of the file is another pod), and it carries the annotations
// kubernetes.io/config.source=file, config.hash (the UID) and config.seen.
//
// Static pods are kept in the local state before they run, so that the
// pod of a file removed while the agent was down is stopped when it
// starts again. They may not refer to other API objects (service
// accounts, secrets, config maps, claims): the node could not read them.
//
// The hub learns of a static pod through its mirror pod (mirror.go).

// Annotations of static and mirror pods.
const (
	AnnConfigSource = "kubernetes.io/config.source"
	AnnConfigHash   = "kubernetes.io/config.hash"
	AnnConfigSeen   = "kubernetes.io/config.seen"
	AnnConfigMirror = "kubernetes.io/config.mirror"
)

const (
	// staticRescan is how often the manifest directory is read in full,
	// as the kubelet's file-check frequency.
	staticRescan = 20 * time.Second
	// staticMaxSize caps a manifest file.
	staticMaxSize = 1 << 20
	// keptStatic is the local state's kind of static pods.
	keptStatic = "staticpods"
)

// isMirror tells whether an API pod is the mirror of a static pod.
func isMirror(p *corev1.Pod) bool {
	_, ok := p.Annotations[AnnConfigMirror]
	return ok
}

// staticSource reads the manifest directory and hands its pods to the pod
// manager.
type staticSource struct {
	a    *Agent
	path string

	pods   map[types.UID]*corev1.Pod // the pods handed over, by UID
	failed map[string]string         // file → the error last logged
}

func newStaticSource(a *Agent, path string) *staticSource {
	return &staticSource{a: a, path: path, failed: map[string]string{}}
}

// run reads the directory until ctx ends.
func (s *staticSource) run(ctx context.Context) {
	if err := os.MkdirAll(s.path, 0o755); err != nil {
		s.a.log.Warn("create the static pod manifest directory", "path", s.path, "err", err)
	}
	events := make(chan struct{}, 1)
	var w *dirWatch
	defer func() {
		if w != nil {
			w.close()
		}
	}()
	t := time.NewTicker(staticRescan)
	defer t.Stop()
	for {
		if w == nil || w.dead() {
			if w != nil {
				w.close()
			}
			w, _ = watchDir(s.path, events) // nil: the periodic reads do
		}
		s.scan()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-events:
			// Writers write in steps: read once they are done.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			select {
			case <-events:
			default:
			}
		}
	}
}

// scan reads the manifests and hands the changes to the pod manager: new
// pods are kept in the local state first, then started; pods whose file
// went (or changed: another UID) are stopped.
func (s *staticSource) scan() {
	first := s.pods == nil
	if first {
		// The static pods of the previous run: those whose file is gone
		// are stopped, the others go on as they were.
		s.pods = map[types.UID]*corev1.Pod{}
		for _, p := range s.a.local.staticPods() {
			s.pods[p.UID] = p
		}
	}
	found := s.read()
	var ops []state.Op
	var added []*corev1.Pod
	for uid, p := range found {
		if _, ok := s.pods[uid]; ok {
			if first {
				added = append(added, p)
			}
			continue
		}
		b, err := p.Marshal()
		if err != nil {
			continue
		}
		ops = append(ops, state.Op{Key: state.Key{Kind: keptStatic, Namespace: p.Namespace, Name: p.Name, UID: string(uid)}, Value: b})
		added = append(added, p)
		s.a.log.Info("static pod", "pod", p.Namespace+"/"+p.Name, "uid", uid)
	}
	if len(ops) > 0 && s.a.local != nil {
		if err := s.a.local.db.Commit(ops, nil); err != nil {
			s.a.log.Warn("keep static pods", "err", err)
			return // not acted on: the next read tries again
		}
	}
	for uid, p := range s.pods {
		if _, ok := found[uid]; !ok {
			s.a.log.Info("static pod removed", "pod", p.Namespace+"/"+p.Name, "uid", uid)
			delete(s.pods, uid)
			s.a.pods.staticGone(p)
		}
	}
	for _, p := range added {
		s.pods[p.UID] = p
		s.a.pods.updateStatic(p)
	}
	if first {
		s.a.pods.staticSynced()
	}
}

// read returns the valid pods of the manifest directory by UID.
func (s *staticSource) read() map[types.UID]*corev1.Pod {
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
		if old, ok := s.pods[p.UID]; ok {
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
func (s *staticSource) warnOnce(file string, err error) {
	if s.failed[file] == err.Error() {
		return
	}
	s.failed[file] = err.Error()
	s.a.log.Warn("static pod manifest ignored", "file", file, "err", err)
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
func (s *staticSource) load(file string) (*corev1.Pod, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, staticMaxSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > staticMaxSize {
		return nil, fmt.Errorf("larger than %d bytes", staticMaxSize)
	}
	return staticPod(b, file, s.a.name, time.Now())
}

// staticPod decodes a manifest and makes it a static pod of node, as the
// kubelet's file source does.
func staticPod(manifest []byte, file, node string, now time.Time) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096).Decode(pod); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if pod.APIVersion != "v1" || pod.Kind != "Pod" {
		return nil, fmt.Errorf("want apiVersion v1 and kind Pod, got %q %q", pod.APIVersion, pod.Kind)
	}
	if pod.Name == "" {
		return nil, errors.New("no metadata.name")
	}
	if pod.UID == "" {
		enc, err := json.Marshal(pod)
		if err != nil {
			return nil, err
		}
		h := md5.New()
		h.Write(enc)
		fmt.Fprintf(h, "host:%s", node)
		fmt.Fprintf(h, "file:%s", file)
		pod.UID = types.UID(hex.EncodeToString(h.Sum(nil)))
	}
	pod.Name = pod.Name + "-" + strings.ToLower(node)
	if errs := validation.IsDNS1123Subdomain(pod.Name); len(errs) > 0 {
		return nil, fmt.Errorf("name %q: %s", pod.Name, strings.Join(errs, "; "))
	}
	if pod.Namespace == "" {
		pod.Namespace = metav1.NamespaceDefault
	}
	pod.Spec.NodeName = node
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnConfigHash] = string(pod.UID)
	pod.Annotations[AnnConfigSource] = "file"
	pod.Annotations[AnnConfigSeen] = now.UTC().Format(time.RFC3339Nano)
	delete(pod.Annotations, AnnConfigMirror)
	pod.ResourceVersion, pod.Generation, pod.ManagedFields = "", 0, nil
	pod.Status = corev1.PodStatus{Phase: corev1.PodPending}
	defaultStaticPod(pod)
	if err := checkStaticPod(pod); err != nil {
		return nil, err
	}
	return pod, nil
}

// checkStaticPod refuses what a static pod cannot have.
func checkStaticPod(pod *corev1.Pod) error {
	if len(pod.Spec.Containers) == 0 {
		return errors.New("no containers")
	}
	names := map[string]bool{}
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		if errs := validation.IsDNS1123Label(c.Name); len(errs) > 0 {
			return fmt.Errorf("container name %q: %s", c.Name, strings.Join(errs, "; "))
		}
		if names[c.Name] {
			return fmt.Errorf("container name %q used twice", c.Name)
		}
		names[c.Name] = true
		if c.Image == "" {
			return fmt.Errorf("container %s has no image", c.Name)
		}
	}
	var refs []string
	if pod.Spec.ServiceAccountName != "" || pod.Spec.DeprecatedServiceAccount != "" {
		refs = append(refs, "service account")
	}
	for _, r := range podRefs(pod) {
		refs = append(refs, strings.TrimSuffix(string(r.kind), "s")+" "+r.name)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.ServiceAccountToken != nil {
					refs = append(refs, "service account token")
				}
			}
		}
	}
	if len(refs) > 0 {
		return fmt.Errorf("static pods cannot refer to other API objects: %s", strings.Join(refs, ", "))
	}
	return nil
}

// defaultStaticPod sets the defaults the hub gives API pods, which static
// pods never get from it.
func defaultStaticPod(pod *corev1.Pod) {
	spec := &pod.Spec
	if spec.RestartPolicy == "" {
		spec.RestartPolicy = corev1.RestartPolicyAlways
	}
	if spec.DNSPolicy == "" {
		spec.DNSPolicy = corev1.DNSClusterFirst
	}
	if spec.TerminationGracePeriodSeconds == nil {
		g := int64(corev1.DefaultTerminationGracePeriodSeconds)
		spec.TerminationGracePeriodSeconds = &g
	}
	if spec.SchedulerName == "" {
		spec.SchedulerName = corev1.DefaultSchedulerName
	}
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	if spec.EnableServiceLinks == nil {
		v := corev1.DefaultEnableServiceLinks
		spec.EnableServiceLinks = &v
	}
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range list {
			c := &list[i]
			if c.TerminationMessagePath == "" {
				c.TerminationMessagePath = corev1.TerminationMessagePathDefault
			}
			if c.TerminationMessagePolicy == "" {
				c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
			}
			if c.ImagePullPolicy == "" {
				c.ImagePullPolicy = corev1.PullIfNotPresent
				if tag := imageTag(c.Image); tag == "" || tag == "latest" {
					c.ImagePullPolicy = corev1.PullAlways
				}
			}
			for j := range c.Ports {
				if c.Ports[j].Protocol == "" {
					c.Ports[j].Protocol = corev1.ProtocolTCP
				}
				if spec.HostNetwork && c.Ports[j].HostPort == 0 {
					c.Ports[j].HostPort = c.Ports[j].ContainerPort
				}
			}
		}
	}
	// Node problems never evict a static pod: its node runs it anyway.
	spec.Tolerations = append(spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})
}

// imageTag returns the tag of an image reference, "" when it has none
// (a digest counts as a tag).
func imageTag(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		return image[i+1:]
	}
	if i := strings.LastIndex(image, ":"); i >= 0 && !strings.Contains(image[i:], "/") {
		return image[i+1:]
	}
	return ""
}

// staticPods returns the static pods the local state keeps.
func (l *localState) staticPods() []*corev1.Pod {
	if l == nil {
		return nil
	}
	rows, err := l.db.List(keptStatic, "", "")
	if err != nil {
		l.log.Warn("read local state", "err", err)
		return nil
	}
	var out []*corev1.Pod
	for _, r := range rows {
		p := &corev1.Pod{}
		if err := p.Unmarshal(r.Value); err != nil {
			l.log.Warn("skip unreadable static pod in the local state", "pod", r.Namespace+"/"+r.Name, "err", err)
			continue
		}
		out = append(out, p)
	}
	return out
}

// staticRemoved forgets a static pod the runtime no longer has.
func (l *localState) staticRemoved(pod *corev1.Pod) {
	if l == nil || pod == nil {
		return
	}
	k := state.Key{Kind: keptStatic, Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)}
	if err := l.db.Commit([]state.Op{{Key: k, Delete: true}}, nil); err != nil {
		l.log.Warn("forget removed static pod", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
}

// dirWatch is an inotify watch of a directory; it signals every change on
// a channel.
type dirWatch struct {
	f    *os.File
	done chan struct{} // closed when the watch ended (its directory went)
}

func watchDir(dir string, events chan<- struct{}) (*dirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	mask := uint32(unix.IN_CREATE | unix.IN_DELETE | unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_ATTRIB |
		unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF)
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watch %s: %w", dir, err)
	}
	w := &dirWatch{f: os.NewFile(uintptr(fd), "inotify"), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
		for {
			n, err := w.f.Read(buf)
			if err != nil {
				return
			}
			gone := false
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				if ev.Mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
					gone = true
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
			select {
			case events <- struct{}{}:
			default:
			}
			if gone {
				return
			}
		}
	}()
	return w, nil
}

func (w *dirWatch) dead() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

func (w *dirWatch) close() {
	w.f.Close()
	<-w.done
}
