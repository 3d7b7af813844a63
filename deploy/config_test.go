package deploy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/tether-edge/tether/deploy"
)

// flags is a flag set with one flag of each kind the commands use.
func flags() *pflag.FlagSet {
	f := pflag.NewFlagSet("test", pflag.ContinueOnError)
	f.String("hub", "", "")
	f.String("token", "", "")
	f.Bool("ingress", false, "")
	f.Int("gossip-port", 7946, "")
	f.Uint16("dns-port", 53, "")
	f.Int64("change-log-retain", 0, "")
	f.Float64("rate", 500, "")
	f.Duration("metrics-period", 15*time.Second, "")
	f.StringSlice("uplinks", nil, "")
	f.StringArray("runtime-handler", nil, "")
	f.StringToString("labels", nil, "")
	f.String("config", "", "")
	return f
}

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConfigRoundTrip renders set flags of every kind and reads them back
// into a fresh flag set: the same values, and only those flags set.
func TestConfigRoundTrip(t *testing.T) {
	f := flags()
	if err := f.Parse([]string{"--hub", "https://10.0.0.1:6443", "--token", "123", "--ingress", "--gossip-port", "-1",
		"--dns-port", "5353", "--change-log-retain", "9000000000", "--rate", "2.5", "--metrics-period", "1m30s",
		"--uplinks", "eth0,eth1", "--runtime-handler", "crun=io.containerd.runc.v2:/usr/bin/crun", "--runtime-handler", "kata=io.containerd.kata.v2",
		"--labels", "a=b,c=d=e", "--labels", "x.io/y=with, comma"}); err != nil {
		t.Fatal(err)
	}
	b, err := deploy.RenderConfig(f, "header", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rendered:\n%s", b)
	if !strings.HasPrefix(string(b), "# header\n") || !strings.Contains(string(b), `token: "123"`) {
		t.Errorf("rendered config lacks the header or quotes a numeric string:\n%s", b)
	}
	g := flags()
	if err := deploy.LoadConfig(g, writeConfig(t, string(b)), deploy.ConfigOptions{}); err != nil {
		t.Fatal(err)
	}
	f.VisitAll(func(fl *pflag.Flag) {
		gl := g.Lookup(fl.Name)
		if gl.Value.String() != fl.Value.String() || gl.Changed != fl.Changed {
			t.Errorf("--%s: read back %s (set %v), want %s (set %v)", fl.Name, gl.Value, gl.Changed, fl.Value, fl.Changed)
		}
	})
}

// TestConfigFlagsOverride checks that a flag given on the command line
// wins over the file, and that a scalar sets a list flag.
func TestConfigFlagsOverride(t *testing.T) {
	f := flags()
	if err := f.Parse([]string{"--hub", "https://cli:6443"}); err != nil {
		t.Fatal(err)
	}
	p := writeConfig(t, "hub: https://file:6443\ntoken: t\nuplinks: eth0\nlabels: {zone: a}\n")
	if err := deploy.LoadConfig(f, p, deploy.ConfigOptions{}); err != nil {
		t.Fatal(err)
	}
	hub, _ := f.GetString("hub")
	token, _ := f.GetString("token")
	uplinks, _ := f.GetStringSlice("uplinks")
	labels, _ := f.GetStringToString("labels")
	if hub != "https://cli:6443" || token != "t" || len(uplinks) != 1 || uplinks[0] != "eth0" || labels["zone"] != "a" {
		t.Errorf("hub %q token %q uplinks %q labels %v", hub, token, uplinks, labels)
	}
	if err := deploy.LoadConfig(flags(), filepath.Join(t.TempDir(), "absent.yaml"), deploy.ConfigOptions{Optional: true}); err != nil {
		t.Errorf("an optional absent file: %v", err)
	}
	if err := deploy.LoadConfig(flags(), filepath.Join(t.TempDir(), "absent.yaml"), deploy.ConfigOptions{}); err == nil {
		t.Error("an absent file given explicitly was accepted")
	}
	g := flags()
	if err := deploy.LoadConfig(g, writeConfig(t, "hub: h\nother: x\n"), deploy.ConfigOptions{IgnoreUnknown: true}); err != nil {
		t.Errorf("IgnoreUnknown: %v", err)
	}
}

// TestConfigBadInput checks that bad files are refused with an error
// naming the key (and the line), and set no flag.
func TestConfigBadInput(t *testing.T) {
	for _, c := range []struct {
		name, content string
		want          []string
	}{
		{"unknown key", "hub: h\nhubb: h\n", []string{`unknown key "hubb"`, "line 2"}},
		{"the config key", "config: /etc/x.yaml\n", []string{`unknown key "config"`}},
		{"wrong type", "gossip-port: lots\n", []string{`key "gossip-port"`, "want a int value", `"lots"`}},
		{"bool", "ingress: maybe\n", []string{`key "ingress"`, "bool"}},
		{"list for a scalar", "hub: [a, b]\n", []string{`key "hub"`, "want a single string value, not a list"}},
		{"mapping for a list", "uplinks: {a: b}\n", []string{`key "uplinks"`, "not a mapping"}},
		{"bad list item", "dns-port: [1]\n", []string{`key "dns-port"`}},
		{"no value", "token:\n", []string{`key "token" has no value`}},
		{"twice", "hub: a\nhub: b\n", []string{`"hub"`}},
		{"not a mapping", "- hub\n", []string{"want a mapping of flag names"}},
		{"bad YAML", "hub: [\n", []string{"edge.yaml"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := flags()
			err := deploy.LoadConfig(f, writeConfig(t, c.content), deploy.ConfigOptions{})
			if err == nil {
				t.Fatalf("accepted:\n%s", c.content)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			f.VisitAll(func(fl *pflag.Flag) {
				if fl.Changed {
					t.Errorf("--%s was set by a refused file", fl.Name)
				}
			})
		})
	}
}

// TestInstalledDataDir reads an installed role's data directory from its
// config file, and falls back to the layout's.
func TestInstalledDataDir(t *testing.T) {
	l := deploy.Layout{Root: t.TempDir()}
	if d, err := l.InstalledDataDir(deploy.Edge); err != nil || d != l.DataDir(deploy.Edge) {
		t.Errorf("without a config file: %q %v", d, err)
	}
	if err := os.MkdirAll(filepath.Dir(l.ConfigFile(deploy.Edge)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.ConfigFile(deploy.Edge), []byte("hub: https://hub:6443\ndata-dir: /srv/edge\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if d, err := l.InstalledDataDir(deploy.Edge); err != nil || d != "/srv/edge" {
		t.Errorf("from the config file: %q %v", d, err)
	}
	if err := os.WriteFile(l.ConfigFile(deploy.Edge), []byte("data-dir: [a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := l.InstalledDataDir(deploy.Edge); err == nil {
		t.Error("a broken config file read without an error")
	}
}
