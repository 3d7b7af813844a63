package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"

	"github.com/spf13/cobra"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "devel"

func main() {
	if err := newRoot().Execute(); err != nil {
		if r, ok := errors.AsType[*restartInto](err); ok {
			err = execInto(r.path) // returns only on failure
		}
		fmt.Fprintln(os.Stderr, "tether:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "tether",
		Short:         "An edge-first orchestrator that speaks the Kubernetes API",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(commands()...)
	root.AddCommand(newVersionCmd())
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the tether version and the Kubernetes API version it serves",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "tether %s (Kubernetes API %s, %s, %s/%s)\n",
				version, kubernetesVersion, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("parse --log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
