package containerd

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"golang.org/x/sys/unix"
)

// labelPinned marks images that garbage collection keeps whatever the
// disk says: those imported from archives, which an air-gapped node could
// not get back.
const labelPinned = "io.tether.image.pinned"

// diskUsage reports how full, in percent, the file system holding path is.
func diskUsage(path string) (int, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	if st.Blocks == 0 {
		return 0, nil
	}
	used := st.Blocks - st.Bfree
	// As df counts: the blocks reserved for root are not available.
	avail := used + st.Bavail
	return int((used*100 + avail - 1) / avail), nil
}

// imageGCLoop collects unused images whenever the disk of containerd's
// content store is fuller than the high threshold, as the kubelet does.
func (r *Runtime) imageGCLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.ImageGCInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if r.isClosing() {
			return
		}
		if removed, err := r.collectImages(ctx); err != nil {
			r.log.Warn("image garbage collection", "err", err)
		} else if len(removed) > 0 {
			r.log.Info("image garbage collection removed unused images", "images", removed)
		}
	}
}

// collectImages removes images no container uses, least recently used
// first, while the disk is fuller than the low threshold; it does nothing
// below the high threshold. Pinned images and staged ones are kept.
func (r *Runtime) collectImages(ctx context.Context) ([]string, error) {
	usage, err := diskUsage(r.cfg.ImageGCPath)
	if err != nil {
		return nil, fmt.Errorf("disk usage of %s: %w", r.cfg.ImageGCPath, err)
	}
	if usage < r.cfg.ImageGCHighThresholdPercent {
		return nil, nil
	}
	conts, err := r.client.Containers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	inUse := map[string]bool{}
	for _, c := range conts {
		if info, err := c.Info(ctx); err == nil {
			inUse[info.Image] = true
		}
	}
	list, err := r.client.ImageService().List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	r.mu.Lock()
	lastUsed := func(img images.Image) time.Time {
		if t, ok := r.imageUsed[img.Name]; ok {
			return t
		}
		return img.UpdatedAt
	}
	var candidates []images.Image
	for _, img := range list {
		if !inUse[img.Name] && img.Labels[labelPinned] == "" && img.Labels[labelStaged] == "" {
			candidates = append(candidates, img)
		}
	}
	sort.Slice(candidates, func(i, j int) bool { return lastUsed(candidates[i]).Before(lastUsed(candidates[j])) })
	r.mu.Unlock()
	var removed []string
	for _, img := range candidates {
		if usage < r.cfg.ImageGCLowThresholdPercent {
			break
		}
		// Synchronous: the content is gone from disk before the next
		// measurement.
		if err := r.client.ImageService().Delete(ctx, img.Name, images.SynchronousDelete()); err != nil {
			r.log.Warn("remove unused image", "image", img.Name, "err", err)
			continue
		}
		removed = append(removed, img.Name)
		r.mu.Lock()
		delete(r.imageUsed, img.Name)
		r.mu.Unlock()
		if usage, err = diskUsage(r.cfg.ImageGCPath); err != nil {
			return removed, err
		}
	}
	return removed, nil
}
