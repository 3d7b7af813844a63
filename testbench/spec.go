package testbench

import (
	"fmt"
	"os"
	"regexp"
	"time"

	"sigs.k8s.io/yaml"
)

// Spec declares a lab's topology.
type Spec struct {
	// ID prefixes every namespace and runtime path of the lab. Empty means a
	// random id. It must be 1 to 6 lowercase letters or digits.
	ID string `json:"id,omitempty"`
	// Sites lists the sites behind NAT; at most 99.
	Sites []SiteSpec `json:"sites"`
	// DiskSize is the size of each node's tmpfs data dir in MiB. Zero
	// means 64.
	DiskSize int `json:"diskSizeMiB,omitempty"`
}

// SiteSpec declares one site: a router and its nodes.
type SiteSpec struct {
	// Name identifies the site in commands; it must be 1 to 8 lowercase
	// letters or digits.
	Name string `json:"name"`
	// Nodes is the number of nodes behind the router; at most 100.
	Nodes int `json:"nodes"`
	// Link is the initial shaping of the site's uplink.
	Link LinkParams `json:"link,omitempty"`
}

// LinkParams describes the impairment of one site uplink. It applies to
// each direction independently. The zero value is a perfect link.
type LinkParams struct {
	// Rate is the bandwidth in bits per second; zero means unlimited.
	Rate int64 `json:"rateBps,omitempty"`
	// Delay is the one-way propagation delay.
	Delay Duration `json:"delay,omitempty"`
	// Jitter is the maximum extra delay, drawn uniformly from [0, Jitter).
	Jitter Duration `json:"jitter,omitempty"`
	// Loss is the probability (0..1) that a packet is dropped.
	Loss float64 `json:"loss,omitempty"`
	// Duplicate is the probability (0..1) that a packet is sent twice.
	Duplicate float64 `json:"duplicate,omitempty"`
	// Reorder is the probability (0..1) that a packet skips the delay and
	// so overtakes the packets queued before it.
	Reorder float64 `json:"reorder,omitempty"`
	// QueueLimit bounds the bytes waiting for the rate limiter; zero means
	// 64 KiB. Packets beyond it are tail-dropped, as in a router buffer.
	QueueLimit int `json:"queueLimitBytes,omitempty"`
}

// Duration is a time.Duration that reads and writes as "100ms" in YAML.
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(fmt.Sprintf("%q", time.Duration(d).String())), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' {
		s = s[1 : len(s)-1]
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("parse duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

var (
	idRE   = regexp.MustCompile(`^[a-z0-9]{1,6}$`)
	nameRE = regexp.MustCompile(`^[a-z0-9]{1,8}$`)
)

// LoadSpec reads a YAML or JSON spec file.
func LoadSpec(path string) (Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Spec{}, fmt.Errorf("read spec: %w", err)
	}
	var s Spec
	if err := yaml.UnmarshalStrict(b, &s); err != nil {
		return Spec{}, fmt.Errorf("parse spec %s: %w", path, err)
	}
	return s, s.validate()
}

func (s *Spec) validate() error {
	if s.ID != "" && !idRE.MatchString(s.ID) {
		return fmt.Errorf("validate spec: id %q is not 1-6 of [a-z0-9]", s.ID)
	}
	if len(s.Sites) > 99 {
		return fmt.Errorf("validate spec: %d sites, at most 99", len(s.Sites))
	}
	seen := map[string]bool{}
	for _, st := range s.Sites {
		if !nameRE.MatchString(st.Name) || st.Name == "hub" {
			return fmt.Errorf("validate spec: site name %q is not 1-8 of [a-z0-9] or is reserved", st.Name)
		}
		if seen[st.Name] {
			return fmt.Errorf("validate spec: duplicate site %q", st.Name)
		}
		seen[st.Name] = true
		if st.Nodes < 0 || st.Nodes > 100 {
			return fmt.Errorf("validate spec: site %s has %d nodes, want 0..100", st.Name, st.Nodes)
		}
	}
	return nil
}
