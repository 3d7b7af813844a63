package imageshare

import (
	"context"
	"errors"
	"io"

	"github.com/containerd/containerd/v2/core/remotes"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/time/rate"
)

var errNoRegistry = errors.New("no registry to pull through from")

// limitBurst is the most a capped reader reads at once.
const limitBurst = 32 << 10

// limitReader caps r at limit bytes per second; limit 0 leaves it be.
func limitReader(ctx context.Context, r io.ReadCloser, limit int64) io.ReadCloser {
	if limit <= 0 {
		return r
	}
	burst := limitBurst
	if int64(burst) > limit {
		burst = int(limit)
	}
	return &limitedReader{ctx: ctx, r: r, l: rate.NewLimiter(rate.Limit(limit), burst), burst: burst}
}

type limitedReader struct {
	ctx   context.Context
	r     io.ReadCloser
	l     *rate.Limiter
	burst int
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if len(p) > l.burst {
		p = p[:l.burst]
	}
	n, err := l.r.Read(p)
	if n > 0 {
		if werr := l.l.WaitN(l.ctx, n); werr != nil && err == nil {
			err = werr
		}
	}
	return n, err
}

func (l *limitedReader) Close() error { return l.r.Close() }

// LimitFetcher caps what f fetches at limit bytes per second (0: no cap):
// the bandwidth cap of pulls that no site shares.
func LimitFetcher(f remotes.Fetcher, limit int64) remotes.Fetcher {
	if limit <= 0 {
		return f
	}
	return limitedFetcher{f, limit}
}

type limitedFetcher struct {
	f     remotes.Fetcher
	limit int64
}

func (l limitedFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	rc, err := l.f.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	return limitReader(ctx, rc, l.limit), nil
}
