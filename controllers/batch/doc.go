// Package batch runs Jobs to completion and starts Jobs from CronJobs.
//
// # Jobs
//
// The Job controller creates a Job's pods from its template, with the
// Job as controller and the batch.kubernetes.io/job-tracking finalizer,
// until completions pods succeeded (or, with no completions, until one
// did and none is left running), never running more than parallelism at
// once. Indexed Jobs give each pod a completion index: in the
// batch.kubernetes.io/job-completion-index annotation and label, the
// JOB_COMPLETION_INDEX variable, and the hostname <job>-<index>.
//
// Ended pods are counted without ever counting one twice, as upstream
// does: a pod's UID goes into status.uncountedTerminatedPods first, then
// its finalizer is removed, then it moves into succeeded or failed (and
// completedIndexes or failedIndexes). Failed pods are replaced after a
// back-off that starts at 10s and doubles up to 6 minutes; past
// backoffLimit (or backoffLimitPerIndex for an index), past
// activeDeadlineSeconds, or on a podFailurePolicy FailJob rule, the Job
// gets FailureTarget, its pods are deleted, and it is Failed once they are
// gone. Meeting its completions or its successPolicy gives it
// SuccessCriteriaMet, then Complete. A suspended Job has its running pods
// deleted (not counted as failures) and the Suspended condition. A
// finished Job with ttlSecondsAfterFinished is deleted, with its pods,
// that long after it finished.
//
// # CronJobs
//
// The CronJob controller reads the standard five-field schedule and the
// @yearly, @monthly, @weekly, @daily and @hourly macros, in spec.timeZone
// (or the hub's zone). At each start time it creates the Job
// <cronjob>-<start time in minutes since the epoch>, annotated with
// batch.kubernetes.io/cronjob-scheduled-timestamp, unless it is suspended,
// the start is later than startingDeadlineSeconds allows, more than 100
// start times were missed (counted within startingDeadlineSeconds when
// set), or concurrencyPolicy Forbid finds a Job running; Replace deletes
// the running Jobs first. It keeps active, lastScheduleTime and
// lastSuccessfulTime, trims finished Jobs to the history limits, and looks
// at each CronJob again exactly at its next start time, with no polling.
package batch
