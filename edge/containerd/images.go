package containerd

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
)

// Image errors, reported as the container's waiting reason.
var (
	errImageNeverPull = errors.New("ErrImageNeverPull")
	errImagePull      = errors.New("ErrImagePull")
	errInvalidImage   = errors.New("InvalidImageName")
)

// normalizeImage turns a pod's image into the full reference containerd
// stores (nginx → docker.io/library/nginx:latest).
func normalizeImage(image string) (string, error) {
	named, err := reference.ParseDockerRef(image)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %v", errInvalidImage, image, err)
	}
	return named.String(), nil
}

// ImportArchive imports the OCI or Docker image archive at path into the
// containerd at address (namespace tether) and unpacks its images. It
// returns the names of the imported images.
func ImportArchive(ctx context.Context, address, path string) ([]string, error) {
	c, err := containerd.New(address, containerd.WithDefaultNamespace(Namespace))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", address, err)
	}
	defer c.Close()
	return importArchive(ctx, c, path, "")
}

func importArchive(ctx context.Context, c *containerd.Client, path, snapshotter string) ([]string, error) {
	// Ending the context ends the content streams the import leaves open.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("import image archive: %w", err)
	}
	defer f.Close()
	imgs, err := c.Import(ctx, f, containerd.WithImportPlatform(platformMatcher()), containerd.WithSkipDigestRef(func(string) bool { return true }))
	if err != nil {
		return nil, fmt.Errorf("import image archive %s: %w", path, err)
	}
	var names []string
	for _, img := range imgs {
		i := containerd.NewImageWithPlatform(c, img, platformMatcher())
		if err := i.Unpack(ctx, snapshotter); err != nil {
			return names, fmt.Errorf("unpack image %s: %w", img.Name, err)
		}
		// Imported images may have no registry to come back from: image
		// garbage collection leaves them alone.
		if img.Labels == nil {
			img.Labels = map[string]string{}
		}
		img.Labels[labelPinned] = "true"
		if _, err := c.ImageService().Update(ctx, img, "labels."+labelPinned); err != nil {
			return names, fmt.Errorf("pin image %s: %w", img.Name, err)
		}
		names = append(names, img.Name)
	}
	return names, nil
}

// importDir imports every archive in dir whose images are missing. It is
// how air-gapped sites get images: drop tarballs into <data-dir>/images.
func (r *Runtime) importDir(ctx context.Context) {
	entries, err := os.ReadDir(r.cfg.ImageDir)
	if err != nil {
		if !os.IsNotExist(err) {
			r.log.Warn("read image directory", "dir", r.cfg.ImageDir, "err", err)
		}
		return
	}
	for _, e := range entries {
		if e.IsDir() || !(strings.HasSuffix(e.Name(), ".tar") || strings.HasSuffix(e.Name(), ".tar.gz") || strings.HasSuffix(e.Name(), ".tgz")) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		// An archive already imported at this size and time is skipped:
		// importing is cheap but not free at every start.
		stamp := fmt.Sprintf("%d-%d", info.Size(), info.ModTime().UnixNano())
		mark := filepath.Join(r.stateDir, "imported", e.Name())
		if b, err := os.ReadFile(mark); err == nil && string(b) == stamp {
			continue
		}
		names, err := importArchive(ctx, r.client, filepath.Join(r.cfg.ImageDir, e.Name()), r.cfg.Snapshotter)
		if err != nil {
			r.log.Warn("import image archive", "file", e.Name(), "err", err)
			continue
		}
		_ = os.MkdirAll(filepath.Dir(mark), 0o700)
		_ = os.WriteFile(mark, []byte(stamp), 0o600)
		r.log.Info("imported images", "file", e.Name(), "images", names)
	}
}

// ensureImage returns the image a container runs, pulling it when the
// pull policy says so.
func (r *Runtime) ensureImage(ctx context.Context, p *pod, cs *ctr, pod *corev1.Pod, c *corev1.Container) (containerd.Image, error) {
	ref, err := normalizeImage(c.Image)
	if err != nil {
		return nil, err
	}
	policy := c.ImagePullPolicy
	if policy == "" {
		policy = corev1.PullIfNotPresent
		if strings.HasSuffix(ref, ":latest") {
			policy = corev1.PullAlways
		}
	}
	img, err := r.client.GetImage(ctx, ref)
	if err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("look up image %s: %w", ref, err)
	}
	if err == nil && policy != corev1.PullAlways {
		r.event(p, cs, false, "Pulled", "Container image %q already present on machine", c.Image)
		return r.unpacked(ctx, img)
	}
	if policy == corev1.PullNever {
		return nil, fmt.Errorf("%w: container image %q is not present with pull policy of Never", errImageNeverPull, c.Image)
	}
	r.event(p, cs, false, "Pulling", "Pulling image %q", c.Image)
	began := time.Now()
	pulled, perr := r.pull(ctx, pod, ref, 0)
	if perr != nil {
		r.event(p, cs, true, "Failed", "Failed to pull image %q: %v", c.Image, perr)
		if img != nil {
			// Offline with the image at hand: run what we have.
			r.log.Warn("pull image; using the local copy", "image", ref, "err", perr)
			return r.unpacked(ctx, img)
		}
		return nil, perr
	}
	size, _ := pulled.Size(ctx)
	r.event(p, cs, false, "Pulled", "Successfully pulled image %q in %v. Image size: %d bytes.", c.Image, time.Since(began).Round(time.Millisecond), size)
	return pulled, nil
}

func (r *Runtime) unpacked(ctx context.Context, img containerd.Image) (containerd.Image, error) {
	img = containerd.NewImageWithPlatform(r.client, img.Metadata(), platformMatcher())
	ok, err := img.IsUnpacked(ctx, r.cfg.Snapshotter)
	if err != nil {
		return nil, fmt.Errorf("check image %s: %w", img.Name(), err)
	}
	if !ok {
		if err := img.Unpack(ctx, r.cfg.Snapshotter); err != nil {
			return nil, fmt.Errorf("unpack image %s: %w", img.Name(), err)
		}
	}
	return img, nil
}

// pull fetches ref from its registry with the pod's pull secrets (none
// without a pod), blobs from the site's members first when the node
// shares content, at most limit bytes per second (0: no cap).
func (r *Runtime) pull(ctx context.Context, pod *corev1.Pod, ref string, limit int64) (containerd.Image, error) {
	// Ending the context ends the content streams the pull leaves open.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var creds map[string]credential
	if pod != nil {
		creds = r.pullCredentials(pod)
	}
	img, err := r.client.Pull(ctx, ref, containerd.WithResolver(r.sharing(r.resolver(ctx, creds), limit)), containerd.WithPullUnpack,
		containerd.WithPlatformMatcher(platformMatcher()), containerd.WithPullSnapshotter(r.cfg.Snapshotter))
	if err != nil {
		return nil, fmt.Errorf("%w: pull %s: %v", errImagePull, ref, err)
	}
	return img, nil
}

// resolver reaches registries with creds, by host.
func (r *Runtime) resolver(ctx context.Context, creds map[string]credential) remotes.Resolver {
	// Registry hosts are configured as containerd's CRI does: an optional
	// <dir>/<host>/hosts.toml (mirrors, plain HTTP, CA and client
	// certificates); without one, HTTPS, except that a registry on a
	// loopback address with a port may answer plain HTTP.
	hostDir := r.cfg.RegistryConfigDir
	if hostDir == "" {
		hostDir = "/etc/containerd/certs.d"
	}
	return docker.NewResolver(docker.ResolverOptions{
		Hosts: config.ConfigureHosts(ctx, config.HostOptions{
			HostDir: config.HostDirFromRoot(hostDir),
			Credentials: func(host string) (string, string, error) {
				if c, ok := creds[host]; ok {
					return c.user, c.pass, nil
				}
				if host == "registry-1.docker.io" {
					if c, ok := creds["docker.io"]; ok {
						return c.user, c.pass, nil
					}
				}
				return "", "", nil
			},
		}),
	})
}

type credential struct{ user, pass string }

// pullCredentials reads the pod's kubernetes.io/dockerconfigjson and
// dockercfg pull secrets, by registry host.
func (r *Runtime) pullCredentials(pod *corev1.Pod) map[string]credential {
	out := map[string]credential{}
	src := r.sources()
	if src == nil {
		return out
	}
	for _, ps := range pod.Spec.ImagePullSecrets {
		s, err := src.Secret(pod.Namespace, ps.Name)
		if err != nil {
			r.log.Warn("read image pull secret", "pod", pod.Namespace+"/"+pod.Name, "secret", ps.Name, "err", err)
			continue
		}
		var auths map[string]struct {
			Username, Password, Auth string
		}
		if b, ok := s.Data[corev1.DockerConfigJsonKey]; ok {
			var cfg struct {
				Auths map[string]struct{ Username, Password, Auth string } `json:"auths"`
			}
			if json.Unmarshal(b, &cfg) == nil {
				auths = map[string]struct{ Username, Password, Auth string }{}
				for k, v := range cfg.Auths {
					auths[k] = v
				}
			}
		} else if b, ok := s.Data[corev1.DockerConfigKey]; ok {
			_ = json.Unmarshal(b, &auths)
		}
		for host, a := range auths {
			host = strings.TrimPrefix(strings.TrimPrefix(host, "https://"), "http://")
			host = strings.SplitN(host, "/", 2)[0]
			c := credential{user: a.Username, pass: a.Password}
			if a.Auth != "" {
				if raw, err := base64.StdEncoding.DecodeString(a.Auth); err == nil {
					if u, p, ok := strings.Cut(string(raw), ":"); ok {
						c = credential{user: u, pass: p}
					}
				}
			}
			if host == "index.docker.io" {
				host = "docker.io"
			}
			out[host] = c
		}
	}
	return out
}

// imageReason maps an image error to the container's waiting reason.
func imageReason(err error) string {
	for _, e := range []error{errImageNeverPull, errImagePull, errInvalidImage} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return "CreateContainerError"
}

var _ = edge.ErrNotSupported
