package containerd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/vishvananda/netns"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
)

// runningInstance finds the running instance of a container.
func (r *Runtime) runningInstance(uid types.UID, container string) (*pod, *instance, error) {
	p := r.pod(uid)
	if p == nil {
		return nil, nil, fmt.Errorf("pod %s: %w", uid, edge.ErrPodNotFound)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cs := p.find(container)
	if cs == nil {
		return nil, nil, fmt.Errorf("container %q in pod %s: %w", container, p.key(), edge.ErrContainerNotFound)
	}
	if cs.cur == nil || !cs.cur.running || cs.cur.task == nil {
		return nil, nil, fmt.Errorf("container %q in pod %s is not running", container, p.key())
	}
	return p, cs.cur, nil
}

// Exec implements edge.Runtime.
func (r *Runtime) Exec(ctx context.Context, uid types.UID, container string, cmd []string, s edge.Streams) (int, error) {
	_, inst, err := r.runningInstance(uid, container)
	if err != nil {
		return 0, err
	}
	return r.execInstance(ctx, inst, cmd, s)
}

// execInstance runs cmd in the instance with the container's process
// settings (user, environment, working directory).
func (r *Runtime) execInstance(ctx context.Context, inst *instance, cmd []string, s edge.Streams) (int, error) {
	if len(cmd) == 0 {
		return 0, errors.New("exec: no command")
	}
	cont, err := r.client.LoadContainer(ctx, inst.id)
	if err != nil {
		return 0, fmt.Errorf("exec: load container: %w", err)
	}
	spec, err := cont.Spec(ctx)
	if err != nil {
		return 0, fmt.Errorf("exec: read container spec: %w", err)
	}
	ps := *spec.Process
	ps.Args = cmd
	ps.Terminal = s.TTY
	var b [8]byte
	_, _ = rand.Read(b[:])
	execID := "exec-" + hex.EncodeToString(b[:])
	// The shim keeps the stdin FIFO open for writing, so the end of the
	// client's input must be passed on with CloseIO.
	var stdin io.Reader
	stdinDone := make(chan struct{})
	if s.Stdin != nil {
		stdin = &eofReader{r: s.Stdin, done: stdinDone}
	}
	opts := []cio.Opt{cio.WithFIFODir(r.fifoDir), cio.WithStreams(stdin, orDiscard(s.Stdout), orDiscard(s.Stderr))}
	if s.TTY {
		opts = append(opts, cio.WithTerminal)
	}
	task := inst.task
	proc, err := task.Exec(ctx, execID, &ps, cio.NewCreator(opts...))
	if err != nil {
		return 0, fmt.Errorf("exec: %w", err)
	}
	bg := context.WithoutCancel(ctx)
	defer func() { _, _ = proc.Delete(bg, containerd.WithProcessKill) }()
	statusC, err := proc.Wait(bg)
	if err != nil {
		return 0, fmt.Errorf("exec: %w", err)
	}
	if err := proc.Start(ctx); err != nil {
		return 0, fmt.Errorf("exec: start: %w", err)
	}
	if s.TTY && s.Resize != nil {
		go func() {
			for sz := range s.Resize {
				_ = proc.Resize(bg, uint32(sz.Width), uint32(sz.Height))
			}
		}()
	}
	if stdin != nil {
		go func() {
			select {
			case <-stdinDone:
				_ = proc.CloseIO(bg, containerd.WithStdinCloser)
			case <-ctx.Done():
			}
		}()
	}
	select {
	case st := <-statusC:
		// All output is written before the exit code is reported.
		proc.IO().Wait()
		code, _, err := st.Result()
		if err != nil {
			return 0, fmt.Errorf("exec: %w", err)
		}
		return int(code), nil
	case <-ctx.Done():
		_ = proc.Kill(bg, 9)
		<-statusC
		return 0, fmt.Errorf("exec: %w", ctx.Err())
	}
}

// eofReader closes done when r reaches its end.
type eofReader struct {
	r    io.Reader
	done chan struct{}
	once sync.Once
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.once.Do(func() { close(e.done) })
	}
	return n, err
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return discard{}
	}
	return w
}

// Attach implements edge.Runtime.
func (r *Runtime) Attach(ctx context.Context, uid types.UID, container string, s edge.Streams) error {
	p, inst, err := r.runningInstance(uid, container)
	if err != nil {
		return err
	}
	p.mu.Lock()
	c := containerSpec(p.spec, container)
	p.mu.Unlock()
	a := &attachment{stdout: s.Stdout, stderr: s.Stderr}
	if s.TTY {
		a.stderr = nil
	}
	inst.logs.subscribe(a)
	defer inst.logs.unsubscribe(a)
	if s.Stdin != nil && inst.stdin != nil {
		go func() {
			_, _ = io.Copy(inst.stdin.w, s.Stdin)
			if c != nil && c.StdinOnce {
				inst.stdin.Close()
			}
		}()
	}
	if s.TTY && s.Resize != nil {
		go func() {
			for sz := range s.Resize {
				_ = inst.task.Resize(context.Background(), uint32(sz.Width), uint32(sz.Height))
			}
		}()
	}
	select {
	case <-ctx.Done():
	case <-inst.exited:
	}
	return nil
}

// PortForward implements edge.Runtime.
func (r *Runtime) PortForward(ctx context.Context, uid types.UID, port int32, conn io.ReadWriteCloser) error {
	p := r.pod(uid)
	if p == nil {
		return fmt.Errorf("pod %s: %w", uid, edge.ErrPodNotFound)
	}
	p.mu.Lock()
	nsPath := p.netnsPath
	p.mu.Unlock()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	var target net.Conn
	var err error
	if nsPath == "" {
		var d net.Dialer
		target, err = d.DialContext(ctx, "tcp", addr)
	} else {
		target, err = dialInNetns(ctx, nsPath, addr)
	}
	if err != nil {
		return fmt.Errorf("connect to port %d of pod %s: %w", port, p.key(), err)
	}
	defer target.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(target, conn)
		if tc, ok := target.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	_, err = io.Copy(conn, target)
	conn.Close()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("forward port %d of pod %s: %w", port, p.key(), err)
	}
	return nil
}

// dialInNetns connects from inside a network namespace: the socket is
// created on a thread that entered the namespace and keeps belonging to
// it afterwards.
func dialInNetns(ctx context.Context, nsPath, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// The thread is never unlocked: it dies with this goroutine
		// rather than run others in the pod's namespace.
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			ch <- result{err: err}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		ch <- result{c, err}
	}()
	res := <-ch
	return res.c, res.err
}
