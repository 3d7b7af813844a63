package fleetapi

import (
	"debug/buildinfo"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Executable is what an executable of tether says of itself in the build
// information the Go toolchain writes into it.
type Executable struct {
	Version string // from -ldflags "-X main.version=..."
	Arch    string // GOARCH
	Build   string // BuildEdge when built with -tags edge, else BuildFull
}

// ReadExecutable reads the build information of an executable of tether,
// of any architecture (it is read, not run).
func ReadExecutable(r io.ReaderAt) (Executable, error) {
	bi, err := buildinfo.Read(r)
	if err != nil {
		return Executable{}, fmt.Errorf("not a Go executable: %w", err)
	}
	if bi.Path != "github.com/tether-edge/tether/cmd/tether" {
		return Executable{}, fmt.Errorf("not tether: the executable is %q", bi.Path)
	}
	e := Executable{Build: BuildFull}
	for _, s := range bi.Settings {
		switch s.Key {
		case "GOARCH":
			e.Arch = s.Value
		case "-tags":
			if slices.Contains(strings.Split(s.Value, ","), "edge") {
				e.Build = BuildEdge
			}
		case "-ldflags":
			for _, f := range strings.Fields(s.Value) {
				if v, ok := strings.CutPrefix(f, "main.version="); ok {
					e.Version = v
				}
			}
		}
	}
	switch {
	case e.Arch == "":
		return Executable{}, fmt.Errorf("the executable names no architecture")
	case e.Version == "":
		return Executable{}, fmt.Errorf("the executable has no version (build it with -ldflags \"-X main.version=VERSION\", as scripts/release.sh does)")
	}
	return e, nil
}
