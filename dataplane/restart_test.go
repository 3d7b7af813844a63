package dataplane

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestRestartKeepsTraffic closes the Dataplane (the agent stops) and starts
// a new one on the same pins: an established connection and a stream of new
// connections keep working before, during and after, and the adopted state
// needs no rewrite.
func TestRestartKeepsTraffic(t *testing.T) {
	l := newSockLab(t)
	serveTCP(t, l.be, 8080)
	web := service("web", "10.214.100.1", svcPort("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
	ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
	slice := epSlice("web-1", "web", ports,
		readyEP(labBackends[0], "node-a"), readyEP(labBackends[1], "node-a"), readyEP(labBackends[2], "node-a"))
	l.dp.UpsertService(web)
	l.dp.UpsertEndpointSlice(slice)

	// An established connection through the ClusterIP.
	var conn net.Conn
	var rd *bufio.Reader
	err := l.cli.Do(func() error {
		var err error
		conn, err = net.DialTimeout("tcp", "10.214.100.1:80", 2*time.Second)
		if err != nil {
			return err
		}
		rd = bufio.NewReader(conn)
		_, err = rd.ReadString('\n')
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echo := func(msg string) {
		t.Helper()
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Write([]byte(msg + "\n")); err != nil {
			t.Fatalf("established connection broke: %v", err)
		}
		got, err := rd.ReadString('\n')
		if err != nil || got != msg+"\n" {
			t.Fatalf("established connection broke: %q, %v", got, err)
		}
	}
	echo("before")

	stop := make(chan struct{})
	h := startHammer(t, l.cli, "10.214.100.1:80", stop)
	time.Sleep(100 * time.Millisecond)

	if err := l.dp.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	l.dp = nil
	okAtClose, _, _ := h.counts()
	time.Sleep(300 * time.Millisecond) // the agent is down
	okDown, _, _ := h.counts()
	echo("while down")

	dp2, err := New(l.cfg)
	if err != nil {
		t.Fatalf("New after restart: %v", err)
	}
	l.dp = dp2
	if n := dp2.frontendCount(); n != 1 {
		t.Fatalf("adopted %d frontends, want 1", n)
	}
	dp2.UpsertService(web)
	dp2.UpsertEndpointSlice(slice)
	if err := dp2.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if dp2.lastFull.writes != 0 || dp2.lastFull.deletes != 0 {
		t.Fatalf("resync after restart rewrote state: %+v", dp2.lastFull)
	}
	time.Sleep(100 * time.Millisecond)
	echo("after")

	// The new agent programs changes.
	dp2.UpsertEndpointSlice(epSlice("web-1", "web", ports, readyEP(labBackends[0], "node-a")))
	got := countBackends(t, dialN(l.cli, "10.214.100.1:80", 20))
	if got[labBackends[0]] != 20 {
		t.Fatalf("change after restart not applied: %v", got)
	}

	close(stop)
	<-h.done
	ok, fail, lastErr := h.counts()
	if fail != 0 {
		t.Fatalf("%d of %d connections failed across the restart; last: %v", fail, ok+fail, lastErr)
	}
	if okDown-okAtClose < 10 {
		t.Fatalf("only %d connections while the agent was down", okDown-okAtClose)
	}
	t.Logf("%d connections across the restart, %d while the agent was down, 0 failed", ok, okDown-okAtClose)
}
