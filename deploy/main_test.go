package deploy_test

import (
	"os"
	"testing"

	"github.com/tether-edge/tether/deploy/systemdtest"
)

// TestMain lets the test binary be the unit supervisor and its systemctl
// (systemdtest.Main) for the installation test.
func TestMain(m *testing.M) {
	if code, ok := systemdtest.Main(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}
