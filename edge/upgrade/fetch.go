package upgrade

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// Download fetches a release's executable from the hub. A cut download
// resumes where it stopped (a Range request, with If-Range so that a
// changed file starts again), on the next attempt of the same Run or of a
// later one, since the partial file stays in Dir. When the hub has a delta
// from the running executable, that is what travels.
type Download struct {
	// Client reaches the hub; Base is its URL ("http://hub").
	Client *http.Client
	Base   string
	// Release is the release to fetch; its signature is the caller's to
	// check before.
	Release fleetapi.ReleaseSpec
	// Dir keeps partial and finished downloads.
	Dir string
	// From is the running executable and FromDigest its digest: the base
	// of a delta. Empty: the whole executable is fetched.
	From, FromDigest string
	// Limit caps the download in bytes per second; 0: no cap.
	Limit int64
	// Progress, when set, is called as bytes arrive with what is done of
	// the file being fetched (the delta or the executable) and its size
	// (0 when not known yet).
	Progress func(done, size int64, delta bool)
	// Retry is the first wait after a failed attempt (default 1s),
	// doubling up to 30s; attempts go on until ctx ends.
	Retry time.Duration
	Log   *slog.Logger
}

// Fetched says how a download went.
type Fetched struct {
	// Path is the verified executable, in Dir.
	Path string
	// Delta says a delta travelled; Size is the size of what travelled
	// (the delta or the executable).
	Delta bool
	Size  int64
	// Transferred counts the bytes this Run received, resumes included;
	// ResumedAt is the offset of the last resume (0: none).
	Transferred, ResumedAt int64
}

// errNoDelta: the hub has no delta from the running executable.
var errNoDelta = errors.New("the hub has no delta from this executable")

// errPermanent marks answers that retrying will not change.
type errPermanent struct{ error }

// Run fetches and verifies the executable (its size and digest against
// the release's). It returns an error only when ctx ended or the hub's
// answers say the release cannot be had.
func (d *Download) Run(ctx context.Context) (Fetched, error) {
	want, err := fleetapi.ParseDigest(d.Release.Digest)
	if err != nil {
		return Fetched{}, err
	}
	if err := os.MkdirAll(d.Dir, 0o700); err != nil {
		return Fetched{}, err
	}
	if d.Log == nil {
		d.Log = slog.Default()
	}
	final := filepath.Join(d.Dir, want)
	if ok, err := hasDigest(final, want); err == nil && ok {
		return Fetched{Path: final}, nil
	}
	var f Fetched
	if old, err := fleetapi.ParseDigest(d.FromDigest); err == nil && d.From != "" && old != want {
		f, err = d.viaDelta(ctx, want, old, final)
		if err == nil || ctx.Err() != nil {
			return f, err
		}
		d.Log.Info("upgrade download: fetching the whole executable", "why", err)
	}
	whole, err := d.viaWhole(ctx, want, final)
	whole.Transferred += f.Transferred
	return whole, err
}

func (d *Download) viaWhole(ctx context.Context, want, final string) (Fetched, error) {
	part := final + ".part"
	f := Fetched{Size: d.Release.Size}
	for {
		if err := d.resumable(ctx, fleetapi.DownloadPath(d.Release.Digest), part, false, &f); err != nil {
			return f, err
		}
		ok, err := hasDigest(part, want)
		if err != nil {
			return f, err
		}
		if ok {
			f.Path = final
			return f, os.Rename(part, final)
		}
		d.Log.Warn("upgrade download: the executable does not match its digest; fetching it again", "digest", d.Release.Digest)
		os.Remove(part)
		os.Remove(part + ".etag")
		if err := sleep(ctx, d.retry()); err != nil {
			return f, err
		}
	}
}

func (d *Download) viaDelta(ctx context.Context, want, old, final string) (Fetched, error) {
	part := filepath.Join(d.Dir, want+"-from-"+old+".zst")
	f := Fetched{Delta: true}
	path := fleetapi.DownloadPath(d.Release.Digest) + "?from=sha256:" + old
	if err := d.resumable(ctx, path, part, true, &f); err != nil {
		return f, err
	}
	defer os.Remove(part)
	defer os.Remove(part + ".etag")
	etag, _ := os.ReadFile(part + ".etag")
	if wantDelta, err := fleetapi.ParseDigest(strings.Trim(string(etag), `"`)); err == nil {
		if ok, err := hasDigest(part, wantDelta); err != nil || !ok {
			return f, fmt.Errorf("the delta does not match its digest")
		}
	}
	base, err := os.ReadFile(d.From)
	if err != nil {
		return f, fmt.Errorf("read the running executable: %w", err)
	}
	if sum := sha256.Sum256(base); hex.EncodeToString(sum[:]) != old {
		return f, fmt.Errorf("the running executable %s changed since it started", d.From)
	}
	in, err := os.Open(part)
	if err != nil {
		return f, err
	}
	defer in.Close()
	out, err := os.CreateTemp(d.Dir, ".decode-*")
	if err != nil {
		return f, err
	}
	defer os.Remove(out.Name())
	err = fleetapi.DecodeDelta(out, base, in, d.Release.Size)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return f, err
	}
	if ok, err := hasDigest(out.Name(), want); err != nil || !ok {
		return f, fmt.Errorf("the delta from %s does not give the release's digest", d.FromDigest)
	}
	f.Path = final
	return f, os.Rename(out.Name(), final)
}

// resumable fetches path into part, resuming from part's size, until the
// answer's body is complete.
func (d *Download) resumable(ctx context.Context, path, part string, delta bool, f *Fetched) error {
	var lim *rate.Limiter
	if d.Limit > 0 {
		lim = rate.NewLimiter(rate.Limit(d.Limit), int(min(d.Limit, 64<<10)))
	}
	wait := d.retry()
	fruitless := 0 // attempts in a row that brought nothing
	for {
		before := f.Transferred
		done, err := d.attempt(ctx, path, part, delta, lim, f)
		if done || ctx.Err() != nil {
			return err
		}
		var p errPermanent
		if errors.As(err, &p) {
			return p.error
		}
		if errors.Is(err, errNoDelta) {
			return err
		}
		if f.Transferred > before {
			fruitless = 0
		} else if fruitless++; delta && fruitless >= 3 {
			// A hub that keeps failing to give the delta (it could not
			// compute it, say) still has the executable.
			return fmt.Errorf("the hub did not give the delta in %d attempts: %w", fruitless, err)
		}
		d.Log.Info("upgrade download cut; resuming", "err", err, "in", wait)
		if err := sleep(ctx, wait); err != nil {
			return err
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// attempt makes one request; done says part holds the whole body.
func (d *Download) attempt(ctx context.Context, path, part string, delta bool, lim *rate.Limiter, f *Fetched) (bool, error) {
	file, err := os.OpenFile(part, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return false, err
	}
	defer file.Close()
	off, err := file.Seek(0, io.SeekEnd)
	if err != nil {
		return false, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.Base+path, nil)
	if err != nil {
		return false, errPermanent{err}
	}
	etag, _ := os.ReadFile(part + ".etag")
	if off > 0 && len(etag) > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(off, 10)+"-")
		req.Header.Set("If-Range", string(etag))
	}
	resp, err := d.Client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusPartialContent:
		start, total, ok := contentRange(resp.Header.Get("Content-Range"))
		if !ok || start != off {
			return false, fmt.Errorf("the hub answered the range from %d with %q", off, resp.Header.Get("Content-Range"))
		}
		f.ResumedAt, f.Size = off, total
		d.Log.Info("upgrade download resumed", "at", off, "of", total, "delta", delta)
	case http.StatusOK:
		if off > 0 {
			d.Log.Info("upgrade download starts again: the file changed on the hub", "had", off)
		}
		if err := file.Truncate(0); err != nil {
			return false, err
		}
		if _, err := file.Seek(0, io.SeekStart); err != nil {
			return false, err
		}
		off = 0
		f.Size = resp.ContentLength
		if err := writeFileSync(part+".etag", []byte(resp.Header.Get("ETag"))); err != nil {
			return false, err
		}
	case http.StatusRequestedRangeNotSatisfiable:
		// What we hold is as long as the file or longer: the caller's
		// digest check decides, and a bad file starts again.
		return true, nil
	case http.StatusNotFound:
		if delta {
			return false, errNoDelta
		}
		return false, errPermanent{fmt.Errorf("the hub does not hold the executable of %s (404)", d.Release.Digest)}
	case http.StatusUnauthorized, http.StatusForbidden:
		return false, errPermanent{fmt.Errorf("the hub refused the download: %s", resp.Status)}
	default:
		return false, fmt.Errorf("the hub answered %s", resp.Status)
	}
	buf := make([]byte, 32<<10)
	if lim != nil {
		buf = buf[:min(len(buf), lim.Burst())]
	}
	got := off
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if lim != nil {
				if err := lim.WaitN(ctx, n); err != nil {
					return false, err
				}
			}
			if _, err := file.Write(buf[:n]); err != nil {
				return false, err
			}
			got += int64(n)
			f.Transferred += int64(n)
			if d.Progress != nil {
				d.Progress(got, f.Size, delta)
			}
		}
		if rerr == io.EOF {
			if f.Size > 0 && got != f.Size {
				return false, fmt.Errorf("the download ended at %d of %d bytes", got, f.Size)
			}
			return true, file.Sync()
		}
		if rerr != nil {
			// Keep what came: the next attempt resumes after it.
			_ = file.Sync()
			return false, rerr
		}
	}
}

func (d *Download) retry() time.Duration {
	if d.Retry > 0 {
		return d.Retry
	}
	return time.Second
}

// contentRange parses "bytes START-END/TOTAL".
func contentRange(h string) (start, total int64, ok bool) {
	r, found := strings.CutPrefix(h, "bytes ")
	if !found {
		return 0, 0, false
	}
	span, size, found := strings.Cut(r, "/")
	first, _, found2 := strings.Cut(span, "-")
	if !found || !found2 {
		return 0, 0, false
	}
	s, err1 := strconv.ParseInt(first, 10, 64)
	t, err2 := strconv.ParseInt(size, 10, 64)
	return s, t, err1 == nil && err2 == nil
}

// hasDigest reports whether the file at path has the SHA-256 wantHex.
func hasDigest(path, wantHex string) (bool, error) {
	d, err := FileDigest(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil && d == "sha256:"+wantHex, err
}

// writeFileSync writes a small file durably.
func writeFileSync(path string, b []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Clean removes from dir every download but the one of keepDigest
// ("sha256:HEX"; "" keeps none): finished ones once staged, partial ones
// of releases no longer wanted.
func Clean(dir, keepDigest string) {
	keep, _ := fleetapi.ParseDigest(keepDigest)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if keep != "" && strings.HasPrefix(e.Name(), keep) {
			continue
		}
		os.Remove(filepath.Join(dir, e.Name()))
	}
}
