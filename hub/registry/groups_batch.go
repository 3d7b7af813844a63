package registry

import (
	"maps"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Labels the API server puts on a Job's pod template when it generates the
// selector.
const (
	jobControllerUIDLabel       = "batch.kubernetes.io/controller-uid"
	jobNameLabel                = "batch.kubernetes.io/job-name"
	legacyJobControllerUIDLabel = "controller-uid"
	legacyJobNameLabel          = "job-name"
)

// ---- Job ----

var jobKind = &Kind{
	GVK:        batchv1.SchemeGroupVersion.WithKind("Job"),
	Resource:   "jobs",
	Singular:   "job",
	Namespaced: true,
	Categories: []string{"all"},
	HasStatus:  true,
	HasSpec:    true,
	DefaultGC:  metav1.DeletePropagationOrphan,
	Default:    func(obj runtime.Object) { defaultJob(obj.(*batchv1.Job)) },
	PrepareForCreate: func(obj runtime.Object) {
		j := obj.(*batchv1.Job)
		if j.Spec.ManualSelector != nil && *j.Spec.ManualSelector {
			return
		}
		labelsFromTemplate := len(j.Labels) == 0 || maps.Equal(j.Labels, j.Spec.Template.Labels)
		generateJobSelector(j)
		if labelsFromTemplate {
			j.Labels = maps.Clone(j.Spec.Template.Labels)
		}
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		j := obj.(*batchv1.Job)
		errs := validateGeneratedSelector(j)
		return append(errs, validateJobSpec(&j.Spec, gSpec, true)...)
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		return validateJobUpdate(obj.(*batchv1.Job), old.(*batchv1.Job))
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		s, o := obj.(*batchv1.Job).Status, old.(*batchv1.Job).Status
		p := field.NewPath("status")
		var errs field.ErrorList
		errs = append(errs, nonNegative(int64(s.Active), p.Child("active"))...)
		errs = append(errs, nonNegative(int64(s.Succeeded), p.Child("succeeded"))...)
		errs = append(errs, nonNegative(int64(s.Failed), p.Child("failed"))...)
		errs = append(errs, nonNegativePtr(s.Ready, p.Child("ready"))...)
		errs = append(errs, nonNegativePtr(s.Terminating, p.Child("terminating"))...)
		if o.StartTime != nil && s.StartTime == nil && !jobFinished(s.Conditions) {
			errs = append(errs, field.Required(p.Child("startTime"), "startTime cannot be removed for unsuspended job"))
		}
		if o.CompletionTime != nil && (s.CompletionTime == nil || !s.CompletionTime.Equal(o.CompletionTime)) {
			errs = append(errs, field.Invalid(p.Child("completionTime"), s.CompletionTime, apivalidation.FieldImmutableErrorMsg))
		}
		if s.CompletionTime != nil && s.StartTime != nil && s.CompletionTime.Before(s.StartTime) {
			errs = append(errs, field.Invalid(p.Child("completionTime"), s.CompletionTime, "completionTime cannot be set before startTime"))
		}
		return errs
	},
	Fields: func(obj runtime.Object) fields.Set {
		return fields.Set{"status.successful": itoa32(obj.(*batchv1.Job).Status.Succeeded)}
	},
	FieldLabels: []string{"status.successful"},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Status", "string", 0, "Status of the job."),
		column("Completions", "string", 0, "The desired number of successfully finished pods the job should be run with."),
		column("Duration", "string", 0, "Time required to complete the job."),
		ageColumn,
		containersColumn, imagesColumn, selectorColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any { return jobCells(obj.(*batchv1.Job), now) },
}

func defaultJob(j *batchv1.Job) {
	s := &j.Spec
	if s.Completions == nil && s.Parallelism == nil {
		s.Completions = ptrTo[int32](1)
		s.Parallelism = ptrTo[int32](1)
	}
	if s.Parallelism == nil {
		s.Parallelism = ptrTo[int32](1)
	}
	if s.BackoffLimit == nil {
		if s.BackoffLimitPerIndex != nil {
			s.BackoffLimit = ptrTo[int32](math.MaxInt32)
		} else {
			s.BackoffLimit = ptrTo[int32](6)
		}
	}
	if len(j.Labels) == 0 {
		j.Labels = maps.Clone(s.Template.Labels)
	}
	if s.CompletionMode == nil {
		s.CompletionMode = ptrTo(batchv1.NonIndexedCompletion)
	}
	if s.Suspend == nil {
		s.Suspend = ptrTo(false)
	}
	if s.PodFailurePolicy != nil {
		for i := range s.PodFailurePolicy.Rules {
			for k := range s.PodFailurePolicy.Rules[i].OnPodConditions {
				c := &s.PodFailurePolicy.Rules[i].OnPodConditions[k]
				if c.Status == "" {
					c.Status = corev1.ConditionTrue
				}
			}
		}
	}
	if s.PodReplacementPolicy == nil {
		if s.PodFailurePolicy != nil {
			s.PodReplacementPolicy = ptrTo(batchv1.Failed)
		} else {
			s.PodReplacementPolicy = ptrTo(batchv1.TerminatingOrFailed)
		}
	}
	defaultPodSpec(&s.Template.Spec)
}

// generateJobSelector labels the pod template with the Job's uid and name
// and selects on the uid, as the API server does when manualSelector is not
// true.
func generateJobSelector(j *batchv1.Job) {
	uid := string(j.UID)
	if j.Spec.Template.Labels == nil {
		j.Spec.Template.Labels = map[string]string{}
	}
	for k, v := range map[string]string{
		jobControllerUIDLabel: uid, legacyJobControllerUIDLabel: uid,
		jobNameLabel: j.Name, legacyJobNameLabel: j.Name,
	} {
		if _, ok := j.Spec.Template.Labels[k]; !ok {
			j.Spec.Template.Labels[k] = v
		}
	}
	if j.Spec.Selector == nil {
		j.Spec.Selector = &metav1.LabelSelector{}
	}
	if j.Spec.Selector.MatchLabels == nil {
		j.Spec.Selector.MatchLabels = map[string]string{}
	}
	if _, ok := j.Spec.Selector.MatchLabels[jobControllerUIDLabel]; !ok {
		j.Spec.Selector.MatchLabels[jobControllerUIDLabel] = uid
	}
}

// validateGeneratedSelector checks, unless manualSelector is true, that the
// selector and template labels carry the Job's uid.
func validateGeneratedSelector(j *batchv1.Job) field.ErrorList {
	if j.Spec.ManualSelector != nil && *j.Spec.ManualSelector {
		return nil
	}
	var errs field.ErrorList
	uid := string(j.UID)
	lp := gSpec.Child("template", "metadata", "labels")
	if v, ok := j.Spec.Template.Labels[jobControllerUIDLabel]; ok && v != uid {
		errs = append(errs, field.Invalid(lp.Key(jobControllerUIDLabel), v, "must be '"+uid+"'"))
	}
	if v, ok := j.Spec.Template.Labels[legacyJobControllerUIDLabel]; ok && v != uid {
		errs = append(errs, field.Invalid(lp.Key(legacyJobControllerUIDLabel), v, "must be '"+uid+"'"))
	}
	if j.Spec.Selector == nil {
		return errs
	}
	if v, ok := j.Spec.Selector.MatchLabels[jobControllerUIDLabel]; !ok || v != uid {
		errs = append(errs, field.Invalid(gSpec.Child("selector"), j.Spec.Selector, "`selector` not auto-generated"))
	}
	return errs
}

// validateJobSpec checks a Job's spec; forJob is false for a CronJob's job
// template, where the selector may be absent.
func validateJobSpec(s *batchv1.JobSpec, path *field.Path, forJob bool) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, nonNegativePtr(s.Parallelism, path.Child("parallelism"))...)
	errs = append(errs, nonNegativePtr(s.Completions, path.Child("completions"))...)
	errs = append(errs, nonNegativePtr(s.BackoffLimit, path.Child("backoffLimit"))...)
	if s.ActiveDeadlineSeconds != nil && *s.ActiveDeadlineSeconds <= 0 {
		errs = append(errs, field.Invalid(path.Child("activeDeadlineSeconds"), *s.ActiveDeadlineSeconds, "must be greater than 0"))
	}
	if s.TTLSecondsAfterFinished != nil {
		errs = append(errs, nonNegative(int64(*s.TTLSecondsAfterFinished), path.Child("ttlSecondsAfterFinished"))...)
	}
	if s.CompletionMode != nil {
		switch *s.CompletionMode {
		case batchv1.NonIndexedCompletion:
		case batchv1.IndexedCompletion:
			if s.Completions == nil {
				errs = append(errs, field.Required(path.Child("completions"), "when completion mode is Indexed"))
			}
		default:
			errs = append(errs, field.NotSupported(path.Child("completionMode"), *s.CompletionMode,
				[]string{string(batchv1.NonIndexedCompletion), string(batchv1.IndexedCompletion)}))
		}
	}
	if s.PodReplacementPolicy != nil {
		switch *s.PodReplacementPolicy {
		case batchv1.TerminatingOrFailed:
			if s.PodFailurePolicy != nil {
				errs = append(errs, field.NotSupported(path.Child("podReplacementPolicy"), *s.PodReplacementPolicy, []string{string(batchv1.Failed)}))
			}
		case batchv1.Failed:
		default:
			errs = append(errs, field.NotSupported(path.Child("podReplacementPolicy"), *s.PodReplacementPolicy,
				[]string{string(batchv1.Failed), string(batchv1.TerminatingOrFailed)}))
		}
	}
	if s.Selector == nil {
		if forJob {
			errs = append(errs, field.Required(path.Child("selector"), ""))
		}
	} else {
		errs = append(errs, validateWorkloadSelector(s.Selector, &s.Template, "", path)...)
	}
	tp := path.Child("template")
	errs = append(errs, validatePodTemplateSpec(&s.Template, tp)...)
	rp := s.Template.Spec.RestartPolicy
	if rp != corev1.RestartPolicyOnFailure && rp != corev1.RestartPolicyNever {
		errs = append(errs, field.NotSupported(tp.Child("spec", "restartPolicy"), rp,
			[]string{string(corev1.RestartPolicyOnFailure), string(corev1.RestartPolicyNever)}))
	}
	return errs
}

func validateJobUpdate(j, o *batchv1.Job) field.ErrorList {
	errs := validateJobSpec(&j.Spec, gSpec, true)
	errs = append(errs, apivalidation.ValidateImmutableField(j.Spec.Selector, o.Spec.Selector, gSpec.Child("selector"))...)
	errs = append(errs, apivalidation.ValidateImmutableField(j.Spec.CompletionMode, o.Spec.CompletionMode, gSpec.Child("completionMode"))...)
	errs = append(errs, apivalidation.ValidateImmutableField(j.Spec.PodFailurePolicy, o.Spec.PodFailurePolicy, gSpec.Child("podFailurePolicy"))...)
	errs = append(errs, apivalidation.ValidateImmutableField(j.Spec.BackoffLimitPerIndex, o.Spec.BackoffLimitPerIndex, gSpec.Child("backoffLimitPerIndex"))...)
	// Indexed Jobs may change completions together with parallelism.
	elastic := j.Spec.CompletionMode != nil && *j.Spec.CompletionMode == batchv1.IndexedCompletion &&
		j.Spec.Completions != nil && j.Spec.Parallelism != nil && *j.Spec.Completions == *j.Spec.Parallelism &&
		o.Spec.Completions != nil && o.Spec.Parallelism != nil && *o.Spec.Completions == *o.Spec.Parallelism
	if !elastic {
		errs = append(errs, apivalidation.ValidateImmutableField(j.Spec.Completions, o.Spec.Completions, gSpec.Child("completions"))...)
	}
	// The template may change only in scheduling directives while the Job
	// is suspended and has not started, and in scheduling gates.
	a, b := j.Spec.Template.DeepCopy(), o.Spec.Template.DeepCopy()
	b.Spec.SchedulingGates = a.Spec.SchedulingGates
	if o.Spec.Suspend != nil && *o.Spec.Suspend && o.Status.StartTime == nil {
		b.Spec.NodeSelector, b.Spec.Affinity, b.Spec.Tolerations = a.Spec.NodeSelector, a.Spec.Affinity, a.Spec.Tolerations
		b.Labels, b.Annotations = a.Labels, a.Annotations
	}
	if !apiequality.Semantic.DeepEqual(a, b) {
		errs = append(errs, field.Invalid(gSpec.Child("template"), j.Spec.Template, apivalidation.FieldImmutableErrorMsg))
	}
	return errs
}

func jobFinished(conds []batchv1.JobCondition) bool {
	return jobHasCondition(conds, batchv1.JobComplete) || jobHasCondition(conds, batchv1.JobFailed)
}

func jobHasCondition(conds []batchv1.JobCondition, t batchv1.JobConditionType) bool {
	for _, c := range conds {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func jobCells(j *batchv1.Job, now time.Time) []any {
	var completions string
	switch {
	case j.Spec.Completions != nil:
		completions = ratio(j.Status.Succeeded, *j.Spec.Completions)
	case j.Spec.Parallelism != nil && *j.Spec.Parallelism > 1:
		completions = strconv.Itoa(int(j.Status.Succeeded)) + "/1 of " + strconv.Itoa(int(*j.Spec.Parallelism))
	default:
		completions = strconv.Itoa(int(j.Status.Succeeded)) + "/1"
	}
	var dur string
	switch {
	case j.Status.StartTime == nil:
	case j.Status.CompletionTime == nil:
		dur = duration.HumanDuration(now.Sub(j.Status.StartTime.Time))
	default:
		dur = duration.HumanDuration(j.Status.CompletionTime.Sub(j.Status.StartTime.Time))
	}
	status := "Running"
	c := j.Status.Conditions
	switch {
	case jobHasCondition(c, batchv1.JobComplete):
		status = "Complete"
	case jobHasCondition(c, batchv1.JobFailed):
		status = "Failed"
	case j.DeletionTimestamp != nil:
		status = "Terminating"
	case jobHasCondition(c, batchv1.JobSuspended):
		status = "Suspended"
	case jobHasCondition(c, batchv1.JobFailureTarget):
		status = "FailureTarget"
	case jobHasCondition(c, batchv1.JobSuccessCriteriaMet):
		status = "SuccessCriteriaMet"
	}
	names, images := podContainersCells(&j.Spec.Template.Spec)
	return []any{j.Name, status, completions, dur, age(j.CreationTimestamp, now), names, images, selectorString(j.Spec.Selector)}
}

// ---- CronJob ----

var cronJobKind = &Kind{
	GVK:        batchv1.SchemeGroupVersion.WithKind("CronJob"),
	Resource:   "cronjobs",
	Singular:   "cronjob",
	Namespaced: true,
	ShortNames: []string{"cj"},
	Categories: []string{"all"},
	HasStatus:  true,
	HasSpec:    true,
	Default: func(obj runtime.Object) {
		c := obj.(*batchv1.CronJob)
		if c.Spec.ConcurrencyPolicy == "" {
			c.Spec.ConcurrencyPolicy = batchv1.AllowConcurrent
		}
		if c.Spec.Suspend == nil {
			c.Spec.Suspend = ptrTo(false)
		}
		if c.Spec.SuccessfulJobsHistoryLimit == nil {
			c.Spec.SuccessfulJobsHistoryLimit = ptrTo[int32](3)
		}
		if c.Spec.FailedJobsHistoryLimit == nil {
			c.Spec.FailedJobsHistoryLimit = ptrTo[int32](1)
		}
		defaultPodSpec(&c.Spec.JobTemplate.Spec.Template.Spec)
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		c := obj.(*batchv1.CronJob)
		var errs field.ErrorList
		if len(c.Name) > 52 {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), c.Name, "must be no more than 52 characters"))
		}
		return append(errs, validateCronJobSpec(&c.Spec, true)...)
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		c, o := obj.(*batchv1.CronJob), old.(*batchv1.CronJob)
		// A schedule stored before a rule tightened stays acceptable.
		return validateCronJobSpec(&c.Spec, c.Spec.Schedule != o.Spec.Schedule || !apiequality.Semantic.DeepEqual(c.Spec.TimeZone, o.Spec.TimeZone))
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Schedule", "string", 0, "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron."),
		column("Timezone", "string", 0, "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones."),
		column("Suspend", "boolean", 0, "This flag tells the controller to suspend subsequent executions."),
		column("Active", "integer", 0, "A list of pointers to currently running jobs."),
		column("Last Schedule", "string", 0, "Information when was the last time the job was successfully scheduled."),
		ageColumn,
		containersColumn, imagesColumn, selectorColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		c := obj.(*batchv1.CronJob)
		last := "<none>"
		if c.Status.LastScheduleTime != nil {
			last = age(*c.Status.LastScheduleTime, now)
		}
		tz := "<none>"
		if c.Spec.TimeZone != nil {
			tz = *c.Spec.TimeZone
		}
		suspend := "<unset>"
		switch {
		case c.Spec.Suspend == nil:
		case *c.Spec.Suspend:
			suspend = "True"
		default:
			suspend = "False"
		}
		names, images := podContainersCells(&c.Spec.JobTemplate.Spec.Template.Spec)
		return []any{c.Name, c.Spec.Schedule, tz, suspend, int64(len(c.Status.Active)), last, age(c.CreationTimestamp, now),
			names, images, metav1.FormatLabelSelector(c.Spec.JobTemplate.Spec.Selector)}
	},
}

func validateCronJobSpec(s *batchv1.CronJobSpec, checkSchedule bool) field.ErrorList {
	var errs field.ErrorList
	sp := gSpec.Child("schedule")
	if s.Schedule == "" {
		errs = append(errs, field.Required(sp, ""))
	} else if checkSchedule {
		errs = append(errs, validateSchedule(s.Schedule, s.TimeZone, sp)...)
	}
	if s.TimeZone != nil {
		tp := gSpec.Child("timeZone")
		const msg = "unknown time zone "
		if *s.TimeZone == "" || strings.EqualFold(*s.TimeZone, "Local") {
			errs = append(errs, field.Invalid(tp, *s.TimeZone, "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones"))
		} else if _, err := time.LoadLocation(*s.TimeZone); err != nil {
			errs = append(errs, field.Invalid(tp, *s.TimeZone, msg+*s.TimeZone))
		}
	}
	if s.StartingDeadlineSeconds != nil {
		errs = append(errs, nonNegative(*s.StartingDeadlineSeconds, gSpec.Child("startingDeadlineSeconds"))...)
	}
	switch s.ConcurrencyPolicy {
	case batchv1.AllowConcurrent, batchv1.ForbidConcurrent, batchv1.ReplaceConcurrent:
	case "":
		errs = append(errs, field.Required(gSpec.Child("concurrencyPolicy"), ""))
	default:
		errs = append(errs, field.NotSupported(gSpec.Child("concurrencyPolicy"), s.ConcurrencyPolicy,
			[]string{string(batchv1.AllowConcurrent), string(batchv1.ForbidConcurrent), string(batchv1.ReplaceConcurrent)}))
	}
	errs = append(errs, nonNegativePtr(s.SuccessfulJobsHistoryLimit, gSpec.Child("successfulJobsHistoryLimit"))...)
	errs = append(errs, nonNegativePtr(s.FailedJobsHistoryLimit, gSpec.Child("failedJobsHistoryLimit"))...)
	jp := gSpec.Child("jobTemplate")
	if s.JobTemplate.Spec.ManualSelector != nil && *s.JobTemplate.Spec.ManualSelector {
		errs = append(errs, field.NotSupported(jp.Child("spec", "manualSelector"), s.JobTemplate.Spec.ManualSelector, []string{"nil", "false"}))
	}
	errs = append(errs, validateJobSpec(&s.JobTemplate.Spec, jp.Child("spec"), false)...)
	return errs
}

// validateSchedule checks a standard five-field cron schedule (or an
// @hourly-style macro) and the rules on time zones inside it.
func validateSchedule(schedule string, tz *string, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if _, err := cron.ParseStandard(schedule); err != nil {
		errs = append(errs, field.Invalid(path, schedule, err.Error()))
	}
	if strings.Contains(schedule, "TZ") {
		if tz != nil {
			errs = append(errs, field.Invalid(path, schedule, "cannot use both timeZone field and TZ or CRON_TZ in schedule"))
		} else {
			errs = append(errs, field.Invalid(path, schedule, "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"))
		}
	}
	return errs
}
