package tunnel

import (
	"time"

	"golang.org/x/sys/unix"
)

const (
	ipprotoTCP    = unix.IPPROTO_TCP
	tcpCongestion = unix.TCP_CONGESTION
)

// setsockoptStringOS is the real setsockopt.
func setsockoptStringOS(fd, level, opt int, value string) error {
	return unix.SetsockoptString(fd, level, opt, value)
}

// congestionOf returns the congestion control of the TCP socket fd.
func congestionOf(fd int) string {
	s, err := unix.GetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	if err != nil {
		return ""
	}
	return s
}

func setUserTimeout(fd int, d time.Duration) {
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
}

// setMaxPacingRate caps the socket's pacing rate, in bytes per second.
func setMaxPacingRate(fd int, bytesPerSecond int64) {
	unix.SetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, uint64(bytesPerSecond))
}
