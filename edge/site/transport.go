package site

import (
	"errors"
	"fmt"
	"log"
	"net"
	"sync"
	"syscall"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

// transport is the site's memberlist transport: UDP packets and TCP
// streams on one address and port, as memberlist's NetTransport, which it
// replaces for one reason. NetTransport reads every packet into a fresh
// 64 KiB buffer, so a member receiving its twenty or so packets a second
// allocated and cleared over a megabyte a second at rest, and the
// garbage collector's work for it was the largest part of an idle
// gossiping agent's CPU. transport reads into one buffer and hands
// memberlist a copy of the packet's own size.
type transport struct {
	udp     *net.UDPConn
	tcp     *net.TCPListener
	log     *log.Logger
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

// udpReadBuffer is the socket receive buffer asked for (halved until the
// kernel accepts), as NetTransport does, so that a burst of gossip is not
// dropped while the member is busy.
const udpReadBuffer = 2 << 20

// maxPacket is the largest UDP payload.
const maxPacket = 65536

// newTransport listens on addr (an IP) and port; port 0 takes a free port
// for TCP and the same for UDP.
func newTransport(addr string, port int, logger *log.Logger) (*transport, error) {
	ip := net.ParseIP(addr)
	if ip == nil {
		return nil, fmt.Errorf("site gossip bind address %q is not an IP", addr)
	}
	// A port the kernel chose for TCP may be held for UDP: with port 0
	// another is tried, a few times, as memberlist's own transport does.
	tries := 1
	if port == 0 {
		tries = 10
	}
	var tcp *net.TCPListener
	var udp *net.UDPConn
	for try := 1; ; try++ {
		var err error
		tcp, udp, err = listenPair(ip, port)
		if err == nil {
			break
		}
		if try == tries || !errors.Is(err, syscall.EADDRINUSE) {
			return nil, err
		}
	}
	for size := udpReadBuffer; size > 0; size /= 2 {
		if udp.SetReadBuffer(size) == nil {
			break
		}
	}
	t := &transport{udp: udp, tcp: tcp, log: logger,
		packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), done: make(chan struct{})}
	t.wg.Add(2)
	go t.readPackets()
	go t.acceptStreams()
	return t, nil
}

// listenPair listens for TCP on ip and port, and for UDP on the same
// port.
func listenPair(ip net.IP, port int) (*net.TCPListener, *net.UDPConn, error) {
	tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: port})
	if err != nil {
		return nil, nil, fmt.Errorf("listen for site gossip streams: %w", err)
	}
	port = tcp.Addr().(*net.TCPAddr).Port
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
	if err != nil {
		_ = tcp.Close()
		return nil, nil, fmt.Errorf("listen for site gossip packets: %w", err)
	}
	return tcp, udp, nil
}

// port is the port listened on.
func (t *transport) port() int { return t.tcp.Addr().(*net.TCPAddr).Port }

// FinalAdvertiseAddr is the address given, or else the one listened on,
// or for a wildcard a private address of the host, as NetTransport.
func (t *transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if ip == "" {
		bound := t.tcp.Addr().(*net.TCPAddr).IP
		if !bound.IsUnspecified() {
			return bound, t.port(), nil
		}
		private, err := sockaddr.GetPrivateIP()
		if err != nil {
			return nil, 0, fmt.Errorf("site gossip advertise address: %w", err)
		}
		if private == "" {
			return nil, 0, errors.New("site gossip listens on every address and the host has no private address: an advertise address is required")
		}
		ip, port = private, t.port()
	}
	a := net.ParseIP(ip)
	if a == nil {
		return nil, 0, fmt.Errorf("site gossip advertise address %q is not an IP", ip)
	}
	if a4 := a.To4(); a4 != nil {
		a = a4
	}
	return a, port, nil
}

func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return time.Time{}, err
	}
	_, err = t.udp.WriteTo(b, ua)
	return time.Now(), err
}

func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", addr)
}

func (t *transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes the sockets and waits for the readers; what they hold
// is dropped.
func (t *transport) Shutdown() error {
	t.once.Do(func() {
		close(t.done)
		_ = t.tcp.Close()
		_ = t.udp.Close()
	})
	t.wg.Wait()
	return nil
}

func (t *transport) closed() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

func (t *transport) readPackets() {
	defer t.wg.Done()
	buf := make([]byte, maxPacket)
	for {
		n, from, err := t.udp.ReadFrom(buf)
		now := time.Now()
		if err != nil {
			if t.closed() {
				return
			}
			t.log.Printf("[ERR] site gossip: read packet: %v", err)
			continue
		}
		if n == 0 {
			continue
		}
		p := &memberlist.Packet{Buf: append([]byte(nil), buf[:n]...), From: from, Timestamp: now}
		select {
		case t.packets <- p:
		case <-t.done:
			return
		}
	}
}

func (t *transport) acceptStreams() {
	defer t.wg.Done()
	delay := time.Duration(0)
	for {
		c, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.closed() {
				return
			}
			// Out of descriptors or the like: back off, up to a second.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.log.Printf("[ERR] site gossip: accept stream: %v", err)
			select {
			case <-time.After(delay):
			case <-t.done:
				return
			}
			continue
		}
		delay = 0
		select {
		case t.streams <- c:
		case <-t.done:
			_ = c.Close()
			return
		}
	}
}
