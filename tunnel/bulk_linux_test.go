package tunnel

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// getMaxPacingRate reads SO_MAX_PACING_RATE, in bytes per second.
func getMaxPacingRate(fd int) (uint64, error) {
	return unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE)
}

// TestBulkLanePacingCap: BulkMaxRate caps the pacing rate of the edge's
// lane socket.
func TestBulkLanePacingCap(t *testing.T) {
	p := newPKI(t)
	h := startHub(t, p, ServerConfig{}, 0, nil)
	socks := make(chan net.Conn, 4)
	c := startClient(t, p, h.addr, "n1", func(c *ClientConfig) {
		c.BulkMaxRate = 80_000_000
		c.DialTCP = func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				socks <- conn
			}
			return conn, err
		}
	})
	waitConnected(t, c, 5*time.Second)
	echo := echoServer(t)
	hc, err := h.srv.Dial(bulkCtx(), "n1", "tcp:"+echo)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	echoCheck(t, hc, "paced")
	rc, err := (<-socks).(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var rate uint64
	var gerr error
	rc.Control(func(fd uintptr) { rate, gerr = getMaxPacingRate(int(fd)) })
	if gerr != nil || rate != 10_000_000 {
		t.Fatalf("lane socket's pacing cap %d bytes/s (%v), want 10000000", rate, gerr)
	}
}
