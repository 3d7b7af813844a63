package tunnel

import (
	"net"
	"syscall"
	"time"
)

// socket is what QUIC reads and writes: c itself over a kernel socket, and
// c without SyscallConn over any other net.PacketConn (one that
// ClientConfig.ListenPacket returned), since quic-go refuses a conn whose
// SyscallConn fails.
func (c *fecConn) socket() net.PacketConn {
	if _, ok := c.pc.(syscall.Conn); ok {
		return c
	}
	return plainFECConn{c}
}

// plainFECConn is a fecConn that does not offer SyscallConn.
type plainFECConn struct{ c *fecConn }

func (p plainFECConn) ReadFrom(b []byte) (int, net.Addr, error)  { return p.c.ReadFrom(b) }
func (p plainFECConn) WriteTo(b []byte, a net.Addr) (int, error) { return p.c.WriteTo(b, a) }
func (p plainFECConn) Close() error                              { return p.c.Close() }
func (p plainFECConn) LocalAddr() net.Addr                       { return p.c.LocalAddr() }
func (p plainFECConn) SetDeadline(t time.Time) error             { return p.c.SetDeadline(t) }
func (p plainFECConn) SetReadDeadline(t time.Time) error         { return p.c.SetReadDeadline(t) }
func (p plainFECConn) SetWriteDeadline(t time.Time) error        { return p.c.SetWriteDeadline(t) }
func (p plainFECConn) SetReadBuffer(n int) error                 { return p.c.SetReadBuffer(n) }
func (p plainFECConn) SetWriteBuffer(n int) error                { return p.c.SetWriteBuffer(n) }
