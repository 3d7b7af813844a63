package containerd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/tether-edge/tether/dataplane/dns"
	"github.com/tether-edge/tether/edge"
)

// Volumes live in <pod dir>/volumes/<name>. ConfigMap, Secret, projected
// and downward API volumes are written the way the kubelet writes them,
// so that readers never see a half-updated volume: the files are in a
// timestamped directory, "..data" links to it, and each top-level entry
// is a link through "..data". An update writes a new directory and
// renames a new "..data" link over the old one in one step.

func (r *Runtime) volumeDir(p *pod, name string) string {
	return filepath.Join(p.dir, "volumes", name)
}

// volumeSource is the host path a volume is mounted from.
func (r *Runtime) volumeSource(p *pod, pod *corev1.Pod, name string) (string, error) {
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if v.Name != name {
			continue
		}
		if v.HostPath != nil {
			return v.HostPath.Path, nil
		}
		if edge.ClaimName(pod, v) != "" {
			return r.claimSource(p, pod, v)
		}
		return r.volumeDir(p, name), nil
	}
	return "", fmt.Errorf("volume %q is not defined in the pod", name)
}

// syncVolumes creates the pod's volumes and brings the content of the
// projected kinds up to date. Each volume that fails gets a FailedMount
// event, as the kubelet's volume manager reports it, unless it waits for
// an object the agent's watch does not know yet. The errors it returns
// wrap edge.ErrVolumeNotReady: the pod waits in ContainerCreating and is
// tried again, and woken when the object it needs changes.
func (r *Runtime) syncVolumes(ctx context.Context, p *pod, pod *corev1.Pod) error {
	var errs []error
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if err := r.syncVolume(ctx, p, pod, v); err != nil {
			merr := &mountError{volume: v.Name, err: err}
			if !errors.Is(err, edge.ErrSourceNotReady) {
				r.event(p, nil, true, "FailedMount", "%s", merr.Error())
			}
			errs = append(errs, merr)
		}
	}
	return errors.Join(errs...)
}

// mountError is a volume that could not be set up.
type mountError struct {
	volume string
	err    error
}

// Error is the kubelet's message for the volume's FailedMount event.
func (e *mountError) Error() string {
	return fmt.Sprintf("MountVolume.SetUp failed for volume %q : %v", e.volume, e.err)
}

func (e *mountError) Unwrap() error { return e.err }

func (e *mountError) Is(target error) bool { return target == edge.ErrVolumeNotReady }

// sourceError turns a Sources error into the kubelet's: an object the hub
// does not have is `secret "name" not found` (kind "secret" or
// "configmap").
func sourceError(kind, name string, err error) error {
	if errors.Is(err, edge.ErrSourceNotFound) {
		return apierrors.NewNotFound(corev1.Resource(kind), name)
	}
	return err
}

func (r *Runtime) syncVolume(ctx context.Context, p *pod, pod *corev1.Pod, v *corev1.Volume) error {
	dir := r.volumeDir(p, v.Name)
	switch {
	case v.HostPath != nil:
		return hostPath(v.HostPath)
	case edge.ClaimName(pod, v) != "":
		return r.syncClaim(p, pod, v)
	case v.EmptyDir != nil:
		if _, err := os.Stat(dir); err == nil {
			return nil
		}
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return err
		}
		_ = os.Chmod(dir, 0o777) // any container user may write, as upstream
		if v.EmptyDir.Medium == corev1.StorageMediumMemory {
			opts := "mode=0777"
			if v.EmptyDir.SizeLimit != nil && !v.EmptyDir.SizeLimit.IsZero() {
				opts += ",size=" + strconv.FormatInt(v.EmptyDir.SizeLimit.Value(), 10)
			}
			if err := unix.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
				return fmt.Errorf("mount tmpfs: %w", err)
			}
		}
		return nil
	case v.ConfigMap != nil, v.Secret != nil, v.Projected != nil, v.DownwardAPI != nil:
		files, mode, err := r.projection(ctx, p, pod, v)
		if err != nil {
			return err
		}
		if files == nil {
			return nil // optional and missing: leave the volume as it is
		}
		if v.Secret != nil || v.Projected != nil {
			// Secrets stay in memory, never on the node's disk.
			if err := ensureTmpfs(dir); err != nil {
				return err
			}
		}
		return writeProjection(dir, files, mode, fsGroup(pod))
	}
	return fmt.Errorf("unsupported volume type")
}

func fsGroup(pod *corev1.Pod) *int64 {
	if pod.Spec.SecurityContext != nil {
		return pod.Spec.SecurityContext.FSGroup
	}
	return nil
}

// hostPath checks a hostPath volume's type as the kubelet does, creating
// the directory (0755) or the empty file (0644) of the *OrCreate types when
// nothing is at the path.
func hostPath(h *corev1.HostPathVolumeSource) error {
	if h.Type == nil || *h.Type == corev1.HostPathUnset {
		return nil
	}
	path := h.Path
	st, err := os.Stat(path)
	exists := err == nil
	is := func(want func(os.FileMode) bool) bool { return exists && want(st.Mode()) }
	switch t := *h.Type; t {
	case corev1.HostPathDirectoryOrCreate, corev1.HostPathDirectory:
		if t == corev1.HostPathDirectoryOrCreate && os.IsNotExist(err) {
			return os.MkdirAll(path, 0o755)
		}
		if !is(os.FileMode.IsDir) {
			return fmt.Errorf("hostPath type check failed: %s is not a directory", path)
		}
	case corev1.HostPathFileOrCreate, corev1.HostPathFile:
		if t == corev1.HostPathFileOrCreate && os.IsNotExist(err) {
			f, err := os.OpenFile(path, os.O_CREATE, 0o644)
			if err != nil {
				return err
			}
			return f.Close()
		}
		if !is(os.FileMode.IsRegular) {
			return fmt.Errorf("hostPath type check failed: %s is not a file", path)
		}
	case corev1.HostPathSocket:
		if !is(func(m os.FileMode) bool { return m&os.ModeSocket != 0 }) {
			return fmt.Errorf("hostPath type check failed: %s is not a socket file", path)
		}
	case corev1.HostPathCharDev:
		if !is(func(m os.FileMode) bool { return m&os.ModeCharDevice != 0 }) {
			return fmt.Errorf("hostPath type check failed: %s is not a character device", path)
		}
	case corev1.HostPathBlockDev:
		if !is(func(m os.FileMode) bool { return m&os.ModeDevice != 0 && m&os.ModeCharDevice == 0 }) {
			return fmt.Errorf("hostPath type check failed: %s is not a block device", path)
		}
	default:
		return fmt.Errorf("%s is an invalid volume type", t)
	}
	return nil
}

func ensureTmpfs(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if mounted(dir) {
		return nil
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs: %w", err)
	}
	return nil
}

// mounted tells whether dir is a mount point.
func mounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// projFile is a file of a projected volume.
type projFile struct {
	data []byte
	mode os.FileMode
}

// projection computes the files of a ConfigMap, Secret, projected or
// downward API volume. It returns nil files for an optional missing
// source.
func (r *Runtime) projection(ctx context.Context, p *pod, pod *corev1.Pod, v *corev1.Volume) (map[string]projFile, os.FileMode, error) {
	src := r.sources()
	files := map[string]projFile{}
	mode := func(m *int32, def os.FileMode) os.FileMode {
		if m != nil {
			return os.FileMode(*m)
		}
		return def
	}
	var ips []string
	p.mu.Lock()
	for _, ip := range p.ips {
		ips = append(ips, ip.String())
	}
	p.mu.Unlock()
	addItems := func(data map[string][]byte, items []corev1.KeyToPath, def os.FileMode, missing func(key string) error, optional bool) error {
		if len(items) == 0 {
			for k, b := range data {
				files[k] = projFile{data: b, mode: def}
			}
			return nil
		}
		for _, it := range items {
			b, ok := data[it.Key]
			if !ok {
				if optional {
					continue
				}
				return missing(it.Key)
			}
			files[it.Path] = projFile{data: b, mode: mode(it.Mode, def)}
		}
		return nil
	}
	configMap := func(name string, optional bool, items []corev1.KeyToPath, def os.FileMode) (bool, error) {
		cm, err := getConfigMap(src, pod.Namespace, name)
		if err != nil {
			if optional && errors.Is(err, edge.ErrSourceNotFound) {
				return false, nil
			}
			return false, sourceError("configmap", name, err)
		}
		data := map[string][]byte{}
		for k, s := range cm.Data {
			data[k] = []byte(s)
		}
		for k, b := range cm.BinaryData {
			data[k] = b
		}
		return true, addItems(data, items, def, func(key string) error {
			return fmt.Errorf("configmap references non-existent config key: %s", key)
		}, optional)
	}
	secret := func(name string, optional bool, items []corev1.KeyToPath, def os.FileMode) (bool, error) {
		s, err := getSecret(src, pod.Namespace, name)
		if err != nil {
			if optional && errors.Is(err, edge.ErrSourceNotFound) {
				return false, nil
			}
			return false, sourceError("secret", name, err)
		}
		return true, addItems(s.Data, items, def, func(key string) error {
			return fmt.Errorf("couldn't find key %s in Secret %s/%s", key, pod.Namespace, name)
		}, optional)
	}
	downward := func(items []corev1.DownwardAPIVolumeFile, def os.FileMode) error {
		info, _ := r.Info(ctx)
		for _, it := range items {
			var val string
			var err error
			switch {
			case it.FieldRef != nil:
				val, err = podField(pod, it.FieldRef.FieldPath, ips)
			case it.ResourceFieldRef != nil:
				c := &corev1.Container{}
				if cc := containerSpec(pod, it.ResourceFieldRef.ContainerName); cc != nil {
					c = cc
				}
				val, err = resourceField(pod, c, it.ResourceFieldRef, info.Capacity)
			}
			if err != nil {
				return fmt.Errorf("downward API %s: %w", it.Path, err)
			}
			files[it.Path] = projFile{data: []byte(val), mode: mode(it.Mode, def)}
		}
		return nil
	}
	switch {
	case v.ConfigMap != nil:
		def := mode(v.ConfigMap.DefaultMode, 0o644)
		ok, err := configMap(v.ConfigMap.Name, v.ConfigMap.Optional != nil && *v.ConfigMap.Optional, v.ConfigMap.Items, def)
		if err != nil || !ok {
			return emptyIfOptional(ok, err)
		}
		return files, def, nil
	case v.Secret != nil:
		def := mode(v.Secret.DefaultMode, 0o644)
		ok, err := secret(v.Secret.SecretName, v.Secret.Optional != nil && *v.Secret.Optional, v.Secret.Items, def)
		if err != nil || !ok {
			return emptyIfOptional(ok, err)
		}
		return files, def, nil
	case v.DownwardAPI != nil:
		def := mode(v.DownwardAPI.DefaultMode, 0o644)
		return files, def, downward(v.DownwardAPI.Items, def)
	}
	def := mode(v.Projected.DefaultMode, 0o644)
	for _, s := range v.Projected.Sources {
		var err error
		switch {
		case s.ConfigMap != nil:
			_, err = configMap(s.ConfigMap.Name, s.ConfigMap.Optional != nil && *s.ConfigMap.Optional, s.ConfigMap.Items, def)
		case s.Secret != nil:
			_, err = secret(s.Secret.Name, s.Secret.Optional != nil && *s.Secret.Optional, s.Secret.Items, def)
		case s.DownwardAPI != nil:
			err = downward(s.DownwardAPI.Items, def)
		case s.ServiceAccountToken != nil:
			err = r.projectToken(ctx, p, pod, s.ServiceAccountToken, def, files)
		}
		if err != nil {
			return nil, 0, err
		}
	}
	return files, def, nil
}

func emptyIfOptional(ok bool, err error) (map[string]projFile, os.FileMode, error) {
	if err != nil {
		return nil, 0, err
	}
	// Optional and missing: an empty volume.
	return map[string]projFile{}, 0o644, nil
}

// writeProjection makes dir hold exactly files, atomically. It does
// nothing when the content is unchanged.
func writeProjection(dir string, files map[string]projFile, _ os.FileMode, group *int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if sameProjection(dir, files) {
		return nil
	}
	ts := "..tether_" + strconv.FormatInt(time.Now().UnixNano(), 10)
	tsDir := filepath.Join(dir, ts)
	if err := os.MkdirAll(tsDir, 0o755); err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		if strings.Contains(name, "..") || filepath.IsAbs(name) {
			return fmt.Errorf("path %q must be relative without '..'", name)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		f := files[name]
		path := filepath.Join(tsDir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, f.data, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(path, f.mode); err != nil {
			return err
		}
		if group != nil {
			_ = os.Chown(path, -1, int(*group))
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmpLink := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmpLink)
	if err := os.Symlink(ts, tmpLink); err != nil {
		return err
	}
	if err := os.Rename(tmpLink, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	// Top-level names link through ..data.
	top := map[string]bool{}
	for _, name := range names {
		top[strings.SplitN(name, "/", 2)[0]] = true
	}
	for name := range top {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join("..data", name) {
			continue
		}
		_ = os.RemoveAll(link)
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return err
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, "..") {
			if n != "..data" && n != ts && (n == old || strings.HasPrefix(n, "..tether_")) {
				_ = os.RemoveAll(filepath.Join(dir, n))
			}
			continue
		}
		if !top[n] {
			_ = os.RemoveAll(filepath.Join(dir, n))
		}
	}
	return nil
}

// sameProjection tells whether dir's current content is files.
func sameProjection(dir string, files map[string]projFile) bool {
	data := filepath.Join(dir, "..data")
	if _, err := os.Stat(data); err != nil {
		return false
	}
	count := 0
	err := filepath.WalkDir(data+"/", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		count++
		rel, _ := filepath.Rel(data, path)
		f, ok := files[rel]
		if !ok {
			return errors.New("extra")
		}
		st, err := os.Stat(path)
		if err != nil || st.Mode().Perm() != f.mode.Perm() {
			return errors.New("mode")
		}
		b, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(b, f.data) {
			return errors.New("data")
		}
		return nil
	})
	return err == nil && count == len(files)
}

// writeEtcFiles writes the pod's /etc/hosts, /etc/hostname and
// /etc/resolv.conf.
func (r *Runtime) writeEtcFiles(p *pod, pod *corev1.Pod, ips []netip.Addr) error {
	dir := filepath.Join(p.dir, "etc")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	host := podHostname(pod)
	var hosts strings.Builder
	hosts.WriteString("# Kubernetes-managed hosts file (tether).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n")
	for _, ip := range ips {
		names := host
		if pod.Spec.Subdomain != "" {
			names = fmt.Sprintf("%s.%s.%s.svc.%s\t%s", host, pod.Spec.Subdomain, pod.Namespace, r.cfg.ClusterDomain, host)
		}
		fmt.Fprintf(&hosts, "%s\t%s\n", ip, names)
	}
	if len(pod.Spec.HostAliases) > 0 {
		hosts.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range pod.Spec.HostAliases {
			fmt.Fprintf(&hosts, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	if err := writeFileAtomic(filepath.Join(dir, "hosts"), []byte(hosts.String()), 0o644); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, "hostname"), []byte(host+"\n"), 0o644); err != nil {
		return err
	}
	resolv, err := r.resolvConf(pod)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "resolv.conf"), []byte(resolv), 0o644)
}

// resolvConf computes the pod's resolv.conf from its dnsPolicy and
// dnsConfig, the way the kubelet does (dns.ResolvConf): ClusterFirst pods,
// and ClusterFirstWithHostNet ones on the host network, get ClusterDNS (the
// agent's node-local DNS server unless --cluster-dns overrides it), the
// search path "<ns>.svc.<domain> svc.<domain> <domain>" and ndots:5.
func (r *Runtime) resolvConf(pod *corev1.Pod) (string, error) {
	return resolvConfFor(pod, r.cfg.ClusterDNS, r.cfg.ClusterDomain, "/etc/resolv.conf")
}

// resolvConfFor renders a pod's resolv.conf with the node's resolver
// configuration read from hostPath.
func resolvConfFor(pod *corev1.Pod, clusterDNS []string, domain, hostPath string) (string, error) {
	var servers []netip.Addr
	for _, s := range clusterDNS {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return "", fmt.Errorf("cluster DNS address %q: %w", s, err)
		}
		servers = append(servers, a)
	}
	b, _ := os.ReadFile(hostPath)
	var host dns.HostResolvConf
	host.Nameservers, host.Searches, host.Options = parseResolv(string(b))
	return dns.ResolvConf(pod, servers, domain, host)
}

func parseResolv(s string) (servers, searches, options []string) {
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch f[0] {
		case "nameserver":
			servers = append(servers, f[1])
		case "search", "domain":
			searches = append(searches, f[1:]...)
		case "options":
			options = append(options, f[1:]...)
		}
	}
	return servers, searches, options
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// removePodDir unmounts the pod's memory-backed volumes and removes its
// directory.
func (r *Runtime) removePodDir(p *pod) error {
	vols, _ := os.ReadDir(filepath.Join(p.dir, "volumes"))
	for _, v := range vols {
		dir := filepath.Join(p.dir, "volumes", v.Name())
		for mounted(dir) {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				return fmt.Errorf("unmount volume %s: %w", v.Name(), err)
			}
		}
	}
	if err := os.RemoveAll(p.dir); err != nil {
		return fmt.Errorf("remove pod directory: %w", err)
	}
	return nil
}
