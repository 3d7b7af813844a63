package containerd

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"
)

// A container's output reaches the agent through FIFOs that its shim
// writes. containerd's own copy (cio.WithStreams) keeps a 32 KiB buffer per
// stream for the life of the container, 64 KiB per container that most of
// the time waits for output that does not come. The copy here reads only
// once the FIFO is readable (through the runtime's poller), with a buffer
// taken from a pool for that read: a quiet container costs no buffer.

// outputBufs are the read buffers of container output; outputBufsHeld
// counts those taken.
var (
	outputBufs     = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
	outputBufsHeld atomic.Int64
)

func getOutputBuf() *[]byte {
	outputBufsHeld.Add(1)
	return outputBufs.Get().(*[]byte)
}

func putOutputBuf(b *[]byte) {
	outputBufs.Put(b)
	outputBufsHeld.Add(-1)
}

// stdinBuf is the buffer of the copy to a container's stdin, which waits
// on the attached client and holds it meanwhile (few containers have
// stdin).
const stdinBuf = 4 << 10

// taskIO returns the IO creator of a container's task: stdin (when in is
// not nil) from in, output to out and errw (only out with a terminal).
func taskIO(fifoDir string, in io.Reader, out, errw io.Writer, tty bool) cio.Creator {
	return func(id string) (cio.IO, error) {
		fifos, err := cio.NewFIFOSetInDir(fifoDir, id, tty)
		if err != nil {
			return nil, err
		}
		return copyTaskIO(fifos, in, out, errw)
	}
}

// attachTaskIO is taskIO for the FIFOs of a task that runs already (a
// container adopted after an agent restart).
func attachTaskIO(in io.Reader, out, errw io.Writer) cio.Attach {
	return func(fifos *cio.FIFOSet) (cio.IO, error) {
		if fifos == nil {
			return nil, errors.New("attach to task: no FIFOs")
		}
		return copyTaskIO(fifos, in, out, errw)
	}
}

// copyTaskIO opens the FIFOs and copies between them and the streams, as
// cio.NewCreator and cio.NewAttach do with cio.WithStreams.
func copyTaskIO(fifos *cio.FIFOSet, in io.Reader, out, errw io.Writer) (cio.IO, error) {
	if in == nil {
		fifos.Stdin = ""
	}
	d, err := cio.NewDirectIO(context.Background(), fifos)
	if err != nil {
		return nil, err
	}
	t := &copiedIO{DirectIO: d}
	if d.Stdin != nil {
		go func() {
			_, _ = io.CopyBuffer(d.Stdin, in, make([]byte, stdinBuf))
			d.Stdin.Close()
		}()
	}
	if d.Stdout != nil {
		t.wg.Go(func() { copyOutput(out, d.Stdout) })
	}
	if d.Stderr != nil {
		t.wg.Go(func() { copyOutput(errw, d.Stderr) })
	}
	return t, nil
}

// copiedIO is a DirectIO whose output the agent copies.
type copiedIO struct {
	*cio.DirectIO
	wg sync.WaitGroup
}

// Wait waits until the output copies ended.
func (t *copiedIO) Wait() { t.wg.Wait() }

// Cancel stops opening the FIFOs and the copies, as cio's copy does.
func (t *copiedIO) Cancel() {
	t.DirectIO.Cancel()
	for _, c := range []io.Closer{t.Stdin, t.Stdout, t.Stderr} {
		if c != nil {
			c.Close()
		}
	}
}

// outputDrain bounds how long an exit waits for the container's last
// output. The shim copies it from the process to the FIFO after the exit
// was reported, and closes the FIFO at the end; only a process left
// holding the output open (a daemonized child in a shared PID namespace)
// makes the copy last longer.
const outputDrain = 2 * time.Second

// drainOutput waits up to d for the output copies of an exited task to
// reach the end of its output, then stops them. Stopping them first
// (Cancel closes the FIFOs) loses what the shim still held: often the last
// lines of a crashing container, the ones its user reads.
func drainOutput(tio cio.IO, d time.Duration) {
	done := make(chan struct{})
	go func() {
		tio.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	tio.Cancel()
}

// copyOutput copies the output read from the FIFO r to w until the writer
// closes it or r is closed, holding a buffer only for each read.
func copyOutput(w io.Writer, r io.ReadCloser) {
	defer r.Close()
	var rc syscall.RawConn
	if sc, ok := r.(syscall.Conn); ok {
		rc, _ = sc.SyscallConn()
	}
	if rc == nil {
		b := getOutputBuf()
		defer putOutputBuf(b)
		_, _ = io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{r}, *b)
		return
	}
	for {
		var (
			buf  *[]byte
			n    int
			rerr error
		)
		err := rc.Read(func(fd uintptr) bool {
			buf = getOutputBuf()
			for {
				n, rerr = syscall.Read(int(fd), *buf)
				if rerr != syscall.EINTR {
					break
				}
			}
			if rerr == syscall.EAGAIN {
				putOutputBuf(buf)
				buf = nil
				return false // wait until readable
			}
			return true
		})
		if buf != nil {
			if n > 0 {
				_, _ = w.Write((*buf)[:n])
			}
			putOutputBuf(buf)
		}
		if err != nil || rerr != nil || n <= 0 {
			return // closed, failed, or end of output
		}
	}
}
