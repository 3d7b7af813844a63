package dataplane

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

// TestMasquerade: connections of the node's pods to addresses beyond the
// node leave the uplink with the node's address, with no iptables rule,
// and their replies find the pod again: TCP, UDP, ICMP echoes, and ICMP
// errors about the pod's packets. A closed
// connection's port is taken again once its last packets are past.
func TestMasquerade(t *testing.T) {
	l := newNPLab(t, "")
	serveTCP(t, l.client, 8080)
	serveUDPEcho(t, l.client, npClientIP+":8053")

	// Without masquerading the client has no way back to the pod.
	err := l.pod.Do(func() error {
		_, err := net.DialTimeout("tcp", npClientIP+":8080", 300*time.Millisecond)
		return err
	})
	if err == nil {
		t.Fatal("the pod reached the client without masquerading: the lab routes pod addresses")
	}

	if err := l.dp.SetMasquerade(netip.MustParsePrefix("10.214.3.0/24")); err != nil {
		t.Fatal(err)
	}
	t.Run("TCP", func(t *testing.T) {
		for _, r := range dialN(l.pod, npClientIP+":8080", 20) {
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.client != npNodeIP || r.peer != npClientIP+":8080" {
				t.Fatalf("the client saw %s (want the node, %s); the pod's peer is %s", r.client, npNodeIP, r.peer)
			}
		}
	})
	t.Run("UDP", func(t *testing.T) {
		err := l.pod.Do(func() error {
			c, err := net.Dial("udp4", npClientIP+":8053")
			if err != nil {
				return err
			}
			defer c.Close()
			for range 3 {
				c.SetDeadline(time.Now().Add(2 * time.Second))
				if _, err := c.Write([]byte("ping")); err != nil {
					return err
				}
				buf := make([]byte, 64)
				n, err := c.Read(buf)
				if err != nil {
					return err
				}
				if string(buf[:n]) != "ping from "+npNodeIP {
					return errors.New("unexpected UDP reply " + string(buf[:n]))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Ping", func(t *testing.T) {
		err := l.pod.Do(func() error {
			c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
			if err != nil {
				return err
			}
			defer c.Close()
			for seq := range 3 {
				req := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: seq, Data: []byte("tether")}}
				b, err := req.Marshal(nil)
				if err != nil {
					return err
				}
				if _, err := c.WriteTo(b, &net.IPAddr{IP: net.ParseIP(npClientIP)}); err != nil {
					return err
				}
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				for {
					buf := make([]byte, 1500)
					n, from, err := c.ReadFrom(buf)
					if err != nil {
						return err
					}
					m, err := icmp.ParseMessage(1, buf[:n])
					if err != nil {
						return err
					}
					if e, ok := m.Body.(*icmp.Echo); ok && m.Type == ipv4.ICMPTypeEchoReply && e.Seq == seq {
						if from.String() != npClientIP || e.ID != os.Getpid()&0xffff {
							return errors.New("echo reply from " + from.String() + " with another id")
						}
						break
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ICMPErrorReachesPod", func(t *testing.T) {
		// Nothing listens on the client's UDP port 9: its port
		// unreachable comes back to the pod's connected socket.
		err := l.pod.Do(func() error {
			c, err := net.Dial("udp4", npClientIP+":9")
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write([]byte("anyone?")); err != nil {
				return err
			}
			_, err = c.Read(make([]byte, 16))
			return err
		})
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("read after writing to a closed port: %v, want connection refused", err)
		}
	})
	t.Run("PortTakenAgainAfterClose", func(t *testing.T) {
		// One port: a second connection to the same peer waits until
		// the first one's closing packets are past.
		l.dp.mu.Lock()
		l.dp.cfg.SNATPortMin, l.dp.cfg.SNATPortMax = 61000, 61000
		l.dp.mu.Unlock()
		if err := l.dp.SetMasquerade(netip.MustParsePrefix("10.214.3.0/24")); err != nil {
			t.Fatal(err)
		}
		// The earlier connections to this peer hold ports of the wider
		// range; these go to another port of it.
		serveTCP(t, l.client, 8081)
		if r := dialN(l.pod, npClientIP+":8081", 1)[0]; r.err != nil || r.client != npNodeIP {
			t.Fatalf("first connection: %+v", r)
		}
		closed := time.Now()
		err := l.pod.Do(func() error {
			_, err := net.DialTimeout("tcp", npClientIP+":8081", 500*time.Millisecond)
			return err
		})
		if err == nil {
			t.Fatal("a second connection got the only port while the first one was closing")
		}
		time.Sleep(time.Until(closed.Add(11 * time.Second)))
		if r := dialN(l.pod, npClientIP+":8081", 1)[0]; r.err != nil || r.client != npNodeIP {
			t.Fatalf("connection after the closed one's port was free again: %+v", r)
		}
	})
	st, err := l.dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Masqueraded < 22 || st.MasqueradeDropped == 0 {
		t.Errorf("stats: %d connections masqueraded (want 22 or more), %d packets dropped (want some)", st.Masqueraded, st.MasqueradeDropped)
	}
	t.Logf("stats: %+v", st)
}
