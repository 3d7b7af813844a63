package batch

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// AnnotationScheduledTimestamp records on a CronJob's Job the start time it
// was created for.
const AnnotationScheduledTimestamp = batchv1.CronJobScheduledTimestampAnnotation

func (c *Controller) registerCronJobHandlers(cjInf, jobInf cache.SharedIndexInformer) error {
	enqueue := func(obj any) {
		if key, ok := kit.Key(obj); ok {
			c.cronQueue.Add(key)
		}
	}
	if _, err := cjInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(o, n any) {
			oc, ok1 := o.(*batchv1.CronJob)
			nc, ok2 := n.(*batchv1.CronJob)
			if ok1 && ok2 && oc.ResourceVersion == nc.ResourceVersion {
				return
			}
			enqueue(n)
		},
	}); err != nil {
		return fmt.Errorf("add cronjob handler: %w", err)
	}
	// A Job's change concerns the CronJob that controls it.
	byOwner := func(obj any) {
		obj = kit.Tombstone(obj)
		j, ok := obj.(*batchv1.Job)
		if !ok {
			return
		}
		if ref := metav1.GetControllerOf(j); ref != nil && ref.Kind == "CronJob" && ref.APIVersion == batchv1.SchemeGroupVersion.String() {
			c.cronQueue.Add(j.Namespace + "/" + ref.Name)
		}
	}
	if _, err := jobInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    byOwner,
		UpdateFunc: func(_, n any) { byOwner(n) },
		DeleteFunc: byOwner,
	}); err != nil {
		return fmt.Errorf("add job handler: %w", err)
	}
	return nil
}

// syncCron syncs a queued CronJob and has the queue bring it back at its
// next start time.
func (c *Controller) syncCron(ctx context.Context, key string) error {
	next, err := c.syncCronJob(ctx, key)
	if err != nil {
		return err
	}
	return kit.RequeueAfter(next)
}

func isJobFinished(j *batchv1.Job) (batchv1.JobConditionType, bool) {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return c.Type, true
		}
	}
	return "", false
}

func jobRef(j *batchv1.Job) corev1.ObjectReference {
	return corev1.ObjectReference{
		APIVersion: batchv1.SchemeGroupVersion.String(), Kind: "Job",
		Namespace: j.Namespace, Name: j.Name, UID: j.UID, ResourceVersion: j.ResourceVersion,
	}
}

// syncCronJob reconciles one CronJob: it refreshes its active list, starts
// the Job of the latest start time if due, trims the finished Jobs, and
// returns when to look again (the next start time).
func (c *Controller) syncCronJob(ctx context.Context, key string) (time.Duration, error) {
	ns, name := kit.SplitKey(key)
	cached, err := c.cronJobs.CronJobs(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("get cronjob: %w", err)
	}
	cj := cached.DeepCopy()
	jobs := kit.ByIndex[*batchv1.Job](c.jobIdx, string(cj.UID))
	now := c.cfg.Clock.Now()

	statusChanged := c.refreshActive(ctx, cj, jobs)
	updateStatus := func() error {
		if !statusChanged && apiequality.Semantic.DeepEqual(cj.Status, cached.Status) {
			return nil
		}
		got, err := c.cfg.Client.BatchV1().CronJobs(ns).UpdateStatus(ctx, cj, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("update cronjob status: %w", err)
		}
		cj = got
		return nil
	}
	if cj.DeletionTimestamp != nil {
		return 0, updateStatus()
	}

	sched, loc, err := parseSchedule(cj.Spec.Schedule, cj.Spec.TimeZone)
	if err != nil {
		reason := "UnparseableSchedule"
		if errors.Is(err, errUnknownTimeZone) {
			reason = "UnknownTimeZone"
		}
		c.events.Eventf(cj, corev1.EventTypeWarning, reason, "%v", err)
		// Nothing to wait for: a change of the spec requeues it.
		return 0, updateStatus()
	}
	if err := c.cleanupHistory(ctx, cj, jobs); err != nil {
		c.log.Info("trim cronjob history", "cronjob", key, "err", err)
	}
	if cj.Spec.Suspend != nil && *cj.Spec.Suspend {
		return 0, updateStatus()
	}

	recent, missed, next := scheduleTimes(cj, sched, loc, now)
	wait := next.Sub(now)
	if recent == nil {
		return wait, updateStatus()
	}
	if missed > maxMissedSchedules {
		c.events.Eventf(cj, corev1.EventTypeWarning, "FailedNeedsStart", "%v", errTooManyMissed)
		return wait, updateStatus()
	}
	if d := cj.Spec.StartingDeadlineSeconds; d != nil && recent.Add(time.Duration(*d)*time.Second).Before(now) {
		c.events.Eventf(cj, corev1.EventTypeWarning, "MissSchedule", "Missed scheduled time to start a job: %s", recent.UTC().Format(time.RFC1123Z))
		return wait, updateStatus()
	}
	jobName := jobNameFor(cj.Name, *recent)
	if slices.ContainsFunc(cj.Status.Active, func(r corev1.ObjectReference) bool { return r.Name == jobName }) ||
		(cj.Status.LastScheduleTime != nil && cj.Status.LastScheduleTime.Time.Equal(*recent)) {
		return wait, updateStatus()
	}

	switch cj.Spec.ConcurrencyPolicy {
	case batchv1.ForbidConcurrent:
		if len(cj.Status.Active) > 0 {
			// Counted as missed; if no deadline passes first, it starts
			// as soon as the running Job ends.
			c.events.Eventf(cj, corev1.EventTypeNormal, "JobAlreadyActive", "Not starting job because prior execution is running and concurrency policy is Forbid")
			return wait, updateStatus()
		}
	case batchv1.ReplaceConcurrent:
		for _, ref := range cj.Status.Active {
			err := c.cfg.Client.BatchV1().Jobs(ns).Delete(ctx, ref.Name, metav1.DeleteOptions{
				PropagationPolicy: new(metav1.DeletePropagationBackground),
				Preconditions:     &metav1.Preconditions{UID: &ref.UID},
			})
			if err != nil && !apierrors.IsNotFound(err) {
				c.events.Eventf(cj, corev1.EventTypeWarning, "FailedDelete", "Deleted job: %v", err)
				return 0, fmt.Errorf("delete active job %s: %w", ref.Name, err)
			}
			c.events.Eventf(cj, corev1.EventTypeNormal, "SuccessfulDelete", "Deleted job %v", ref.Name)
		}
		cj.Status.Active = nil
		statusChanged = true
	}

	job := jobFromCronJob(cj, *recent, loc)
	created, err := c.cfg.Client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		// Created by an earlier pass whose status write was lost: take
		// it if it is ours.
		existing, gerr := c.cfg.Client.BatchV1().Jobs(ns).Get(ctx, jobName, metav1.GetOptions{})
		if gerr != nil {
			return 0, fmt.Errorf("get existing job: %w", gerr)
		}
		if ref := metav1.GetControllerOf(existing); ref == nil || ref.UID != cj.UID {
			c.events.Eventf(cj, corev1.EventTypeWarning, "FailedCreate", "Error creating job: a job named %s exists and is not controlled by this CronJob", jobName)
			return wait, updateStatus()
		}
		created = existing
	case err != nil:
		c.events.Eventf(cj, corev1.EventTypeWarning, "FailedCreate", "Error creating job: %v", err)
		return 0, fmt.Errorf("create job: %w", err)
	default:
		c.events.Eventf(cj, corev1.EventTypeNormal, "SuccessfulCreate", "Created job %v", created.Name)
	}
	if _, done := isJobFinished(created); !done {
		cj.Status.Active = append(cj.Status.Active, jobRef(created))
	}
	cj.Status.LastScheduleTime = &metav1.Time{Time: *recent}
	statusChanged = true
	return wait, updateStatus()
}

// refreshActive brings the active list in line with the CronJob's Jobs:
// finished ones leave it (and advance lastSuccessfulTime), running ones it
// lacks join it, and missing ones are dropped. It reports a change.
func (c *Controller) refreshActive(ctx context.Context, cj *batchv1.CronJob, jobs []*batchv1.Job) bool {
	changed := false
	byUID := map[string]*batchv1.Job{}
	for _, j := range jobs {
		byUID[string(j.UID)] = j
	}
	inActive := map[string]bool{}
	var active []corev1.ObjectReference
	for _, ref := range cj.Status.Active {
		j, ok := byUID[string(ref.UID)]
		if !ok {
			// Not in the cache: check the hub before dropping it.
			live, err := c.cfg.Client.BatchV1().Jobs(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && live.UID != ref.UID) {
				c.events.Eventf(cj, corev1.EventTypeNormal, "MissingJob", "Active job went missing: %v", ref.Name)
				changed = true
				continue
			}
			if err != nil {
				active = append(active, ref)
				inActive[string(ref.UID)] = true
				continue
			}
			j = live
		}
		if cond, done := isJobFinished(j); done {
			c.events.Eventf(cj, corev1.EventTypeNormal, "SawCompletedJob", "Saw completed job: %s, status: %s", j.Name, cond)
			changed = true
			continue
		}
		active = append(active, ref)
		inActive[string(ref.UID)] = true
	}
	for _, j := range jobs {
		cond, done := isJobFinished(j)
		if done && cond == batchv1.JobComplete && j.Status.CompletionTime != nil {
			if cj.Status.LastSuccessfulTime == nil || cj.Status.LastSuccessfulTime.Before(j.Status.CompletionTime) {
				cj.Status.LastSuccessfulTime = j.Status.CompletionTime.DeepCopy()
				changed = true
			}
		}
		if !done && !inActive[string(j.UID)] && j.DeletionTimestamp == nil {
			active = append(active, jobRef(j))
			changed = true
		}
	}
	cj.Status.Active = active
	return changed
}

// jobFromCronJob builds the Job of a start time from the template.
func jobFromCronJob(cj *batchv1.CronJob, t time.Time, loc *time.Location) *batchv1.Job {
	tmpl := cj.Spec.JobTemplate.DeepCopy()
	ann := maps.Clone(tmpl.Annotations)
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationScheduledTimestamp] = t.In(loc).Format(time.RFC3339)
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:            jobNameFor(cj.Name, t),
			Namespace:       cj.Namespace,
			Labels:          maps.Clone(tmpl.Labels),
			Annotations:     ann,
			OwnerReferences: []metav1.OwnerReference{kit.ControllerRef(cj, cronJobGVK)},
		},
		Spec: tmpl.Spec,
	}
}

// cleanupHistory deletes the oldest finished Jobs beyond the history
// limits. A nil limit keeps them all.
func (c *Controller) cleanupHistory(ctx context.Context, cj *batchv1.CronJob, jobs []*batchv1.Job) error {
	var succeeded, failed []*batchv1.Job
	for _, j := range jobs {
		if j.DeletionTimestamp != nil {
			continue
		}
		switch cond, done := isJobFinished(j); {
		case !done:
		case cond == batchv1.JobComplete:
			succeeded = append(succeeded, j)
		default:
			failed = append(failed, j)
		}
	}
	var errs []error
	trim := func(list []*batchv1.Job, limit *int32) {
		if limit == nil || len(list) <= int(*limit) {
			return
		}
		slices.SortFunc(list, func(a, b *batchv1.Job) int { return startOf(a).Compare(startOf(b)) })
		for _, j := range list[:len(list)-int(*limit)] {
			err := c.cfg.Client.BatchV1().Jobs(j.Namespace).Delete(ctx, j.Name, metav1.DeleteOptions{
				PropagationPolicy: new(metav1.DeletePropagationBackground),
				Preconditions:     &metav1.Preconditions{UID: &j.UID},
			})
			if err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete finished job %s: %w", j.Name, err))
				continue
			}
			c.events.Eventf(cj, corev1.EventTypeNormal, "SuccessfulDelete", "Deleted job %v", j.Name)
		}
	}
	trim(succeeded, cj.Spec.SuccessfulJobsHistoryLimit)
	trim(failed, cj.Spec.FailedJobsHistoryLimit)
	return errors.Join(errs...)
}

func startOf(j *batchv1.Job) time.Time {
	if j.Status.StartTime != nil {
		return j.Status.StartTime.Time
	}
	return j.CreationTimestamp.Time
}
