//go:build edge

package main

import "github.com/spf13/cobra"

// installHubCmds is empty in the edge-only build: it has no hub.
func installHubCmds() []*cobra.Command { return nil }
