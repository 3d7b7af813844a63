package systemdtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
)

// Environment variables that turn a test binary into the supervisor or
// into its systemctl (see Main).
const (
	EnvSupervise = "TETHER_SYSTEMDTEST_SUPERVISE" // socket to serve on
	EnvUnitDir   = "TETHER_SYSTEMDTEST_UNIT_DIR"
	EnvCgroup    = "TETHER_SYSTEMDTEST_CGROUP"
	EnvLogDir    = "TETHER_SYSTEMDTEST_LOG_DIR"
	EnvSystemctl = "TETHER_SYSTEMDTEST_SYSTEMCTL" // socket to send commands to
)

type request struct {
	Args []string `json:"args"`
}

type response struct {
	Out  string `json:"out"`
	Code int    `json:"code"`
}

// Serve answers systemctl command lines on l until it is closed.
func (s *Supervisor) Serve(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			var req request
			if err := json.NewDecoder(c).Decode(&req); err != nil {
				return
			}
			out, code := s.Do(req.Args)
			_ = json.NewEncoder(c).Encode(response{Out: out, Code: code})
		}()
	}
}

// Systemctl sends one command line to the supervisor at socket, writes
// its output to w and returns its exit status.
func Systemctl(socket string, args []string, w io.Writer) int {
	c, err := net.Dial("unix", socket)
	if err != nil {
		fmt.Fprintf(w, "systemctl: reach the supervisor: %v\n", err)
		return 1
	}
	defer c.Close()
	if err := json.NewEncoder(c).Encode(request{Args: args}); err != nil {
		fmt.Fprintf(w, "systemctl: %v\n", err)
		return 1
	}
	var resp response
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		fmt.Fprintf(w, "systemctl: %v\n", err)
		return 1
	}
	_, _ = io.WriteString(w, resp.Out)
	return resp.Code
}

// Main lets a test binary be the supervisor or its systemctl; call it
// first in TestMain and exit with code when handled:
//
//   - with EnvSupervise set, it supervises the units of EnvUnitDir in
//     cgroups under EnvCgroup, logging to EnvLogDir, answering on the
//     socket EnvSupervise names until SIGTERM, then stops every unit
//     and kills what is left in their cgroups;
//   - with EnvSystemctl set, it is systemctl: it sends its arguments to
//     the supervisor at that socket.
func Main() (code int, handled bool) {
	if sock := os.Getenv(EnvSystemctl); sock != "" {
		return Systemctl(sock, os.Args[1:], os.Stdout), true
	}
	sock := os.Getenv(EnvSupervise)
	if sock == "" {
		return 0, false
	}
	s, err := New(Config{UnitDir: os.Getenv(EnvUnitDir), Cgroup: os.Getenv(EnvCgroup), LogDir: os.Getenv(EnvLogDir)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "supervisor:", err)
		return 1, true
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "supervisor:", err)
		return 1, true
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		l.Close()
	}()
	if err := s.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, "supervisor:", err)
	}
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "supervisor:", err)
		return 1, true
	}
	return 0, true
}
