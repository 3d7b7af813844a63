// Package upgrade replaces the edge agent's executable while the agent
// runs, without stopping its pods, and brings the previous executable
// back when the new one does not come up healthy.
//
// Its nouns:
//
//   - The installed executable is the file the agent's service starts
//     (/usr/local/bin/tether-edge as `tether install edge` writes it). It
//     changes only by one rename, after a new executable proved healthy.
//   - A staged executable is a new one copied beside the installed one
//     (so that the final rename stays within one file system) under a
//     name carrying its digest, dropped from the page cache once synced
//     (Uncache: the agent then keeps only the code it runs resident), and
//     run once with `version` to show it runs on this machine.
//   - A request, written by `tether edge upgrade` into the data
//     directory, asks the running agent (with SIGUSR2, as nginx takes a
//     new binary) to try a staged executable.
//   - A trial: the agent stops as it would on SIGTERM, leaving its pods
//     running, and execs the staged executable in the same process, so
//     the service manager sees no restart. The trial's record in the data
//     directory names both executables and the deadline.
//   - Commit: the new agent, once healthy (its container runtime
//     answering and, when the old agent was connected, its node
//     registered and its tunnel connected again) for a settling time, hard-links the installed executable to
//     .NAME.previous and renames the staged one over it.
//   - Roll back: a new agent not healthy by the deadline execs the
//     installed executable again. A new agent that dies, or a machine
//     that reboots, during the trial is restarted by the service manager
//     from the installed executable, which finds the trial's record and
//     closes it as failed. Either way the installed executable is the old
//     one, untouched.
//   - The outcome of the last request (installed, rolled back, refused,
//     with the reason) stays in the data directory for `tether edge
//     upgrade` to print.
//
// Every record is written to a temporary file, synced and renamed, so a
// crash at any point leaves either the old record or the new one; each
// step above is safe to cut short by kill -9 or a power loss, and the
// next start finishes or undoes it.
package upgrade
