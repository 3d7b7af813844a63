// Command helm is upstream Helm, built from the helm.sh/helm module at the
// version pinned in this module, for tether's end-to-end tests: charts are
// installed against a real hub the way users install them. It lives in its
// own module so the product's dependencies stay lean.
package main

import (
	"errors"
	"fmt"
	"os"

	helmcmd "helm.sh/helm/v4/pkg/cmd"
	"helm.sh/helm/v4/pkg/kube"

	// Client auth plugins (exec, oidc) as the upstream binary has them.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	// The field manager upstream's binary records in managedFields,
	// whatever this file is named.
	kube.ManagedFieldsManager = "helm"

	cmd, err := helmcmd.NewRootCmd(os.Stdout, os.Args[1:], helmcmd.SetupLogging)
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
	if err := cmd.Execute(); err != nil {
		var cerr helmcmd.CommandError
		if errors.As(err, &cerr) {
			os.Exit(cerr.ExitCode)
		}
		os.Exit(1)
	}
}
