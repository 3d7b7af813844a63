//go:build !linux

package tunnel

import (
	"errors"
	"time"
)

// Outside Linux a lane keeps the kernel's congestion control.
const (
	ipprotoTCP    = 0
	tcpCongestion = 0
)

func setsockoptStringOS(fd, level, opt int, value string) error {
	return errors.New("per-socket congestion control needs Linux")
}

func congestionOf(int) string { return "" }

func setUserTimeout(int, time.Duration) {}

func setMaxPacingRate(int, int64) {}
