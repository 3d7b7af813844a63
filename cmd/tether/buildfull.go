//go:build !edge

package main

import "github.com/tether-edge/tether/internal/fleetapi"

// build is the build of tether this executable is, which the agent
// labels its Node with so that rollouts ask it for the same build.
const build = fleetapi.BuildFull
