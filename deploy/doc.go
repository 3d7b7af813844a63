// Package deploy puts tether on machines: `tether install hub|edge` and
// `tether uninstall`, the config files `tether hub` and `tether edge`
// read, and the systemd units (systemd/, shipped in release tarballs and
// embedded here).
//
// A config file (/etc/tether/hub.yaml, /etc/tether/edge.yaml) is a YAML
// mapping from a command's flag names to values; every flag of the
// command may be set there, flags given on the command line win, and an
// unknown key or a value the flag does not take is an error naming the
// key. It is read through the command's pflag.FlagSet, so a flag added
// to the command can be set in the file with no change here.
//
// An installation is three files per role, each written only when its
// bytes differ: the binary (/usr/local/bin/tether for the hub,
// /usr/local/bin/tether-edge for the agent), the config file and the unit
// (/etc/systemd/system/tether-ROLE.service); an agent upgraded in place
// (edge/upgrade) keeps the executable it replaced beside the binary, and
// uninstalling removes it with the rest. A Layout can put them all
// under another root, with every path the files name prefixed too. The
// unit manager is run as a program (systemctl by default), so a test can
// give its own; deploy/systemdtest is one that supervises units where
// systemd does not run.
package deploy
