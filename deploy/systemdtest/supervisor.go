package systemdtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config of a Supervisor.
type Config struct {
	// UnitDir is where unit files are read, and where enable puts its
	// <target>.wants/ links.
	UnitDir string
	// Cgroup is a cgroup v2 directory, created, under which each unit
	// gets a cgroup of its own.
	Cgroup string
	// LogDir gets each unit's standard output and error in UNIT.log.
	LogDir string
}

// Supervisor runs the units of a unit directory.
type Supervisor struct {
	cfg   Config
	start time.Time

	mu     sync.Mutex
	loaded map[string]*Unit
	svcs   map[string]*service
}

// service is a unit's running state.
type service struct {
	unit     *Unit // as loaded when it last started
	cgroup   string
	pid      int
	running  bool // a main process is alive
	wanted   bool // started and not stopped
	failed   bool
	restarts int
	started  time.Duration // since the supervisor started, at the last start
	exited   chan struct{} // closed when the main process exits
}

// New makes the supervisor's cgroup and loads the units.
func New(cfg Config) (*Supervisor, error) {
	if err := os.MkdirAll(cfg.Cgroup, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return nil, err
	}
	s := &Supervisor{cfg: cfg, start: time.Now(), svcs: map[string]*service{}}
	if err := s.reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// reload reads the unit files again (daemon-reload). Running services
// keep running with what they were started with.
func (s *Supervisor) reload() error {
	ents, err := os.ReadDir(s.cfg.UnitDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	loaded := map[string]*Unit{}
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".service") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.cfg.UnitDir, e.Name()))
		if err != nil {
			return err
		}
		u, err := ParseUnit(e.Name(), b)
		if err != nil {
			return err
		}
		loaded[e.Name()] = u
	}
	s.mu.Lock()
	s.loaded = loaded
	s.mu.Unlock()
	return nil
}

// Do runs one systemctl command line and returns its output and exit
// status, as systemctl would.
func (s *Supervisor) Do(args []string) (string, int) {
	var verb string
	var units []string
	now, value := false, false
	var props []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--now":
			now = true
		case a == "--value":
			value = true
		case a == "-q" || a == "--quiet" || a == "--no-block":
		case a == "-p" || a == "--property":
			if i+1 < len(args) {
				props = append(props, strings.Split(args[i+1], ",")...)
				i++
			}
		case strings.HasPrefix(a, "-"):
			return fmt.Sprintf("unknown option %s\n", a), 1
		case verb == "":
			verb = a
		default:
			units = append(units, a)
		}
	}
	var err error
	var out strings.Builder
	switch verb {
	case "daemon-reload":
		err = s.reload()
	case "enable", "disable", "start", "stop", "restart", "try-restart":
		for _, u := range units {
			if err = s.unitVerb(verb, u, now); err != nil {
				break
			}
		}
	case "is-active", "is-enabled":
		code := 0
		for _, u := range units {
			st := s.state(u, verb == "is-enabled")
			fmt.Fprintln(&out, st)
			if st != "active" && st != "enabled" {
				code = 3
			}
		}
		return out.String(), code
	case "show":
		for _, u := range units {
			s.show(&out, u, props, value)
		}
		return out.String(), 0
	default:
		return fmt.Sprintf("unknown command %q\n", verb), 1
	}
	if err != nil {
		return err.Error() + "\n", 1
	}
	return out.String(), 0
}

func (s *Supervisor) unit(name string) (*Unit, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.loaded[name]
	if !ok {
		return nil, fmt.Errorf("unit %s not found", name)
	}
	return u, nil
}

func (s *Supervisor) unitVerb(verb, name string, now bool) error {
	switch verb {
	case "enable":
		u, err := s.unit(name)
		if err != nil {
			return err
		}
		for _, t := range u.WantedBy {
			dir := filepath.Join(s.cfg.UnitDir, t+".wants")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			link := filepath.Join(dir, name)
			if _, err := os.Lstat(link); err == nil {
				continue
			}
			if err := os.Symlink(filepath.Join(s.cfg.UnitDir, name), link); err != nil {
				return err
			}
		}
		if now {
			return s.startUnit(name)
		}
	case "disable":
		if now {
			if err := s.stopUnit(name); err != nil {
				return err
			}
		}
		links, _ := filepath.Glob(filepath.Join(s.cfg.UnitDir, "*.wants", name))
		for _, l := range links {
			if err := os.Remove(l); err != nil {
				return err
			}
			_ = os.Remove(filepath.Dir(l)) // when empty
		}
	case "start":
		return s.startUnit(name)
	case "stop":
		return s.stopUnit(name)
	case "restart":
		if err := s.stopUnit(name); err != nil {
			return err
		}
		return s.startUnit(name)
	case "try-restart":
		if s.state(name, false) != "active" {
			return nil
		}
		if err := s.stopUnit(name); err != nil {
			return err
		}
		return s.startUnit(name)
	}
	return nil
}

func (s *Supervisor) state(name string, enabled bool) string {
	if enabled {
		links, _ := filepath.Glob(filepath.Join(s.cfg.UnitDir, "*.wants", name))
		if len(links) > 0 {
			return "enabled"
		}
		if _, err := s.unit(name); err != nil {
			return "not-found"
		}
		return "disabled"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sv := s.svcs[name]
	switch {
	case sv == nil:
		return "inactive"
	case sv.running || sv.wanted:
		return "active"
	case sv.failed:
		return "failed"
	}
	return "inactive"
}

// show prints systemd's properties MainPID, ActiveState, UnitFileState,
// NRestarts and ExecMainStartTimestampMonotonic (microseconds since the
// supervisor started).
func (s *Supervisor) show(w io.Writer, name string, props []string, value bool) {
	s.mu.Lock()
	sv := s.svcs[name]
	m := map[string]string{"MainPID": "0", "NRestarts": "0", "ExecMainStartTimestampMonotonic": "0"}
	if sv != nil {
		if sv.running {
			m["MainPID"] = strconv.Itoa(sv.pid)
		}
		m["NRestarts"] = strconv.Itoa(sv.restarts)
		m["ExecMainStartTimestampMonotonic"] = strconv.FormatInt(sv.started.Microseconds(), 10)
	}
	s.mu.Unlock()
	m["ActiveState"] = s.state(name, false)
	m["UnitFileState"] = s.state(name, true)
	if len(props) == 0 {
		for k := range m {
			props = append(props, k)
		}
		sort.Strings(props)
	}
	for _, p := range props {
		if value {
			fmt.Fprintln(w, m[p])
		} else {
			fmt.Fprintf(w, "%s=%s\n", p, m[p])
		}
	}
}

// startUnit starts a unit's ExecStart in the unit's cgroup, unless it
// runs.
func (s *Supervisor) startUnit(name string) error {
	u, err := s.unit(name)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sv := s.svcs[name]
	if sv != nil && sv.running {
		sv.wanted = true
		return nil
	}
	if sv == nil {
		sv = &service{cgroup: filepath.Join(s.cfg.Cgroup, name)}
		s.svcs[name] = sv
	}
	sv.unit, sv.wanted, sv.failed = u, true, false
	return s.spawn(name, sv)
}

// spawn starts the main process; s.mu is held.
func (s *Supervisor) spawn(name string, sv *service) error {
	if err := os.MkdirAll(sv.cgroup, 0o755); err != nil {
		return fmt.Errorf("create the cgroup of %s: %w", name, err)
	}
	cg, err := os.Open(sv.cgroup)
	if err != nil {
		return err
	}
	defer cg.Close()
	logf, err := os.OpenFile(filepath.Join(s.cfg.LogDir, name+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	argv := sv.unit.ExecStart
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = logf, logf
	// A session of its own, and born in the unit's cgroup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	if err := cmd.Start(); err != nil {
		sv.failed, sv.wanted = true, false
		return fmt.Errorf("start %s: %w", name, err)
	}
	fmt.Fprintf(logf, "-- supervisor: started %s, pid %d\n", strings.Join(argv, " "), cmd.Process.Pid)
	sv.pid, sv.running, sv.started = cmd.Process.Pid, true, time.Since(s.start)
	exited := make(chan struct{})
	sv.exited = exited
	go s.wait(name, sv, cmd, exited)
	return nil
}

// wait reaps the main process and applies Restart=.
func (s *Supervisor) wait(name string, sv *service, cmd *exec.Cmd, exited chan struct{}) {
	err := cmd.Wait()
	s.mu.Lock()
	sv.running = false
	close(exited)
	u := sv.unit
	restart := sv.wanted && (u.Restart == "always" || u.Restart == "on-failure" && err != nil)
	if sv.wanted && !restart {
		sv.wanted, sv.failed = false, err != nil
	}
	s.mu.Unlock()
	if !restart {
		return
	}
	time.Sleep(u.RestartDelay)
	s.mu.Lock()
	defer s.mu.Unlock()
	if sv.wanted && !sv.running {
		sv.restarts++
		_ = s.spawn(name, sv)
	}
}

// stopUnit stops a unit as its KillMode says: SIGTERM to the main
// process (process) or to every process of its cgroup (control-group),
// SIGKILL after TimeoutStopSec.
func (s *Supervisor) stopUnit(name string) error {
	s.mu.Lock()
	sv := s.svcs[name]
	if sv == nil {
		s.mu.Unlock()
		return nil
	}
	sv.wanted = false
	running, pid, exited, u := sv.running, sv.pid, sv.exited, sv.unit
	s.mu.Unlock()
	if !running {
		return nil
	}
	signal := func(sig syscall.Signal) {
		if u.KillMode == "process" {
			_ = syscall.Kill(pid, sig)
			return
		}
		for _, p := range cgroupProcs(sv.cgroup) {
			_ = syscall.Kill(p, sig)
		}
	}
	signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(u.StopTimeout):
		signal(syscall.SIGKILL)
		<-exited
	}
	if u.KillMode != "process" {
		// What is left of the control group goes too.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		killCgroup(ctx, sv.cgroup)
	}
	return nil
}

// Close stops every unit and then kills whatever is left in the units'
// cgroups (what KillMode=process left running), and removes the cgroups.
func (s *Supervisor) Close() error {
	s.mu.Lock()
	var names []string
	for n := range s.svcs {
		names = append(names, n)
	}
	s.mu.Unlock()
	for _, n := range names {
		_ = s.stopUnit(n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	killCgroup(ctx, s.cfg.Cgroup)
	return removeCgroup(s.cfg.Cgroup)
}

// Leftovers lists the processes in the units' cgroups: those a stop with
// KillMode=process left running.
func (s *Supervisor) Leftovers() []int { return cgroupProcs(s.cfg.Cgroup) }

// cgroupProcs lists the processes in dir and the cgroups below it.
func cgroupProcs(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				pids = append(pids, n)
			}
		}
		return nil
	})
	return pids
}

// killCgroup SIGKILLs every process under dir until none is left.
func killCgroup(ctx context.Context, dir string) {
	for {
		pids := cgroupProcs(dir)
		if len(pids) == 0 || ctx.Err() != nil {
			return
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// removeCgroup removes dir and the cgroups below it, deepest first.
func removeCgroup(dir string) error {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
