package testbench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadSpec(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string
		check   func(t *testing.T, s Spec)
	}{
		{
			name: "full",
			yaml: `id: ab12
diskSizeMiB: 16
sites:
  - name: shop
    nodes: 2
    link: {rateBps: 256000, delay: 300ms, jitter: 20ms, loss: 0.02}
  - name: farm
    nodes: 1
`,
			check: func(t *testing.T, s Spec) {
				if s.ID != "ab12" || len(s.Sites) != 2 || s.DiskSize != 16 {
					t.Errorf("spec = %+v", s)
				}
				l := s.Sites[0].Link
				if l.Rate != 256000 || time.Duration(l.Delay) != 300*time.Millisecond ||
					time.Duration(l.Jitter) != 20*time.Millisecond || l.Loss != 0.02 {
					t.Errorf("link = %+v", l)
				}
			},
		},
		{name: "bad id", yaml: "id: Hub_1\nsites: []\n", wantErr: "id"},
		{name: "reserved site", yaml: "sites: [{name: hub, nodes: 1}]\n", wantErr: "reserved"},
		{name: "duplicate site", yaml: "sites: [{name: a, nodes: 1}, {name: a, nodes: 1}]\n", wantErr: "duplicate"},
		{name: "too many nodes", yaml: "sites: [{name: a, nodes: 101}]\n", wantErr: "nodes"},
		{name: "unknown field", yaml: "sites: [{name: a, nodez: 1}]\n", wantErr: "nodez"},
		{name: "bad duration", yaml: "sites: [{name: a, link: {delay: soon}}]\n", wantErr: "duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "lab.yaml")
			if err := os.WriteFile(p, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := LoadSpec(p)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("LoadSpec error = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("LoadSpec: %v", err)
			}
			tt.check(t, s)
		})
	}
}
