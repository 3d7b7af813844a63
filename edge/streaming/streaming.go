package streaming

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"
)

// The node server speaks SPDY for exec, attach and port-forward, as the
// kubelet does. kubectl tries WebSocket first; the server answers that
// attempt with 400 (never 101), which makes kubectl fall back to SPDY.

// Remote command protocol versions served over SPDY, newest first. v4
// reports the exit code as a Status on the error stream; v3 adds the
// resize stream; v2 is the oldest still spoken.
const (
	remoteCommandV4 = "v4.channel.k8s.io"
	remoteCommandV3 = "v3.channel.k8s.io"
	remoteCommandV2 = "v2.channel.k8s.io"
	portForwardV1   = "portforward.k8s.io"
)

// streamCreationTimeout bounds how long the client has to open its
// streams after the upgrade.
const streamCreationTimeout = 30 * time.Second

func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// refuseWebSocket answers a WebSocket upgrade with a plain error so that
// the client falls back to SPDY.
func refuseWebSocket(w http.ResponseWriter) {
	http.Error(w, "websocket streaming is not supported by this node; use SPDY", http.StatusBadRequest)
}

func (s *nodeServer) findPod(w http.ResponseWriter, ns, name string) *corev1.Pod {
	for _, p := range s.cfg.Pods() {
		if p.Namespace == ns && p.Name == name {
			return p
		}
	}
	http.Error(w, fmt.Sprintf("pod %s/%s is not on this node", ns, name), http.StatusNotFound)
	return nil
}

// remoteCommandStreams are the streams of one exec or attach session.
type remoteCommandStreams struct {
	conn     httpstream.Connection
	protocol string
	stdin    httpstream.Stream
	stdout   httpstream.Stream
	stderr   httpstream.Stream
	errorS   httpstream.Stream
	resize   httpstream.Stream
}

type remoteCommandOptions struct {
	stdin, stdout, stderr, tty bool
}

func parseRemoteCommand(r *http.Request) (remoteCommandOptions, error) {
	q := r.URL.Query()
	b := func(name string) bool {
		v, _ := strconv.ParseBool(q.Get(name))
		return v
	}
	o := remoteCommandOptions{stdin: b("stdin") || b("input"), stdout: b("stdout") || b("output"), stderr: b("stderr") || b("error"), tty: b("tty")}
	if o.tty && o.stderr {
		// A terminal has one output stream.
		o.stderr = false
	}
	if !o.stdin && !o.stdout && !o.stderr {
		return o, errors.New("you must specify at least one of stdin, stdout, stderr")
	}
	return o, nil
}

// upgradeRemoteCommand negotiates the protocol, upgrades the connection
// and waits for the client's streams.
func upgradeRemoteCommand(w http.ResponseWriter, r *http.Request, o remoteCommandOptions) (*remoteCommandStreams, bool) {
	protocol, err := httpstream.Handshake(r, w, []string{remoteCommandV4, remoteCommandV3, remoteCommandV2})
	if err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return nil, false
	}
	streams := make(chan httpstream.Stream, 8)
	conn := spdy.NewResponseUpgraderWithPings(15*time.Second).UpgradeResponse(w, r, func(st httpstream.Stream, replySent <-chan struct{}) error {
		go func() {
			<-replySent
			streams <- st
		}()
		return nil
	})
	if conn == nil {
		return nil, false
	}
	conn.SetIdleTimeout(4 * time.Hour)
	rc := &remoteCommandStreams{conn: conn, protocol: protocol}
	want := 1 // error
	if o.stdin {
		want++
	}
	if o.stdout {
		want++
	}
	if o.stderr {
		want++
	}
	if o.tty && protocol != remoteCommandV2 {
		want++
	}
	timeout := time.After(streamCreationTimeout)
	for got := 0; got < want; {
		select {
		case st := <-streams:
			switch st.Headers().Get(corev1.StreamType) {
			case corev1.StreamTypeError:
				rc.errorS = st
			case corev1.StreamTypeStdin:
				rc.stdin = st
			case corev1.StreamTypeStdout:
				rc.stdout = st
			case corev1.StreamTypeStderr:
				rc.stderr = st
			case corev1.StreamTypeResize:
				rc.resize = st
			default:
				st.Reset()
				continue
			}
			got++
		case <-timeout:
			conn.Close()
			return nil, false
		case <-conn.CloseChan():
			return nil, false
		}
	}
	return rc, true
}

func (rc *remoteCommandStreams) streams(tty bool) (Streams, func()) {
	var s Streams
	if rc.stdin != nil {
		s.Stdin = rc.stdin
	}
	if rc.stdout != nil {
		s.Stdout = rc.stdout
	}
	if rc.stderr != nil {
		s.Stderr = rc.stderr
	}
	s.TTY = tty
	stop := func() {}
	if tty && rc.resize != nil {
		ch := make(chan TermSize, 4)
		done := make(chan struct{})
		go func() {
			defer close(ch)
			dec := json.NewDecoder(rc.resize)
			for {
				var size struct{ Width, Height uint16 }
				if err := dec.Decode(&size); err != nil {
					return
				}
				select {
				case ch <- TermSize{Width: size.Width, Height: size.Height}:
				case <-done:
					return
				}
			}
		}()
		s.Resize = ch
		var once sync.Once
		stop = func() { once.Do(func() { close(done) }) }
	}
	return s, stop
}

// finish reports the outcome on the error stream and closes the session.
func (rc *remoteCommandStreams) finish(code int, err error) {
	if rc.errorS != nil {
		switch {
		case rc.protocol == remoteCommandV4:
			st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess}
			if err != nil {
				st = metav1.Status{TypeMeta: st.TypeMeta, Status: metav1.StatusFailure, Message: err.Error(), Reason: metav1.StatusReasonInternalError, Code: http.StatusInternalServerError}
			} else if code != 0 {
				st = metav1.Status{
					TypeMeta: st.TypeMeta, Status: metav1.StatusFailure, Reason: "NonZeroExitCode",
					Message: fmt.Sprintf("command terminated with non-zero exit code: exit status %d", code),
					Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "ExitCode", Message: strconv.Itoa(code)}}},
				}
			}
			b, _ := json.Marshal(st)
			_, _ = rc.errorS.Write(b)
		case err != nil:
			_, _ = io.WriteString(rc.errorS, err.Error())
		case code != 0:
			_, _ = io.WriteString(rc.errorS, fmt.Sprintf("command terminated with non-zero exit code: exit status %d", code))
		}
		rc.errorS.Close()
	}
	for _, st := range []httpstream.Stream{rc.stdout, rc.stderr} {
		if st != nil {
			st.Close()
		}
	}
	rc.conn.Close()
}

func (s *nodeServer) exec(w http.ResponseWriter, r *http.Request) {
	s.remoteCommand(w, r, true)
}

func (s *nodeServer) attach(w http.ResponseWriter, r *http.Request) {
	s.remoteCommand(w, r, false)
}

func (s *nodeServer) remoteCommand(w http.ResponseWriter, r *http.Request, isExec bool) {
	if isWebSocket(r) {
		refuseWebSocket(w)
		return
	}
	ns, name, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	cmd := r.URL.Query()["command"]
	if isExec && len(cmd) == 0 {
		http.Error(w, "no command given", http.StatusBadRequest)
		return
	}
	o, err := parseRemoteCommand(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	pod := s.findPod(w, ns, name)
	if pod == nil {
		return
	}
	rc, ok := upgradeRemoteCommand(w, r, o)
	if !ok {
		return
	}
	streams, stop := rc.streams(o.tty)
	defer stop()
	// The session ends when the client goes away, not with the request
	// context of a hijacked connection.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-rc.conn.CloseChan():
			cancel()
		case <-ctx.Done():
		}
	}()
	var code int
	if isExec {
		code, err = s.cfg.Runtime.Exec(ctx, pod.UID, container, cmd, streams)
	} else {
		err = s.cfg.Runtime.Attach(ctx, pod.UID, container, streams)
	}
	if err != nil {
		s.cfg.Logger.Debug("remote command", "pod", ns+"/"+name, "container", container, "exec", isExec, "err", err)
	}
	rc.finish(code, err)
}

// portForward serves kubectl port-forward: the client opens a data and an
// error stream per connection, paired by their requestID header.
func (s *nodeServer) portForward(w http.ResponseWriter, r *http.Request) {
	if isWebSocket(r) {
		refuseWebSocket(w)
		return
	}
	pod := s.findPod(w, r.PathValue("namespace"), r.PathValue("pod"))
	if pod == nil {
		return
	}
	if _, err := httpstream.Handshake(r, w, []string{portForwardV1}); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	streams := make(chan httpstream.Stream, 16)
	conn := spdy.NewResponseUpgraderWithPings(15*time.Second).UpgradeResponse(w, r, func(st httpstream.Stream, replySent <-chan struct{}) error {
		if st.Headers().Get(corev1.PortHeader) == "" {
			return errors.New("stream has no port header")
		}
		go func() {
			<-replySent
			streams <- st
		}()
		return nil
	})
	if conn == nil {
		return
	}
	defer conn.Close()
	conn.SetIdleTimeout(4 * time.Hour)
	type pair struct {
		data, errS httpstream.Stream
		created    time.Time
	}
	pairs := map[string]*pair{}
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-conn.CloseChan():
			return
		case <-tick.C:
			for id, p := range pairs {
				if time.Since(p.created) > streamCreationTimeout {
					if p.data != nil {
						p.data.Reset()
					}
					if p.errS != nil {
						p.errS.Reset()
					}
					delete(pairs, id)
				}
			}
		case st := <-streams:
			id := st.Headers().Get(corev1.PortForwardRequestIDHeader)
			p := pairs[id]
			if p == nil {
				p = &pair{created: time.Now()}
				pairs[id] = p
			}
			switch st.Headers().Get(corev1.StreamType) {
			case corev1.StreamTypeError:
				p.errS = st
			case corev1.StreamTypeData:
				p.data = st
			default:
				st.Reset()
				continue
			}
			if p.data == nil || p.errS == nil {
				continue
			}
			delete(pairs, id)
			go s.forwardOne(pod, p.data, p.errS)
		}
	}
}

func (s *nodeServer) forwardOne(pod *corev1.Pod, data, errS httpstream.Stream) {
	defer errS.Close()
	port, err := strconv.ParseUint(data.Headers().Get(corev1.PortHeader), 10, 16)
	if err != nil || port == 0 {
		_, _ = fmt.Fprintf(errS, "invalid port %q", data.Headers().Get(corev1.PortHeader))
		data.Reset()
		return
	}
	if err := s.cfg.Runtime.PortForward(context.Background(), pod.UID, int32(port), data); err != nil {
		_, _ = fmt.Fprintf(errS, "error forwarding port %d to pod %s: %v", port, pod.Name, err)
		data.Reset()
		return
	}
	data.Close()
}
