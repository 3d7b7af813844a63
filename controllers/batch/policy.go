package batch

import (
	"fmt"
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// Condition reasons and messages, as upstream's.
const (
	reasonBackoffLimitExceeded     = "BackoffLimitExceeded"
	messageBackoffLimitExceeded    = "Job has reached the specified backoff limit"
	reasonDeadlineExceeded         = "DeadlineExceeded"
	messageDeadlineExceeded        = "Job was active longer than specified deadline"
	reasonPodFailurePolicy         = "PodFailurePolicy"
	reasonMaxFailedIndexesExceeded = "MaxFailedIndexesExceeded"
	messageMaxFailedIndexes        = "Job has exceeded the specified maximal number of failed indexes"
	reasonFailedIndexes            = "FailedIndexes"
	messageFailedIndexes           = "Job has failed indexes"
	reasonCompletionsReached       = "CompletionsReached"
	messageCompletionsReached      = "Reached expected number of succeeded pods"
	reasonSuccessPolicy            = "SuccessPolicy"
	reasonSuspended                = "JobSuspended"
	messageSuspended               = "Job suspended"
	reasonResumed                  = "JobResumed"
	messageResumed                 = "Job resumed"
)

// failureAction is what a failed pod does to its Job.
type failureAction int

const (
	actionCount failureAction = iota // counts towards the backoff limits
	actionIgnore
	actionFailJob
	actionFailIndex
)

// matchFailurePolicy applies a Job's pod failure policy to a failed pod:
// the first rule that matches decides. The message says which rule, for
// the FailJob condition.
func matchFailurePolicy(p *batchv1.PodFailurePolicy, pod *corev1.Pod) (failureAction, string) {
	if p == nil {
		return actionCount, ""
	}
	for i, r := range p.Rules {
		msg, ok := "", false
		if r.OnExitCodes != nil {
			msg, ok = matchExitCodes(r.OnExitCodes, pod)
		} else {
			msg, ok = matchPodConditions(r.OnPodConditions, pod)
		}
		if !ok {
			continue
		}
		switch r.Action {
		case batchv1.PodFailurePolicyActionIgnore:
			return actionIgnore, ""
		case batchv1.PodFailurePolicyActionFailJob:
			return actionFailJob, fmt.Sprintf("%s matching FailJob rule at index %d", msg, i)
		case batchv1.PodFailurePolicyActionFailIndex:
			return actionFailIndex, ""
		default:
			return actionCount, ""
		}
	}
	return actionCount, ""
}

func matchExitCodes(req *batchv1.PodFailurePolicyOnExitCodesRequirement, pod *corev1.Pod) (string, bool) {
	statuses := append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...)
	for _, cs := range statuses {
		if req.ContainerName != nil && *req.ContainerName != cs.Name {
			continue
		}
		t := cs.State.Terminated
		if t == nil || t.ExitCode == 0 {
			continue
		}
		in := slices.Contains(req.Values, t.ExitCode)
		if (req.Operator == batchv1.PodFailurePolicyOnExitCodesOpIn) == in {
			return fmt.Sprintf("Container %s for pod %s/%s failed with exit code %d", cs.Name, pod.Namespace, pod.Name, t.ExitCode), true
		}
	}
	return "", false
}

func matchPodConditions(reqs []batchv1.PodFailurePolicyOnPodConditionsPattern, pod *corev1.Pod) (string, bool) {
	for _, req := range reqs {
		want := req.Status
		if want == "" {
			want = corev1.ConditionTrue
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == req.Type && c.Status == want {
				return fmt.Sprintf("Pod %s/%s has condition %s matching", pod.Namespace, pod.Name, c.Type), true
			}
		}
	}
	return "", false
}

// matchSuccessPolicy returns the index of the first success policy rule
// the completed indexes meet, or -1.
func matchSuccessPolicy(p *batchv1.SuccessPolicy, completed indexSet, completions int) int {
	if p == nil {
		return -1
	}
	for i, r := range p.Rules {
		if r.SucceededIndexes != nil {
			want := parseIndexes(*r.SucceededIndexes, completions)
			done := 0
			for idx := range want {
				if completed[idx] {
					done++
				}
			}
			if (r.SucceededCount != nil && done >= int(*r.SucceededCount)) || (r.SucceededCount == nil && done == len(want) && len(want) > 0) {
				return i
			}
			continue
		}
		if r.SucceededCount != nil && len(completed) >= int(*r.SucceededCount) {
			return i
		}
	}
	return -1
}

// backoffDelay is the wait before a Job replaces a pod after failures
// consecutive failures: base, doubled each time, capped at max.
func backoffDelay(failures int, base, maxDelay time.Duration) time.Duration {
	if failures <= 0 {
		return 0
	}
	d := base
	for range failures - 1 {
		d *= 2
		if d >= maxDelay {
			return maxDelay
		}
	}
	return min(d, maxDelay)
}

func findCondition(j *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range j.Status.Conditions {
		if j.Status.Conditions[i].Type == t {
			return &j.Status.Conditions[i]
		}
	}
	return nil
}

func conditionTrue(j *batchv1.Job, t batchv1.JobConditionType) bool {
	c := findCondition(j, t)
	return c != nil && c.Status == corev1.ConditionTrue
}

// setCondition sets a condition, keeping its transition time when the
// status does not change. It reports a change.
func setCondition(j *batchv1.Job, t batchv1.JobConditionType, status corev1.ConditionStatus, reason, message string, now time.Time) bool {
	if c := findCondition(j, t); c != nil {
		if c.Status == status && c.Reason == reason && c.Message == message {
			return false
		}
		if c.Status != status {
			c.LastTransitionTime = metaTime(now)
		}
		c.Status, c.Reason, c.Message = status, reason, message
		c.LastProbeTime = metaTime(now)
		return true
	}
	j.Status.Conditions = append(j.Status.Conditions, batchv1.JobCondition{
		Type: t, Status: status, Reason: reason, Message: message,
		LastProbeTime: metaTime(now), LastTransitionTime: metaTime(now),
	})
	return true
}
