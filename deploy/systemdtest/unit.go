package systemdtest

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Unit is what the supervisor reads of a unit file.
type Unit struct {
	Name      string
	ExecStart []string
	// Restart is no, always or on-failure.
	Restart      string
	RestartDelay time.Duration // RestartSec=
	// KillMode is control-group or process.
	KillMode    string
	Delegate    bool
	StopTimeout time.Duration // TimeoutStopSec=
	WantedBy    []string
}

// ParseUnit reads a unit file. Keys the supervisor does not honour are
// skipped, except those whose absence would change what the service
// does (other Exec* commands, Environment*, User, WorkingDirectory and
// the like), which are errors; so is a value it does not honour.
func ParseUnit(name string, b []byte) (*Unit, error) {
	u := &Unit{Name: name, Restart: "no", RestartDelay: 100 * time.Millisecond, KillMode: "control-group", StopTimeout: 90 * time.Second}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	line := 0
	var pending string
	for sc.Scan() {
		line++
		l := strings.TrimSpace(sc.Text())
		if pending != "" {
			l = pending + " " + l
			pending = ""
		}
		if strings.HasSuffix(l, `\`) {
			pending = strings.TrimSuffix(l, `\`)
			continue
		}
		if l == "" || l[0] == '#' || l[0] == ';' {
			continue
		}
		if l[0] == '[' && l[len(l)-1] == ']' {
			section = l[1 : len(l)-1]
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: not key=value: %q", name, line, l)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if err := u.set(section, k, v); err != nil {
			return nil, fmt.Errorf("%s:%d: %s=%s: %w", name, line, k, v, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(u.ExecStart) == 0 {
		return nil, fmt.Errorf("%s: no ExecStart", name)
	}
	return u, nil
}

// ignored are keys that change nothing the supervisor's tests look at:
// resource limits, ordering, descriptions.
var ignored = map[string]bool{
	"Unit.Description": true, "Unit.Documentation": true, "Unit.Wants": true, "Unit.After": true,
	"Service.LimitNOFILE": true, "Service.LimitNPROC": true, "Service.LimitCORE": true,
	"Service.TasksMax": true, "Service.OOMScoreAdjust": true,
}

func (u *Unit) set(section, k, v string) error {
	switch section + "." + k {
	case "Service.Type":
		if v != "simple" && v != "exec" {
			return fmt.Errorf("only Type=simple and exec are supervised")
		}
	case "Service.ExecStart":
		if strings.ContainsAny(v, "$%") || strings.ContainsAny(v[:1], "-@:+!|") {
			return fmt.Errorf("variables, specifiers and prefixes are not supported")
		}
		args, err := splitCommand(v)
		if err != nil {
			return err
		}
		u.ExecStart = args
	case "Service.Restart":
		if v != "no" && v != "always" && v != "on-failure" {
			return fmt.Errorf("only no, always and on-failure are supervised")
		}
		u.Restart = v
	case "Service.RestartSec":
		d, err := parseSec(v)
		if err != nil {
			return err
		}
		u.RestartDelay = d
	case "Service.TimeoutStopSec":
		d, err := parseSec(v)
		if err != nil {
			return err
		}
		u.StopTimeout = d
	case "Service.KillMode":
		if v != "control-group" && v != "process" {
			return fmt.Errorf("only control-group and process are supervised")
		}
		u.KillMode = v
	case "Service.Delegate":
		b, err := parseBool(v)
		if err != nil {
			return err
		}
		u.Delegate = b
	case "Install.WantedBy":
		u.WantedBy = append(u.WantedBy, strings.Fields(v)...)
	default:
		if !ignored[section+"."+k] {
			return fmt.Errorf("not supervised")
		}
	}
	return nil
}

// splitCommand splits a command line at spaces, honouring double and
// single quotes.
func splitCommand(s string) ([]string, error) {
	var (
		args  []string
		cur   strings.Builder
		quote rune
		in    bool
	)
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				args = append(args, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote")
	}
	if in {
		args = append(args, cur.String())
	}
	return args, nil
}

// parseSec reads a time span: seconds, or a Go duration (5s, 1min is not).
func parseSec(v string) (time.Duration, error) {
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(n * float64(time.Second)), nil
	}
	return time.ParseDuration(v)
}

func parseBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "yes", "true", "on", "1":
		return true, nil
	case "no", "false", "off", "0":
		return false, nil
	}
	return false, fmt.Errorf("not a boolean")
}
