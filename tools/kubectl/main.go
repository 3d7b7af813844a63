// Command kubectl is upstream kubectl, built from k8s.io/kubectl at the
// version pinned in this module, for tether's end-to-end tests. It lives in
// its own module so the product's dependencies stay lean.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	// Client auth plugins (exec, oidc) as the upstream binary has them.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
