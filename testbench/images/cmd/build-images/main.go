// Command build-images writes tether's test and demo images as OCI
// archives:
//
//	go run ./testbench/images/cmd/build-images -out DIR
//
// writes DIR/test-images.tar and DIR/demo.tar; copy them to an edge node's
// <data-dir>/images/ or import them with `tether edge images import`.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tether-edge/tether/testbench/images"
)

func main() {
	out := flag.String("out", ".", "directory for the archives")
	demoOnly := flag.Bool("demo", false, "write only demo.tar")
	flag.Parse()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := images.BuildDemo(filepath.Join(*out, "demo.tar")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if !*demoOnly {
		if err := images.Build(filepath.Join(*out, "test-images.tar")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
