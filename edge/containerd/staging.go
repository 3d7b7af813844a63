package containerd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/imageshare"
)

// labelStaged marks images an ImageStaging names: garbage collection
// keeps them while the mark stays (SetStaged).
const labelStaged = "io.tether.image.staged"

// maxReportedImages is how many images the node reports, the largest
// first, as the kubelet's nodeStatusMaxImages.
const maxReportedImages = 50

// shareLease is how long a blob pulled through for the site's members is
// kept without an image referring to it.
const shareLease = time.Hour

var (
	_ edge.ImageStager   = (*Runtime)(nil)
	_ edge.ContentSharer = (*Runtime)(nil)
)

// ContentShare lends the site's image sharing containerd's content store,
// leases and registries (without pods' pull secrets).
func (r *Runtime) ContentShare() imageshare.Backend {
	return imageshare.Backend{
		Store: r.client.ContentStore(),
		Lease: func(ctx context.Context) (context.Context, func(context.Context) error, error) {
			return r.client.WithLease(ctx, leases.WithExpiration(shareLease))
		},
		Registry: func(ctx context.Context, ref string) (remotes.Fetcher, error) {
			return r.resolver(ctx, nil).Fetcher(ctx, ref)
		},
	}
}

// UseShare makes pulls fetch blobs through s: from the site's members
// first.
func (r *Runtime) UseShare(s *imageshare.Sharer) { r.share.Store(s) }

// sharing wraps a pull's resolver: blob fetches go through the site's
// members when the node shares content, and are capped at limit bytes per
// second.
func (r *Runtime) sharing(res remotes.Resolver, limit int64) remotes.Resolver {
	s := r.share.Load()
	if s == nil && limit <= 0 {
		return res
	}
	return sharingResolver{Resolver: res, share: s, limit: limit}
}

type sharingResolver struct {
	remotes.Resolver
	share *imageshare.Sharer
	limit int64
}

func (s sharingResolver) Fetcher(ctx context.Context, ref string) (remotes.Fetcher, error) {
	f, err := s.Resolver.Fetcher(ctx, ref)
	if err != nil {
		return nil, err
	}
	if s.share == nil {
		return imageshare.LimitFetcher(f, s.limit), nil
	}
	return s.share.Fetcher(f, ref, s.limit), nil
}

// StageImage pulls image unless the node holds it, at most limit bytes
// per second (0: no cap), unpacks it, and marks it staged. It reports
// whether it pulled.
func (r *Runtime) StageImage(ctx context.Context, image string, limit int64) (bool, error) {
	ref, err := normalizeImage(image)
	if err != nil {
		return false, err
	}
	pulled := false
	img, err := r.client.GetImage(ctx, ref)
	switch {
	case errdefs.IsNotFound(err):
		began := time.Now()
		if img, err = r.pull(ctx, nil, ref, limit); err != nil {
			return false, err
		}
		pulled = true
		size, _ := img.Size(ctx)
		r.log.Info("staged image", "image", ref, "bytes", size, "took", time.Since(began).Round(time.Millisecond))
	case err != nil:
		return false, fmt.Errorf("look up image %s: %w", ref, err)
	default:
		if img, err = r.unpacked(ctx, img); err != nil {
			return false, err
		}
	}
	return pulled, r.mark(ctx, img.Metadata(), true)
}

// mark sets or clears an image's staged label.
func (r *Runtime) mark(ctx context.Context, img images.Image, staged bool) error {
	if (img.Labels[labelStaged] != "") == staged {
		return nil
	}
	if img.Labels == nil {
		img.Labels = map[string]string{}
	}
	if staged {
		img.Labels[labelStaged] = "true"
	} else {
		delete(img.Labels, labelStaged)
	}
	if _, err := r.client.ImageService().Update(ctx, img, "labels."+labelStaged); err != nil {
		return fmt.Errorf("mark image %s: %w", img.Name, err)
	}
	return nil
}

// SetStaged marks the images of refs staged and clears the mark of the
// others, which garbage collection may then remove.
func (r *Runtime) SetStaged(ctx context.Context, refs []string) error {
	want := map[string]bool{}
	for _, im := range refs {
		if ref, err := normalizeImage(im); err == nil {
			want[ref] = true
		}
	}
	list, err := r.client.ImageService().List(ctx)
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	for _, img := range list {
		if staged := img.Labels[labelStaged] != ""; staged && !want[img.Name] {
			if err := r.mark(ctx, img, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// Images lists the images the node holds as the kubelet reports them in
// status.images: one entry per image (its names), with its size, the
// largest first, at most 50.
func (r *Runtime) Images(ctx context.Context) ([]corev1.ContainerImage, error) {
	list, err := r.client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	byTarget := map[string]*corev1.ContainerImage{}
	var out []*corev1.ContainerImage
	for _, img := range list {
		if strings.HasPrefix(img.Name, "sha256:") {
			continue
		}
		key := img.Target.Digest.String()
		if e, ok := byTarget[key]; ok {
			e.Names = append(e.Names, img.Name)
			continue
		}
		e := &corev1.ContainerImage{Names: []string{img.Name}, SizeBytes: r.imageSize(ctx, img)}
		byTarget[key] = e
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *corev1.ContainerImage) int {
		if a.SizeBytes != b.SizeBytes {
			if a.SizeBytes > b.SizeBytes {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Names[0], b.Names[0])
	})
	if len(out) > maxReportedImages {
		out = out[:maxReportedImages]
	}
	res := make([]corev1.ContainerImage, len(out))
	for i, e := range out {
		slices.Sort(e.Names)
		res[i] = *e
	}
	return res, nil
}

// imageSize is the image's size for this platform (compressed, as pulled),
// cached by its target digest: an image's size never changes.
func (r *Runtime) imageSize(ctx context.Context, img images.Image) int64 {
	key := img.Target.Digest.String()
	r.mu.Lock()
	size, ok := r.imageSizes[key]
	r.mu.Unlock()
	if ok {
		return size
	}
	size, err := containerd.NewImageWithPlatform(r.client, img, platformMatcher()).Size(ctx)
	if err != nil {
		return 0
	}
	r.mu.Lock()
	r.imageSizes[key] = size
	r.mu.Unlock()
	return size
}
