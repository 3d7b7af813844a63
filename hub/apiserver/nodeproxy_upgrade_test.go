package apiserver

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// stoppedConn is the hub's end of a stream to an agent that, once it has
// answered an upgrade, stops reading: the hub's writes fail from then on,
// as a tunnel stream's do after the agent closed it, while what the agent
// wrote before is still on its way.
type stoppedConn struct {
	net.Conn
	stopped *atomic.Bool
}

func (c stoppedConn) Write(p []byte) (int, error) {
	if c.stopped.Load() {
		return 0, errors.New("stream reset by peer")
	}
	return c.Conn.Write(p)
}

// TestNodeProxyRelaysAfterAgentStopsReading checks that the hub relays an
// upgraded session's last bytes from the agent (the status an exec or
// attach ends with) even when the client wrote something after the agent
// had stopped reading. kubectl does: it closes its stdin stream at once,
// and an attach the runtime refuses ends just as fast.
func TestNodeProxyRelaysAfterAgentStopsReading(t *testing.T) {
	var stopped atomic.Bool
	agentDone := make(chan error, 1)
	dial := func(ctx context.Context, node string) (net.Conn, error) {
		hubEnd, agentEnd := net.Pipe()
		go func() {
			defer agentEnd.Close()
			req, err := http.ReadRequest(bufio.NewReader(agentEnd))
			if err != nil {
				agentDone <- err
				return
			}
			if req.Header.Get("Upgrade") != "SPDY/3.1" {
				agentDone <- errors.New("no upgrade reached the agent")
				return
			}
			stopped.Store(true)
			if _, err := io.WriteString(agentEnd, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n"); err != nil {
				agentDone <- err
				return
			}
			// The status comes after the client's write failed.
			time.Sleep(200 * time.Millisecond)
			_, err = io.WriteString(agentEnd, "final-status")
			agentDone <- err
		}()
		return stoppedConn{Conn: hubEnd, stopped: &stopped}, nil
	}
	h := newHubWith(t, func(c *Config) { c.DialNode = dial })
	ctx := context.Background()
	if _, err := h.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "one"}, Spec: corev1.PodSpec{NodeName: "n1",
		Containers: []corev1.Container{{Name: "app", Image: "img"}}}}
	if _, err := h.cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	conn, err := tls.Dial("tcp", strings.TrimPrefix(h.srv.URL, "https://"), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "POST /api/v1/namespaces/default/pods/one/attach?stdout=true HTTP/1.1\r\nHost: hub\r\n"+
		"Authorization: Bearer good\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answered %s", resp.Status)
	}
	// What kubectl sends at once (its stdin stream's end) meets an agent
	// that no longer reads.
	if _, err := io.WriteString(conn, "client-bytes"); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(br)
	if string(got) != "final-status" {
		t.Errorf("the client read %q (%v) after the upgrade, want the agent's \"final-status\"", got, err)
	}
	if err := <-agentDone; err != nil {
		t.Errorf("agent: %v", err)
	}
}
