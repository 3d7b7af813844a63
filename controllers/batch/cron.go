package batch

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
)

// maxMissedSchedules is how many missed start times the controller will
// count before it gives up on deciding whether to start a Job.
const maxMissedSchedules = 100

// errTooManyMissed is returned, with the upstream wording, when more than
// maxMissedSchedules start times were missed.
var errTooManyMissed = errors.New("Cannot determine if job needs to be started. Too many missed start time (> 100). Set or decrease .spec.startingDeadlineSeconds or check clock skew.") //nolint:staticcheck // wording kept from upstream

// errUnknownTimeZone marks a spec.timeZone the controller cannot load.
var errUnknownTimeZone = errors.New("unknown time zone")

// cronParser reads the five standard fields and the @-macros (@hourly,
// @daily, ...). Seconds and @every are not standard cron and are refused.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseSchedule parses a CronJob's schedule in its time zone (nil means
// the controller's local zone). A TZ= or CRON_TZ= prefix in the schedule
// is refused, as upstream does: the zone belongs in spec.timeZone.
func parseSchedule(schedule string, tz *string) (cron.Schedule, *time.Location, error) {
	s := strings.TrimSpace(schedule)
	if strings.Contains(s, "TZ=") {
		return nil, nil, errors.New("CRON_TZ or TZ used in schedule is not supported, please use .spec.timeZone instead")
	}
	if strings.HasPrefix(s, "@every") {
		return nil, nil, errors.New("@every is not a standard cron schedule")
	}
	loc := time.Local
	if tz != nil {
		l, err := time.LoadLocation(*tz)
		if err != nil {
			return nil, nil, fmt.Errorf("%w %q: %v", errUnknownTimeZone, *tz, err)
		}
		loc = l
	}
	sched, err := cronParser.Parse(s)
	if err != nil {
		return nil, nil, fmt.Errorf("parse schedule %q: %w", schedule, err)
	}
	return sched, loc, nil
}

// scheduleTimes returns the most recent start time at or before now that
// has not been acted on (nil if none), the number of start times missed,
// and the next start time after now.
//
// Start times are counted from the last schedule time, or the CronJob's
// creation; with startingDeadlineSeconds, only those within the deadline
// count, which is what lets a controller that was down for long start
// again. Times are computed in loc, so "0 9 * * *" in Europe/Paris is 9:00
// there across daylight saving changes.
func scheduleTimes(cj *batchv1.CronJob, sched cron.Schedule, loc *time.Location, now time.Time) (recent *time.Time, missed int, next time.Time) {
	earliest := cj.CreationTimestamp.Time
	if cj.Status.LastScheduleTime != nil {
		earliest = cj.Status.LastScheduleTime.Time
	}
	if d := cj.Spec.StartingDeadlineSeconds; d != nil {
		if dl := now.Add(-time.Duration(*d) * time.Second); dl.After(earliest) {
			earliest = dl
		}
	}
	t := sched.Next(earliest.In(loc))
	for !t.IsZero() && !t.After(now) {
		tt := t
		recent = &tt
		missed++
		if missed > maxMissedSchedules {
			// Skip ahead: only the next time still matters.
			t = sched.Next(now.In(loc))
			return recent, missed, t
		}
		t = sched.Next(t)
	}
	return recent, missed, t
}

// jobNameFor names the Job of a start time: the CronJob's name and the
// time in minutes since the epoch, so a start time gets one Job however
// often the controller looks.
func jobNameFor(cjName string, t time.Time) string {
	return fmt.Sprintf("%s-%d", cjName, t.Unix()/60)
}
