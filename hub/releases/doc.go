// Package releases is the hub's release store: the executables of tether
// the hub holds for its agents to upgrade to, the deltas between them, the
// HTTP handlers that import and serve them, and the admission of the
// EdgeUpgrades that roll them out.
//
// Its nouns:
//
//   - A blob is an executable's bytes, kept under the store's directory as
//     sha256/HEX, named by its digest and written by rename, so a blob that
//     exists is whole.
//   - An import is `tether release import FILE` posting an executable to
//     fleetapi.ImportPath: the hub reads what it is (fleetapi.ReadExecutable),
//     signs its ReleaseSpec with the hub's release signer, keeps the blob and
//     creates the cluster-scoped Release object named after version, build
//     and architecture. The same executable imported again changes nothing;
//     another one under an existing name is a conflict.
//   - A download is a GET of fleetapi.DownloadPath(digest): the blob, with
//     ranges, so that a cut download resumes; with ?from=DIGEST the delta
//     from an older blob instead (fleetapi.EncodeDelta), computed once on
//     first request and kept as deltas/NEWHEX-OLDHEX.zst beside its own
//     digest.
//
// The handlers run behind the API server's authentication and
// authorization (non-resource rules: "post" on /fleet/releases imports,
// "get" on /fleet/releases/* downloads); the Release objects are written
// through an API client of the hub's own, as an administrator.
//
// Blobs are this hub's alone: hubs sharing a store each hold the
// executables imported on them.
package releases
