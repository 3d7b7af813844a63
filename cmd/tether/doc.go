// Command tether is the single binary of tether: the hub (API server, store,
// tunnel server, scheduler, controllers) and the edge agent.
//
// Subcommands:
//
//	tether hub --data-dir DIR                 the control plane
//	tether token create [--ttl 24h]           a join token for one or more edges
//	tether user create NAME --group G         a user's client certificate and kubeconfig
//	tether edge --hub URL --token T           the node agent
//	tether edge images import FILE...         OCI archives into the agent's containerd
//	tether edge reset --data-dir DIR          remove what an agent set up on a node
//	tether install hub|edge [flags]           install a role as a systemd service
//	tether uninstall [hub|edge]               remove what install put on the machine
//	tether version
//
// tether hub and tether edge read their flags from a YAML file too
// (--config, by default /etc/tether/ROLE.yaml when it exists), one key
// per flag; flags given on the command line win.
//
// Built with -tags edge (scripts/build.sh's tether-edge) it is the agent
// alone: edge, edge images, edge reset, install edge, uninstall and
// version, and it links none of the hub, store, scheduler or controllers
// code.
//
// This is the only place that reads flags and environment variables; every
// component gets a Config built here.
package main
