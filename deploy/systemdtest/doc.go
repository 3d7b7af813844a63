// Package systemdtest supervises systemd units where systemd is not PID 1
// (containers, CI machines), so that tests can run what `tether install`
// writes as systemd would. A test binary becomes the supervisor, or the
// systemctl that talks to it over a unix socket, through Main.
//
// It honours, from the unit files in its unit directory:
//
//   - ExecStart: one command, split at spaces with quotes; no variables,
//     specifiers or prefixes. The process starts in a new session with
//     the directory / and only PATH in its environment, and is born
//     (clone3 with CLONE_INTO_CGROUP) in a cgroup v2 of the unit's own.
//     Type=simple and exec: the unit is active once exec succeeded.
//   - Restart= no, always, on-failure, with RestartSec=: a main process
//     that exits when not stopped is started again (NRestarts counts it).
//   - KillMode= control-group (the default: stop sends SIGTERM to every
//     process of the unit's cgroup, SIGKILL after TimeoutStopSec=, and
//     kills what is left) and process (SIGTERM to the main process only;
//     its children live on in the unit's cgroup and the next start joins
//     them there, as systemd does).
//   - Delegate=: read; the unit's cgroup is the service's either way, the
//     supervisor never creates or removes cgroups below it while it runs.
//   - [Install] WantedBy=: enable and disable make and remove the
//     <target>.wants/ links in the unit directory (and an empty .wants
//     directory) as systemctl does.
//
// The systemctl commands it takes: daemon-reload (re-reads the units;
// running services keep what they started with), enable and disable
// (with --now), start, stop, restart, try-restart, is-active,
// is-enabled, and show with -p and --value for MainPID, ActiveState,
// UnitFileState, NRestarts and ExecMainStartTimestampMonotonic. Other
// keys that would change what a service does are errors when a unit is
// loaded; resource limits, ordering and descriptions are skipped.
package systemdtest
