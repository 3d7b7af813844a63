package batch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// jobState is one sync of one Job: what its pods say, and what to do.
type jobState struct {
	c    *Controller
	job  *batchv1.Job
	orig batchv1.JobStatus
	pods []*corev1.Pod
	mem  *jobMemory
	now  time.Time

	indexed     bool
	completions int // -1 when unset
	parallelism int
	suspended   bool
	perIndex    bool

	active      []*corev1.Pod // running or pending, not being deleted
	terminating []*corev1.Pod // being deleted, not yet ended
	ready       int

	completed indexSet
	failedIdx indexSet
	byUID     map[types.UID]*corev1.Pod
	failJob   string // message of a matched FailJob rule
}

func newJobState(c *Controller, job *batchv1.Job, pods []*corev1.Pod, mem *jobMemory, now time.Time) *jobState {
	s := &jobState{
		c: c, job: job, orig: *job.Status.DeepCopy(), pods: pods, mem: mem, now: now,
		indexed:     job.Spec.CompletionMode != nil && *job.Spec.CompletionMode == batchv1.IndexedCompletion,
		completions: -1, parallelism: 1,
		suspended: job.Spec.Suspend != nil && *job.Spec.Suspend,
		perIndex:  job.Spec.BackoffLimitPerIndex != nil,
		byUID:     map[types.UID]*corev1.Pod{},
	}
	if job.Spec.Completions != nil {
		s.completions = int(*job.Spec.Completions)
	}
	if job.Spec.Parallelism != nil {
		s.parallelism = int(*job.Spec.Parallelism)
	}
	s.indexed = s.indexed && s.completions >= 0
	s.perIndex = s.perIndex && s.indexed
	s.completed = parseIndexes(job.Status.CompletedIndexes, s.completions)
	s.failedIdx = indexSet{}
	if job.Status.FailedIndexes != nil {
		s.failedIdx = parseIndexes(*job.Status.FailedIndexes, s.completions)
	}
	for _, p := range pods {
		s.byUID[p.UID] = p
		switch {
		case isTerminal(p):
		case p.DeletionTimestamp == nil:
			s.active = append(s.active, p)
			if kit.IsPodReady(p) {
				s.ready++
			}
		default:
			s.terminating = append(s.terminating, p)
		}
	}
	return s
}

func (s *jobState) key() string { return s.job.Namespace + "/" + s.job.Name }

func (s *jobState) hasFinalizer(p *corev1.Pod) bool {
	return slices.Contains(p.Finalizers, TrackingFinalizer) && !s.mem.removed[p.UID]
}

// targetSet says whether the Job is already bound to finish.
func (s *jobState) targetSet() bool {
	return conditionTrue(s.job, batchv1.JobFailureTarget) || conditionTrue(s.job, batchv1.JobSuccessCriteriaMet)
}

func (s *jobState) run(ctx context.Context, key string) error {
	c, job := s.c, s.job
	s.suspendAndStart()

	// Count the pods that ended, in two steps so a crash in between
	// never counts a pod twice or loses it: first their UIDs go into
	// uncountedTerminatedPods, then their finalizers go, then they move
	// into the counts.
	release, newUncounted := s.newlyEnded()
	if newUncounted {
		got, err := c.writeStatus(ctx, job, &s.orig)
		if err != nil {
			return err
		}
		s.job, s.orig = got, *got.Status.DeepCopy()
		job = s.job
	}
	var errs []error
	for _, p := range release {
		if err := c.removeFinalizer(ctx, p); err != nil {
			errs = append(errs, err)
			continue
		}
		s.mem.removed[p.UID] = true
	}
	s.moveUncounted()

	s.decideTarget()
	if s.targetSet() {
		errs = append(errs, s.deletePods(ctx, s.active))
		s.finishIfDone()
	} else if s.suspended {
		errs = append(errs, s.deletePods(ctx, s.active))
	} else if c.expect.Satisfied(key) {
		errs = append(errs, s.manage(ctx))
	}

	job.Status.Active = int32(len(s.active))
	job.Status.Ready = new(int32(s.ready))
	job.Status.Terminating = new(int32(len(s.terminating)))
	job.Status.CompletedIndexes = s.completed.String()
	if !s.indexed {
		job.Status.CompletedIndexes = ""
	}
	if s.perIndex {
		job.Status.FailedIndexes = new(s.failedIdx.String())
	}
	if _, err := c.writeStatus(ctx, job, &s.orig); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if _, done := isJobFinished(job); done {
		c.jobQueue.Add(key) // for its time to live
		return nil
	}
	if d := job.Spec.ActiveDeadlineSeconds; d != nil && !s.suspended && job.Status.StartTime != nil && !s.targetSet() {
		c.jobQueue.AddAfter(key, job.Status.StartTime.Add(time.Duration(*d)*time.Second).Sub(s.now)+10*time.Millisecond)
	}
	return nil
}

// suspendAndStart keeps the Suspended condition and startTime in line
// with spec.suspend.
func (s *jobState) suspendAndStart() {
	job, now := s.job, s.now
	switch {
	case s.suspended && !s.targetSet():
		if setCondition(job, batchv1.JobSuspended, corev1.ConditionTrue, reasonSuspended, messageSuspended, now) {
			s.c.events.Eventf(job, corev1.EventTypeNormal, reasonSuspendedEvent, "Job suspended")
		}
	case !s.suspended && conditionTrue(job, batchv1.JobSuspended):
		setCondition(job, batchv1.JobSuspended, corev1.ConditionFalse, reasonResumed, messageResumed, now)
		s.c.events.Eventf(job, corev1.EventTypeNormal, reasonResumedEvent, "Job resumed")
		// The active deadline counts from the resumption.
		job.Status.StartTime = new(metaTime(now))
	}
	if !s.suspended && job.Status.StartTime == nil {
		job.Status.StartTime = new(metaTime(now))
	}
}

// newlyEnded records the pods that ended since the last count in
// uncountedTerminatedPods, and returns the pods whose finalizer can go.
func (s *jobState) newlyEnded() ([]*corev1.Pod, bool) {
	job := s.job
	unc := &job.Status.UncountedTerminatedPods
	if *unc == nil {
		*unc = &batchv1.UncountedTerminatedPods{}
	}
	succ, fail := uidSet((*unc).Succeeded), uidSet((*unc).Failed)
	var release []*corev1.Pod
	added := false
	for _, p := range s.pods {
		if !s.hasFinalizer(p) {
			continue
		}
		if succ.Has(p.UID) || fail.Has(p.UID) {
			release = append(release, p) // an earlier pass stopped short
			continue
		}
		switch {
		case p.Status.Phase == corev1.PodSucceeded:
			succ.Insert(p.UID)
			added = true
			release = append(release, p)
			s.mem.failures = 0
		case p.Status.Phase == corev1.PodFailed && p.DeletionTimestamp != nil && (s.suspended || s.targetSet()):
			// Killed because the Job deleted it: not a failure.
			release = append(release, p)
		case p.Status.Phase == corev1.PodFailed:
			action, msg := matchFailurePolicy(job.Spec.PodFailurePolicy, p)
			release = append(release, p)
			if action == actionIgnore {
				continue // replaced, never counted
			}
			s.countFailure(p, action, msg)
			fail.Insert(p.UID)
			added = true
		case p.DeletionTimestamp != nil:
			// Deleted before it ended. A pod the Job itself deleted
			// (suspension, finishing) is not a failure; any other
			// counts as one, unless a failure policy needs its exit
			// status first.
			if s.suspended || s.targetSet() {
				release = append(release, p)
				continue
			}
			if job.Spec.PodFailurePolicy != nil {
				continue
			}
			s.countFailure(p, actionCount, "")
			fail.Insert(p.UID)
			added = true
			release = append(release, p)
		}
	}
	(*unc).Succeeded, (*unc).Failed = sortedUIDs(succ), sortedUIDs(fail)
	return release, added
}

func sortedUIDs(s sets.Set[types.UID]) []types.UID {
	if len(s) == 0 {
		return nil
	}
	out := make([]types.UID, 0, len(s))
	for u := range s {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

// countFailure applies a failed pod to the back-off and the failure
// policy.
func (s *jobState) countFailure(p *corev1.Pod, action failureAction, msg string) {
	s.mem.failures++
	s.mem.lastFailure = s.now
	switch action {
	case actionFailJob:
		if s.failJob == "" {
			s.failJob = msg
		}
	case actionFailIndex:
		if i := podIndex(p); s.perIndex && i >= 0 {
			s.failedIdx[i] = true
		}
	default:
		if i := podIndex(p); s.perIndex && i >= 0 && indexFailures(p)+1 > int(*s.job.Spec.BackoffLimitPerIndex) {
			s.failedIdx[i] = true
		}
	}
}

// indexFailures reads how many earlier pods of the pod's index failed.
func indexFailures(p *corev1.Pod) int {
	n, err := strconv.Atoi(p.Annotations[AnnotationIndexFailures])
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// moveUncounted moves the pods whose finalizer is gone from
// uncountedTerminatedPods into the counts.
func (s *jobState) moveUncounted() {
	unc := s.job.Status.UncountedTerminatedPods
	if unc == nil {
		return
	}
	gone := func(u types.UID) bool {
		p, ok := s.byUID[u]
		return !ok || s.mem.removed[u] || !slices.Contains(p.Finalizers, TrackingFinalizer)
	}
	var keepS, keepF []types.UID
	for _, u := range unc.Succeeded {
		if !gone(u) {
			keepS = append(keepS, u)
			continue
		}
		s.job.Status.Succeeded++
		if p, ok := s.byUID[u]; ok && s.indexed {
			if i := podIndex(p); i >= 0 && i < s.completions {
				s.completed[i] = true
			}
		}
	}
	for _, u := range unc.Failed {
		if !gone(u) {
			keepF = append(keepF, u)
			continue
		}
		s.job.Status.Failed++
	}
	unc.Succeeded, unc.Failed = keepS, keepF
	if len(keepS)+len(keepF) == 0 {
		s.job.Status.UncountedTerminatedPods = nil
	}
	// A completed index is not failed.
	for i := range s.completed {
		delete(s.failedIdx, i)
	}
}

// exceedsBackoffLimit says whether the Job failed too often; with
// restartPolicy OnFailure, container restarts of its pods count too.
func (s *jobState) exceedsBackoffLimit() bool {
	limit := s.job.Spec.BackoffLimit
	if limit == nil || s.perIndex {
		return false
	}
	n := int(s.job.Status.Failed)
	if s.job.Spec.Template.Spec.RestartPolicy == corev1.RestartPolicyOnFailure {
		for _, p := range s.active {
			for _, cs := range p.Status.ContainerStatuses {
				n += int(cs.RestartCount)
			}
			for _, cs := range p.Status.InitContainerStatuses {
				n += int(cs.RestartCount)
			}
		}
	}
	return n > int(*limit)
}

// decideTarget sets FailureTarget or SuccessCriteriaMet when the Job has
// met its end.
func (s *jobState) decideTarget() {
	if s.targetSet() {
		return
	}
	job, now := s.job, s.now
	fail := func(reason, msg string) {
		setCondition(job, batchv1.JobFailureTarget, corev1.ConditionTrue, reason, msg, now)
		s.c.events.Eventf(job, corev1.EventTypeWarning, reason, "%s", msg)
	}
	succ := func(reason, msg string) {
		setCondition(job, batchv1.JobSuccessCriteriaMet, corev1.ConditionTrue, reason, msg, now)
	}
	switch {
	case s.failJob != "":
		fail(reasonPodFailurePolicy, s.failJob)
		return
	case s.exceedsBackoffLimit():
		fail(reasonBackoffLimitExceeded, messageBackoffLimitExceeded)
		return
	case s.perIndex && job.Spec.MaxFailedIndexes != nil && len(s.failedIdx) > int(*job.Spec.MaxFailedIndexes):
		fail(reasonMaxFailedIndexesExceeded, messageMaxFailedIndexes)
		return
	case !s.suspended && job.Spec.ActiveDeadlineSeconds != nil && job.Status.StartTime != nil &&
		!now.Before(job.Status.StartTime.Add(time.Duration(*job.Spec.ActiveDeadlineSeconds)*time.Second)):
		fail(reasonDeadlineExceeded, messageDeadlineExceeded)
		return
	}
	if s.indexed {
		if i := matchSuccessPolicy(job.Spec.SuccessPolicy, s.completed, s.completions); i >= 0 {
			succ(reasonSuccessPolicy, fmt.Sprintf("Matched rules at index %d", i))
			return
		}
		switch {
		case len(s.completed) >= s.completions:
			succ(reasonCompletionsReached, messageCompletionsReached)
		case s.perIndex && len(s.failedIdx) > 0 && len(s.completed)+len(s.failedIdx) >= s.completions:
			fail(reasonFailedIndexes, messageFailedIndexes)
		}
		return
	}
	succeeded := int(job.Status.Succeeded)
	switch {
	case s.completions >= 0 && succeeded >= s.completions:
		succ(reasonCompletionsReached, messageCompletionsReached)
	case s.completions < 0 && succeeded > 0 && len(s.active) == 0 && !s.suspended:
		// A work queue: done once one pod succeeded and none is left.
		succ(reasonCompletionsReached, messageCompletionsReached)
	}
}

// finishIfDone turns the target condition into Complete or Failed once
// no pod of the Job is left running or uncounted.
func (s *jobState) finishIfDone() {
	job := s.job
	for _, p := range s.pods {
		if s.hasFinalizer(p) || (!isTerminal(p) && p.DeletionTimestamp == nil) {
			return
		}
	}
	if u := job.Status.UncountedTerminatedPods; u != nil && len(u.Succeeded)+len(u.Failed) > 0 {
		return
	}
	s.active, s.terminating, s.ready = nil, nil, 0
	if t := findCondition(job, batchv1.JobFailureTarget); t != nil && t.Status == corev1.ConditionTrue {
		setCondition(job, batchv1.JobFailed, corev1.ConditionTrue, t.Reason, t.Message, s.now)
		return
	}
	t := findCondition(job, batchv1.JobSuccessCriteriaMet)
	setCondition(job, batchv1.JobComplete, corev1.ConditionTrue, t.Reason, t.Message, s.now)
	job.Status.CompletionTime = new(metaTime(s.now))
	s.c.events.Eventf(job, corev1.EventTypeNormal, reasonCompleted, "Job completed")
}

// deletePods deletes the given pods, expecting their deletions.
func (s *jobState) deletePods(ctx context.Context, pods []*corev1.Pod) error {
	if len(pods) == 0 {
		return nil
	}
	uids := make([]types.UID, 0, len(pods))
	for _, p := range pods {
		uids = append(uids, p.UID)
	}
	s.c.expect.ExpectDeletions(s.key(), uids)
	pc := kit.PodControl{Client: s.c.cfg.Client, Recorder: s.c.events}
	var errs []error
	for _, p := range pods {
		if err := pc.DeletePod(ctx, s.job, p); err != nil {
			s.c.expect.DeletionObserved(s.key(), p.UID)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// manage creates and deletes pods towards the wanted number.
func (s *jobState) manage(ctx context.Context) error {
	job := s.job
	busy := len(s.active)
	if job.Spec.PodReplacementPolicy != nil && *job.Spec.PodReplacementPolicy == batchv1.Failed {
		// A pod is replaced only once it has fully ended.
		busy += len(s.terminating)
	}
	if s.indexed {
		return s.manageIndexed(ctx, busy)
	}
	want := s.parallelism
	succeeded := int(job.Status.Succeeded)
	if s.completions >= 0 {
		want = min(want, s.completions-succeeded)
	} else if succeeded > 0 {
		want = busy // a work queue winds down once one pod succeeded
	}
	want = max(want, 0)
	switch diff := want - busy; {
	case diff < 0:
		victims := slices.Clone(s.active)
		// Not ready first, then the newest.
		slices.SortFunc(victims, func(a, b *corev1.Pod) int {
			if ra, rb := kit.IsPodReady(a), kit.IsPodReady(b); ra != rb {
				if ra {
					return 1
				}
				return -1
			}
			return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
		})
		return s.deletePods(ctx, victims[:min(-diff, len(victims))])
	case diff > 0:
		if wait := s.backoffWait(); wait > 0 {
			s.c.jobQueue.AddAfter(s.key(), wait)
			return nil
		}
		pods := make([]*corev1.Pod, 0, diff)
		for range min(diff, maxPodCreatesPerSync) {
			pods = append(pods, s.newPod(-1, 0))
		}
		return s.createPods(ctx, pods)
	}
	return nil
}

// backoffWait is how long pod creation must still wait after failures.
func (s *jobState) backoffWait() time.Duration {
	d := backoffDelay(s.mem.failures, s.c.cfg.BackoffBase, s.c.cfg.BackoffMax)
	if d == 0 {
		return 0
	}
	return max(s.mem.lastFailure.Add(d).Sub(s.now), 0)
}

func (s *jobState) manageIndexed(ctx context.Context, busy int) error {
	byIndex := map[int][]*corev1.Pod{}
	var extra []*corev1.Pod
	for _, p := range s.active {
		i := podIndex(p)
		if i < 0 || i >= s.completions || s.completed[i] || s.failedIdx[i] {
			extra = append(extra, p)
			continue
		}
		byIndex[i] = append(byIndex[i], p)
	}
	for _, ps := range byIndex {
		if len(ps) > 1 {
			slices.SortFunc(ps, func(a, b *corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
			extra = append(extra, ps[1:]...)
		}
	}
	if job := s.job; job.Spec.PodReplacementPolicy != nil && *job.Spec.PodReplacementPolicy == batchv1.Failed {
		for _, p := range s.terminating {
			if i := podIndex(p); i >= 0 {
				byIndex[i] = append(byIndex[i], p)
			}
		}
	}
	if len(extra) > 0 {
		return s.deletePods(ctx, extra)
	}
	// Failures per index, from the pods of each index.
	failures := map[int]int{}
	for _, p := range s.pods {
		i := podIndex(p)
		if i < 0 {
			continue
		}
		n := indexFailures(p)
		if p.Status.Phase == corev1.PodFailed {
			if a, _ := matchFailurePolicy(s.job.Spec.PodFailurePolicy, p); a != actionIgnore {
				n++
			}
		}
		failures[i] = max(failures[i], n)
	}
	room := s.parallelism - busy
	var pods []*corev1.Pod
	var wait time.Duration
	for i := 0; i < s.completions && room > 0 && len(pods) < maxPodCreatesPerSync; i++ {
		if s.completed[i] || s.failedIdx[i] || len(byIndex[i]) > 0 {
			continue
		}
		if f := failures[i]; f > 0 {
			d := backoffDelay(f, s.c.cfg.BackoffBase, s.c.cfg.BackoffMax)
			if w := s.mem.lastFailure.Add(d).Sub(s.now); w > 0 {
				if wait == 0 || w < wait {
					wait = w
				}
				continue
			}
		}
		pods = append(pods, s.newPod(i, failures[i]))
		room--
	}
	if wait > 0 {
		s.c.jobQueue.AddAfter(s.key(), wait)
	}
	return s.createPods(ctx, pods)
}

// newPod builds a pod of the Job; index < 0 for a non-indexed Job.
func (s *jobState) newPod(index, failures int) *corev1.Pod {
	job := s.job
	p := kit.PodFromTemplate(&job.Spec.Template, job, jobGVK)
	p.Finalizers = append(p.Finalizers, TrackingFinalizer)
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	if index < 0 {
		return p
	}
	idx := strconv.Itoa(index)
	p.GenerateName = fmt.Sprintf("%s-%d-", job.Name, index)
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[AnnotationCompletionIndex] = idx
	p.Labels[AnnotationCompletionIndex] = idx
	if s.perIndex {
		p.Annotations[AnnotationIndexFailures] = strconv.Itoa(failures)
	}
	if p.Spec.Hostname == "" {
		p.Spec.Hostname = fmt.Sprintf("%s-%d", job.Name, index)
	}
	env := corev1.EnvVar{Name: EnvCompletionIndex, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: fmt.Sprintf("metadata.annotations['%s']", AnnotationCompletionIndex)},
	}}
	for i := range p.Spec.InitContainers {
		p.Spec.InitContainers[i].Env = append(p.Spec.InitContainers[i].Env, env)
	}
	for i := range p.Spec.Containers {
		p.Spec.Containers[i].Env = append(p.Spec.Containers[i].Env, env)
	}
	return p
}

// createPods creates pods, expecting their creations.
func (s *jobState) createPods(ctx context.Context, pods []*corev1.Pod) error {
	if len(pods) == 0 {
		return nil
	}
	s.c.expect.ExpectCreations(s.key(), len(pods))
	pc := kit.PodControl{Client: s.c.cfg.Client, Recorder: s.c.events}
	var errs []error
	for i, p := range pods {
		if _, err := pc.CreatePod(ctx, s.job, p); err != nil {
			// The rest will not be seen either.
			for range len(pods) - i {
				s.c.expect.CreationObserved(s.key())
			}
			errs = append(errs, err)
			break
		}
	}
	return errors.Join(errs...)
}
