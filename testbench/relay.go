package testbench

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openTun attaches to the persistent tun device name inside the network
// namespace nsPath. The returned file stays bound to the device wherever
// the calling process lives.
func openTun(nsPath, name string) (*os.File, error) {
	runtime.LockOSThread()
	// The thread is left locked on purpose if restoring the namespace
	// fails, so the runtime discards it instead of reusing it.
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("open own netns: %w", err)
	}
	defer orig.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("open netns: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter netns: %w", err)
	}
	fd, openErr := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if openErr == nil {
		var req [unix.IFNAMSIZ + 64]byte
		copy(req[:], name)
		*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TUN | unix.IFF_NO_PI
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); e != 0 {
			unix.Close(fd)
			openErr = fmt.Errorf("attach tun %s: %w", name, e)
		}
	}
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("leave netns: %w", err)
	}
	runtime.UnlockOSThread()
	if openErr != nil {
		return nil, fmt.Errorf("open tun: %w", openErr)
	}
	// Non-blocking, the file uses the runtime poller, so Close interrupts
	// a pending Read.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open tun: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// DirStats counts what one direction of a link carried.
type DirStats struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
	Dropped uint64 `json:"dropped"`
}

// relay joins two tun devices and impairs the packets between them. Each
// direction has its own queue; parameters change atomically at run time.
type relay struct {
	params    atomic.Pointer[LinkParams]
	blockUp   atomic.Bool // site to hub
	blockDown atomic.Bool // hub to site
	up, down  *direction
	wg        sync.WaitGroup
}

type direction struct {
	r       *relay
	in, out *os.File
	block   *atomic.Bool
	mu      sync.Mutex
	cond    *sync.Cond
	kick    chan struct{} // wakes writeLoop when a packet that may be due earlier arrives
	q       pktHeap
	seq     uint64
	txDone  time.Time
	closed  bool
	packets atomic.Uint64
	bytes   atomic.Uint64
	dropped atomic.Uint64
	rng     *rand.Rand
}

type pkt struct {
	at   time.Time
	seq  uint64
	data []byte
	tx   time.Time // when the packet leaves the rate limiter
}

type pktHeap []*pkt

func (h pktHeap) Len() int { return len(h) }
func (h pktHeap) Less(i, j int) bool {
	if h[i].at.Equal(h[j].at) {
		return h[i].seq < h[j].seq
	}
	return h[i].at.Before(h[j].at)
}
func (h pktHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pktHeap) Push(x any)   { *h = append(*h, x.(*pkt)) }
func (h *pktHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	*h = old[:len(old)-1]
	return p
}

func newRelay(siteSide, hubSide *os.File, p LinkParams) *relay {
	r := &relay{}
	r.params.Store(&p)
	r.up = r.newDirection(siteSide, hubSide, &r.blockUp)
	r.down = r.newDirection(hubSide, siteSide, &r.blockDown)
	for _, d := range []*direction{r.up, r.down} {
		r.wg.Add(2)
		go d.readLoop()
		go d.writeLoop()
	}
	return r
}

func (r *relay) newDirection(in, out *os.File, block *atomic.Bool) *direction {
	d := &direction{r: r, in: in, out: out, block: block,
		rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	d.cond = sync.NewCond(&d.mu)
	d.kick = make(chan struct{}, 1)
	return d
}

func (r *relay) set(p LinkParams) { r.params.Store(&p) }

func (r *relay) close() {
	for _, d := range []*direction{r.up, r.down} {
		d.mu.Lock()
		d.closed = true
		d.cond.Broadcast()
		d.mu.Unlock()
	}
	// Closing the files unblocks the readers.
	r.up.in.Close()
	r.down.in.Close()
	r.wg.Wait()
}

func (d *direction) readLoop() {
	defer d.r.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, err := d.in.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			d.mu.Lock()
			closed := d.closed
			d.mu.Unlock()
			if closed {
				return
			}
			continue
		}
		d.packets.Add(1)
		d.bytes.Add(uint64(n))
		p := d.r.params.Load()
		if d.block.Load() || (p.Loss > 0 && d.rng.Float64() < p.Loss) {
			d.dropped.Add(1)
			continue
		}
		copies := 1
		if p.Duplicate > 0 && d.rng.Float64() < p.Duplicate {
			copies = 2
		}
		for range copies {
			d.enqueue(append([]byte(nil), buf[:n]...), p)
		}
	}
}

func (d *direction) enqueue(data []byte, p *LinkParams) {
	now := time.Now()
	limit := p.QueueLimit
	if limit == 0 {
		limit = 64 << 10
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	tx := now
	if p.Rate > 0 {
		if d.txDone.After(now) {
			tx = d.txDone
		}
		// Bytes still waiting for the limiter, estimated from its backlog.
		backlog := float64(tx.Sub(now)) / float64(time.Second) * float64(p.Rate) / 8
		if int(backlog)+len(data) > limit {
			d.dropped.Add(1)
			return
		}
		tx = tx.Add(time.Duration(float64(len(data)*8) / float64(p.Rate) * float64(time.Second)))
		d.txDone = tx
	}
	at := tx
	if !(p.Reorder > 0 && d.rng.Float64() < p.Reorder) {
		at = at.Add(time.Duration(p.Delay))
		if p.Jitter > 0 {
			at = at.Add(time.Duration(d.rng.Int64N(int64(p.Jitter))))
		}
	}
	d.seq++
	heap.Push(&d.q, &pkt{at: at, seq: d.seq, data: data, tx: tx})
	d.cond.Broadcast()
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

func (d *direction) writeLoop() {
	defer d.r.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		d.mu.Lock()
		for len(d.q) == 0 && !d.closed {
			d.cond.Wait()
		}
		if d.closed {
			d.mu.Unlock()
			return
		}
		next := d.q[0]
		wait := time.Until(next.at)
		if wait > 0 {
			d.mu.Unlock()
			// Sleep until the head is due or a new packet, which may be
			// due earlier, arrives.
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-d.kick:
				timer.Stop()
			}
			continue
		}
		heap.Pop(&d.q)
		d.mu.Unlock()
		if !d.block.Load() {
			d.out.Write(next.data) //nolint:errcheck // a failed write is a lost packet
		} else {
			d.dropped.Add(1)
		}
	}
}

func (d *direction) stats() DirStats {
	return DirStats{Packets: d.packets.Load(), Bytes: d.bytes.Load(), Dropped: d.dropped.Load()}
}
