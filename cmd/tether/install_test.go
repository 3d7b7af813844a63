//go:build !edge

package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tether-edge/tether/deploy"
)

// TestConfigFileCoversEveryFlag renders every flag of `tether hub` and
// `tether edge` into a config file and reads it back into fresh
// commands: each flag round-trips, so a flag added to either command can
// be set in its config file.
func TestConfigFileCoversEveryFlag(t *testing.T) {
	for _, c := range []struct {
		role deploy.Role
		cmd  func() *cobra.Command
	}{{deploy.Hub, newHubCmd}, {deploy.Edge, newEdgeCmd}} {
		t.Run(string(c.role), func(t *testing.T) {
			f := c.cmd().Flags()
			n := 0
			f.VisitAll(func(fl *pflag.Flag) {
				if !deploy.ConfigKeyExcluded(fl.Name) {
					fl.Changed = true
					n++
				}
			})
			b, err := deploy.RenderConfig(f, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			g := c.cmd().Flags()
			if err := deploy.LoadConfig(g, p, deploy.ConfigOptions{}); err != nil {
				t.Fatalf("%v\n%s", err, b)
			}
			f.VisitAll(func(fl *pflag.Flag) {
				if deploy.ConfigKeyExcluded(fl.Name) {
					return
				}
				if gl := g.Lookup(fl.Name); !gl.Changed || gl.Value.String() != fl.Value.String() {
					t.Errorf("--%s: read back %q (set %v), want %q", fl.Name, gl.Value, gl.Changed, fl.Value)
				}
			})
			t.Logf("%d flags of tether %s", n, c.role)
		})
	}
}

// TestInstallBadInput checks that install and the roles' commands refuse
// missing flags and bad config files with clear errors, writing nothing.
func TestInstallBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	unknown := write("unknown.yaml", "hub: https://h:6443\ntoken: t\nhub-adress: x\n")
	wrongType := write("wrongtype.yaml", "hub: https://h:6443\ntoken: t\ngossip-port: many\n")
	edgeKeyForHub := write("edgekey.yaml", "runtime: sim\n")
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"no hub", []string{"install", "edge", "--token", "t"}, []string{"--hub", "--token"}},
		{"no token", []string{"install", "edge", "--hub", "https://h:6443"}, []string{"--hub", "--token"}},
		{"unknown key", []string{"install", "edge", "--config", unknown}, []string{unknown, `unknown key "hub-adress"`, "line 3"}},
		{"wrong type", []string{"install", "edge", "--config", wrongType}, []string{wrongType, `key "gossip-port"`, "int"}},
		{"edge key for the hub", []string{"install", "hub", "--config", edgeKeyForHub}, []string{`unknown key "runtime"`}},
		{"unknown flag", []string{"install", "edge", "--hub", "https://h:6443", "--token", "t", "--no-such-flag"}, []string{"no-such-flag"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "root")
			calls := filepath.Join(t.TempDir(), "calls")
			args := append(append([]string{}, c.args...), "--root", root, "--systemctl", recordingSystemctl(t, calls))
			cmd := newRoot()
			cmd.SetArgs(args)
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			err := cmd.Execute()
			if err == nil {
				t.Fatalf("accepted: %v\n%s", args, out.String())
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if _, err := os.Stat(root); err == nil {
				t.Errorf("%s was created", root)
			}
			if _, err := os.Stat(calls); err == nil {
				t.Errorf("systemctl was run")
			}
		})
	}
	// The roles' own commands read --config before doing anything.
	for _, args := range [][]string{
		{"edge", "--config", unknown},
		{"edge", "--config", wrongType},
		{"hub", "--config", edgeKeyForHub},
		{"hub", "--config", filepath.Join(dir, "absent.yaml")},
	} {
		cmd := newRoot()
		cmd.SetArgs(args)
		cmd.SetOut(&bytes.Buffer{})
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), args[2]) {
			t.Errorf("tether %s: %v, want an error naming the file", strings.Join(args, " "), err)
		}
	}
}

// recordingSystemctl is a systemctl that appends its arguments to file.
func recordingSystemctl(t *testing.T, file string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "systemctl")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho \"$*\" >>"+file+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestInstallTwiceChangesNothing installs the edge into a scratch root
// with a systemctl that records its calls: the second run with the same
// flags writes nothing and only asks systemd to keep the unit enabled
// and started, a run with another flag rewrites the config file alone
// and restarts the unit, and uninstall removes every file.
func TestInstallTwiceChangesNothing(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	calls := filepath.Join(t.TempDir(), "calls")
	l := deploy.Layout{Root: root}
	args := []string{"install", "edge", "--root", root, "--systemctl", recordingSystemctl(t, calls),
		"--hub", "https://127.0.0.1:6443", "--token", "t", "--runtime", "sim", "--dns-interface", "",
		"--bpf-pin-dir", filepath.Join(root, "bpf"), "--labels", "a=b"}
	install := func(args ...string) string {
		t.Helper()
		cmd := newRoot()
		cmd.SetArgs(args)
		var out bytes.Buffer
		cmd.SetOut(&out)
		if err := cmd.Execute(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out.String())
		}
		b, _ := os.ReadFile(calls)
		_ = os.Remove(calls)
		return out.String() + "systemctl calls:\n" + string(b)
	}
	files := func() map[string]string {
		m := map[string]string{}
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				st, _ := os.Stat(p)
				b, _ := os.ReadFile(p)
				m[p] = st.Mode().String() + " " + st.ModTime().String() + " " + string(b[:min(len(b), 4096)])
			}
			return nil
		})
		return m
	}
	out := install(args...)
	if !strings.Contains(out, "daemon-reload\nenable --now tether-edge.service\n") || strings.Contains(out, "restart") {
		t.Errorf("first install:\n%s", out)
	}
	cfg, err := os.ReadFile(l.ConfigFile(deploy.Edge))
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(l.ConfigFile(deploy.Edge)); st.Mode().Perm() != 0o600 {
		t.Errorf("config file mode %v, want 0600 (it holds the token)", st.Mode())
	}
	for _, want := range []string{"hub: https://127.0.0.1:6443", "token: t", "data-dir: " + l.DataDir(deploy.Edge), "labels:\n  a: b"} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	before := files()
	if out := install(args...); !strings.HasSuffix(out, "systemctl calls:\nenable --now tether-edge.service\n") || strings.Contains(out, "wrote") {
		t.Errorf("second install:\n%s", out)
	}
	after := files()
	for p, v := range before {
		if after[p] != v {
			t.Errorf("%s changed by the second install", p)
		}
	}
	out = install(append(args, "--labels", "a=c")...)
	if !strings.Contains(out, "wrote "+l.ConfigFile(deploy.Edge)+"\n") || strings.Contains(out, "wrote "+l.Binary(deploy.Edge)) ||
		!strings.HasSuffix(out, "enable --now tether-edge.service\nrestart tether-edge.service\n") {
		t.Errorf("install with another flag:\n%s", out)
	}
	out = install("uninstall", "--root", root, "--systemctl", recordingSystemctl(t, calls))
	if !strings.Contains(out, "disable --now tether-edge.service\ndaemon-reload\n") {
		t.Errorf("uninstall:\n%s", out)
	}
	if left := files(); len(left) > 0 {
		t.Errorf("left after uninstall: %v", left)
	}
	if out := install("uninstall", "--root", root, "--systemctl", recordingSystemctl(t, calls)); !strings.Contains(out, "nothing installed") {
		t.Errorf("second uninstall:\n%s", out)
	}
}
