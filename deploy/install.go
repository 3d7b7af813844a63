package deploy

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/tether-edge/tether/edge/upgrade"
)

// Role is what an installation runs: the hub or the edge agent.
type Role string

// The roles.
const (
	Hub  Role = "hub"
	Edge Role = "edge"
)

// Roles are the roles in the order Uninstall removes them: the agent
// before the hub it may talk to.
var roles = [...]Role{Edge, Hub}

// Roles returns every role, in the order Uninstall removes them.
func Roles() []Role { return roles[:] }

//go:embed systemd/tether-hub.service systemd/tether-edge.service
var units embed.FS

// Where a root-less installation puts things.
const (
	binDir    = "/usr/local/bin"
	configDir = "/etc/tether"
	unitDir   = "/etc/systemd/system"
	dataDir   = "/var/lib/tether"
)

// Layout says where an installation's files are. Root prefixes every
// path, and the files written name the prefixed paths (the unit's
// ExecStart, the config file's data directory): an installation under a
// root is complete in itself, as tests use it. The zero Layout is the
// machine's: /usr/local/bin, /etc/tether, /etc/systemd/system and
// /var/lib/tether.
type Layout struct {
	Root string
}

// Binary is the executable the role's unit runs: tether for the hub,
// tether-edge for the agent (the edge-only build, or a full one).
func (l Layout) Binary(r Role) string {
	if r == Edge {
		return filepath.Join(l.Root, binDir, "tether-edge")
	}
	return filepath.Join(l.Root, binDir, "tether")
}

// ConfigFile is the role's config file, /etc/tether/ROLE.yaml.
func (l Layout) ConfigFile(r Role) string {
	return filepath.Join(l.Root, configDir, string(r)+".yaml")
}

// DefaultConfigFile is the config file `tether hub` and `tether edge`
// read when it exists and --config is not given.
func DefaultConfigFile(r Role) string { return Layout{}.ConfigFile(r) }

// UnitName is the role's systemd unit, tether-ROLE.service.
func UnitName(r Role) string { return "tether-" + string(r) + ".service" }

// Unit is the path of the role's unit file.
func (l Layout) Unit(r Role) string { return filepath.Join(l.Root, unitDir, UnitName(r)) }

// DataDir is the role's data directory, /var/lib/tether/ROLE.
func (l Layout) DataDir(r Role) string { return filepath.Join(l.Root, dataDir, string(r)) }

// InstalledDataDir is the data directory of the role as installed: the
// data-dir key of its config file, else DataDir.
func (l Layout) InstalledDataDir(r Role) (string, error) {
	return configDataDir(l.ConfigFile(r), l.DataDir(r))
}

// UnitFile returns the role's unit as written under l: the shipped unit
// (deploy/systemd) with its paths under l.Root.
func (l Layout) UnitFile(r Role) ([]byte, error) {
	b, err := units.ReadFile("systemd/" + UnitName(r))
	if err != nil {
		return nil, fmt.Errorf("unknown role %q", r)
	}
	if l.Root == "" {
		return b, nil
	}
	s := string(b)
	for _, d := range []string{binDir, configDir} {
		s = strings.ReplaceAll(s, d+"/", filepath.Join(l.Root, d)+"/")
	}
	return []byte(s), nil
}

// Config is one role's installation.
type Config struct {
	Role   Role
	Layout Layout
	// Binary is the executable to install, usually the running one.
	Binary string
	// Settings is the config file's content (RenderConfig).
	Settings []byte
	// Systemctl is the program that manages units (default systemctl);
	// it is given systemctl's arguments.
	Systemctl string
	// Out gets a line per change made (default: discarded).
	Out io.Writer
}

// Result says what Install did.
type Result struct {
	// Changed lists the files written, in order.
	Changed []string
	// Fresh is true when the role was not installed before.
	Fresh bool
	// Restarted is true when a running unit was restarted for a change.
	Restarted bool
}

// Install puts the role on the machine: the binary, the config file and
// the unit, each written only when its bytes or mode differ from what is
// there (so nothing changes, not even a file's modification time, when
// they agree); then reloads systemd's units if the unit changed, enables
// and starts the unit, and restarts it when it was installed before and
// something changed. Running it twice with the same Config runs only
// `systemctl enable --now`, which leaves a running unit alone.
func Install(ctx context.Context, cfg Config) (Result, error) {
	var res Result
	if cfg.Role != Hub && cfg.Role != Edge {
		return res, fmt.Errorf("unknown role %q: want hub or edge", cfg.Role)
	}
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	l := cfg.Layout
	bin, err := os.ReadFile(cfg.Binary)
	if err != nil {
		return res, fmt.Errorf("read the binary to install: %w", err)
	}
	unit, err := l.UnitFile(cfg.Role)
	if err != nil {
		return res, err
	}
	if _, err := os.Stat(l.ConfigFile(cfg.Role)); errors.Is(err, fs.ErrNotExist) {
		res.Fresh = true
	}
	unitChanged := false
	for _, f := range []struct {
		path string
		data []byte
		mode fs.FileMode
	}{
		{l.Binary(cfg.Role), bin, 0o755},
		// The config file may hold a join token.
		{l.ConfigFile(cfg.Role), cfg.Settings, 0o600},
		{l.Unit(cfg.Role), unit, 0o644},
	} {
		changed, err := writeFile(f.path, f.data, f.mode)
		if err != nil {
			return res, err
		}
		if changed {
			res.Changed = append(res.Changed, f.path)
			fmt.Fprintf(out, "wrote %s\n", f.path)
			unitChanged = unitChanged || f.path == l.Unit(cfg.Role)
		}
	}
	sc := systemctl{cfg.Systemctl, out}
	name := UnitName(cfg.Role)
	if unitChanged {
		if err := sc.run(ctx, "daemon-reload"); err != nil {
			return res, err
		}
	}
	if err := sc.run(ctx, "enable", "--now", name); err != nil {
		return res, err
	}
	if !res.Fresh && len(res.Changed) > 0 {
		if err := sc.run(ctx, "restart", name); err != nil {
			return res, err
		}
		res.Restarted = true
	}
	return res, nil
}

// writeFile makes path hold data with mode, creating its directory,
// through a temporary file renamed over it. It writes nothing when the
// file already holds data (only the mode is set when it differs).
func writeFile(path string, data []byte, mode fs.FileMode) (changed bool, err error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		st, err := os.Stat(path)
		if err != nil {
			return false, err
		}
		if st.Mode().Perm() == mode {
			return false, nil
		}
		if err := os.Chmod(path, mode); err != nil {
			return false, fmt.Errorf("set the mode of %s: %w", path, err)
		}
		return true, nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err = tmp.Write(data); err == nil {
		err = tmp.Chmod(mode)
		if err == nil {
			err = tmp.Sync()
		}
		if err == nil && mode&0o111 != 0 {
			// The executable runs from the disk's copy, not from the
			// large folios this write cached (upgrade.Uncache says why).
			_ = upgrade.Uncache(tmp)
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	return true, nil
}

// systemctl runs the unit manager.
type systemctl struct {
	cmd string
	out io.Writer
}

func (s systemctl) run(ctx context.Context, args ...string) error {
	name := s.cmd
	if name == "" {
		name = "systemctl"
	}
	fmt.Fprintf(s.out, "systemctl %s\n", strings.Join(args, " "))
	b, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("systemctl %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(b))
	}
	return nil
}

// UninstallConfig says what Uninstall removes.
type UninstallConfig struct {
	Layout Layout
	// Roles to remove (default: both); a role not installed is skipped.
	Roles []Role
	// Systemctl, as in Config.
	Systemctl string
	// KeepData leaves the roles' data directories.
	KeepData bool
	// ResetEdge removes what the stopped agent put on the node, its data
	// directory too unless keepData (`tether edge reset`); it is given
	// the agent's config file.
	ResetEdge func(ctx context.Context, configFile string, keepData bool) error
	Out       io.Writer
}

// Uninstall reverses Install for each role installed: it stops and
// disables the unit, for the edge runs ResetEdge, removes the hub's data
// directory (unless KeepData), the unit (then reloads systemd's units),
// the config file, the binary and what in-place upgrades left beside it
// (the previous executable), and the directories Install created
// that are left empty. A role whose unit file is absent is not installed
// and is skipped, so running it twice is harmless.
func Uninstall(ctx context.Context, cfg UninstallConfig) (removed []Role, err error) {
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	l := cfg.Layout
	sc := systemctl{cfg.Systemctl, out}
	want := cfg.Roles
	if len(want) == 0 {
		want = Roles()
	}
	for _, r := range Roles() {
		if !containsRole(want, r) {
			continue
		}
		if _, err := os.Stat(l.Unit(r)); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		name := UnitName(r)
		if err := sc.run(ctx, "disable", "--now", name); err != nil {
			return removed, err
		}
		switch r {
		case Edge:
			if cfg.ResetEdge == nil {
				return removed, errors.New("uninstall the edge: no reset given")
			}
			if err := cfg.ResetEdge(ctx, l.ConfigFile(r), cfg.KeepData); err != nil {
				return removed, fmt.Errorf("reset the edge: %w", err)
			}
		case Hub:
			if !cfg.KeepData {
				dir, err := l.InstalledDataDir(r)
				if err != nil {
					return removed, err
				}
				if err := os.RemoveAll(dir); err != nil {
					return removed, fmt.Errorf("remove the hub's data: %w", err)
				}
				fmt.Fprintf(out, "removed %s\n", dir)
			}
		}
		if err := removeFile(out, l.Unit(r)); err != nil {
			return removed, err
		}
		if err := sc.run(ctx, "daemon-reload"); err != nil {
			return removed, err
		}
		// In-place upgrades keep the previous executable beside the
		// installed one.
		left, err := upgrade.Leftovers(l.Binary(r))
		if err != nil {
			return removed, err
		}
		for _, p := range append([]string{l.ConfigFile(r), l.Binary(r)}, left...) {
			if err := removeFile(out, p); err != nil {
				return removed, err
			}
		}
		removed = append(removed, r)
	}
	// Directories Install created, if nothing else is in them.
	for _, d := range []string{configDir, dataDir} {
		_ = os.Remove(filepath.Join(l.Root, d))
	}
	return removed, nil
}

func containsRole(rs []Role, r Role) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

func removeFile(out io.Writer, p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	fmt.Fprintf(out, "removed %s\n", p)
	return nil
}

// configDataDir reads the data-dir key of a role's config file; def when
// the file or the key is absent.
func configDataDir(configFile, def string) (string, error) {
	v, ok, err := ConfigValue(configFile, "data-dir")
	if err != nil || !ok || v == "" {
		return def, err
	}
	return v, nil
}
