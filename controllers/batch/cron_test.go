package batch

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestScheduleTimes(t *testing.T) {
	utc := "UTC"
	paris := "Europe/Paris"
	tests := []struct {
		name       string
		schedule   string
		tz         *string
		created    string
		last       string
		deadline   *int64
		now        string
		wantRecent string // "" for none
		wantMissed int
		wantNext   string
	}{
		{"not yet", "*/5 * * * *", &utc, "2026-03-01T10:00:30Z", "", nil, "2026-03-01T10:03:00Z", "", 0, "2026-03-01T10:05:00Z"},
		{"due", "*/5 * * * *", &utc, "2026-03-01T10:00:30Z", "", nil, "2026-03-01T10:05:00Z", "2026-03-01T10:05:00Z", 1, "2026-03-01T10:10:00Z"},
		{"already done", "*/5 * * * *", &utc, "2026-03-01T10:00:30Z", "2026-03-01T10:05:00Z", nil, "2026-03-01T10:07:00Z", "", 0, "2026-03-01T10:10:00Z"},
		{"three missed", "* * * * *", &utc, "2026-03-01T10:00:00Z", "2026-03-01T10:00:00Z", nil, "2026-03-01T10:03:10Z", "2026-03-01T10:03:00Z", 3, "2026-03-01T10:04:00Z"},
		{"hourly macro", "@hourly", &utc, "2026-03-01T10:10:00Z", "", nil, "2026-03-01T11:00:01Z", "2026-03-01T11:00:00Z", 1, "2026-03-01T12:00:00Z"},
		{"daily in Paris", "0 9 * * *", &paris, "2026-03-01T00:00:00Z", "", nil, "2026-03-01T08:00:00Z", "2026-03-01T08:00:00Z", 1, "2026-03-02T08:00:00Z"},
		{"daily in Paris after DST", "0 9 * * *", &paris, "2026-04-01T00:00:00Z", "", nil, "2026-04-01T07:00:00Z", "2026-04-01T07:00:00Z", 1, "2026-04-02T07:00:00Z"},
		{"OR of day fields", "0 0 13 * 5", &utc, "2026-03-12T12:00:00Z", "", nil, "2026-03-14T01:00:00Z", "2026-03-13T00:00:00Z", 1, "2026-03-20T00:00:00Z"},
		// The documented example: down 08:29→10:21, deadline 200s: only
		// the 3 missed start times and the current one count, and the Job
		// starts.
		{"deadline limits the count", "* * * * *", &utc, "2026-03-01T08:00:00Z", "2026-03-01T08:29:00Z", new(int64(200)), "2026-03-01T10:22:00Z", "2026-03-01T10:22:00Z", 4, "2026-03-01T10:23:00Z"},
		{"too many missed", "* * * * *", &utc, "2026-03-01T08:00:00Z", "2026-03-01T08:29:00Z", nil, "2026-03-01T10:22:00Z", "", 101, "2026-03-01T10:23:00Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cj := &batchv1.CronJob{
				ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(mustTime(t, tt.created))},
				Spec:       batchv1.CronJobSpec{Schedule: tt.schedule, TimeZone: tt.tz, StartingDeadlineSeconds: tt.deadline},
			}
			if tt.last != "" {
				cj.Status.LastScheduleTime = &metav1.Time{Time: mustTime(t, tt.last)}
			}
			sched, loc, err := parseSchedule(tt.schedule, tt.tz)
			if err != nil {
				t.Fatal(err)
			}
			recent, missed, next := scheduleTimes(cj, sched, loc, mustTime(t, tt.now))
			if tt.wantMissed > maxMissedSchedules {
				if missed <= maxMissedSchedules {
					t.Errorf("missed %d, want more than %d", missed, maxMissedSchedules)
				}
			} else {
				if missed != tt.wantMissed {
					t.Errorf("missed %d, want %d", missed, tt.wantMissed)
				}
				switch {
				case tt.wantRecent == "" && recent != nil:
					t.Errorf("recent %v, want none", recent)
				case tt.wantRecent != "" && (recent == nil || !recent.Equal(mustTime(t, tt.wantRecent))):
					t.Errorf("recent %v, want %s", recent, tt.wantRecent)
				}
			}
			if !next.Equal(mustTime(t, tt.wantNext)) {
				t.Errorf("next %v, want %s", next.UTC(), tt.wantNext)
			}
		})
	}
}

func TestParseScheduleRejects(t *testing.T) {
	for _, s := range []string{"TZ=UTC * * * * *", "CRON_TZ=Europe/Paris 0 9 * * *", "@every 5m", "61 * * * *", "* * * *", "0 0 * * * *"} {
		if _, _, err := parseSchedule(s, nil); err == nil {
			t.Errorf("schedule %q accepted", s)
		}
	}
	if _, _, err := parseSchedule("* * * * *", new("Mars/Olympus")); err == nil {
		t.Errorf("unknown time zone accepted")
	}
	for _, s := range []string{"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly", "*/15 2-4 1,15 * MON-FRI"} {
		if _, _, err := parseSchedule(s, nil); err != nil {
			t.Errorf("schedule %q: %v", s, err)
		}
	}
}

func TestJobFromCronJob(t *testing.T) {
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "ns", UID: "cj-uid"},
		Spec: batchv1.CronJobSpec{JobTemplate: batchv1.JobTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "x"}, Annotations: map[string]string{"a": "b"}},
		}},
	}
	at := mustTime(t, "2026-03-01T10:05:00Z")
	j := jobFromCronJob(cj, at, time.UTC)
	if j.Name != "hello-29539325" {
		t.Errorf("name %s, want the start time in minutes", j.Name)
	}
	if j.Annotations[AnnotationScheduledTimestamp] != "2026-03-01T10:05:00Z" || j.Annotations["a"] != "b" || j.Labels["app"] != "x" {
		t.Errorf("metadata %+v", j.ObjectMeta)
	}
	ref := metav1.GetControllerOf(j)
	if ref == nil || ref.Kind != "CronJob" || ref.UID != "cj-uid" {
		t.Errorf("owner %+v", ref)
	}
}

func TestIndexSet(t *testing.T) {
	s := parseIndexes("0,2-4,7,9-9,x,12", 10)
	if got := s.String(); got != "0,2-4,7,9" {
		t.Errorf("round trip: %q", got)
	}
	if (indexSet{}).ptrString() != nil {
		t.Errorf("empty set not nil")
	}
}

func TestBackoffDelay(t *testing.T) {
	base, capd := 10*time.Second, 6*time.Minute
	for n, want := range map[int]time.Duration{0: 0, 1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second, 6: 320 * time.Second, 7: capd, 30: capd} {
		if got := backoffDelay(n, base, capd); got != want {
			t.Errorf("backoffDelay(%d) = %v, want %v", n, got, want)
		}
	}
}

func TestFailurePolicy(t *testing.T) {
	pod := &corev1.Pod{Status: corev1.PodStatus{
		Phase:             corev1.PodFailed,
		ContainerStatuses: []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 42}}}},
		Conditions:        []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
	}}
	rule := func(action batchv1.PodFailurePolicyAction, op batchv1.PodFailurePolicyOnExitCodesOperator, codes ...int32) batchv1.PodFailurePolicyRule {
		return batchv1.PodFailurePolicyRule{Action: action, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: op, Values: codes}}
	}
	disruption := batchv1.PodFailurePolicyRule{Action: batchv1.PodFailurePolicyActionIgnore, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}}
	tests := []struct {
		name  string
		rules []batchv1.PodFailurePolicyRule
		want  failureAction
	}{
		{"exit code in", []batchv1.PodFailurePolicyRule{rule(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 42)}, actionFailJob},
		{"exit code not in", []batchv1.PodFailurePolicyRule{rule(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpNotIn, 42)}, actionCount},
		{"disruption ignored", []batchv1.PodFailurePolicyRule{disruption, rule(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 42)}, actionIgnore},
		{"first match wins", []batchv1.PodFailurePolicyRule{rule(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpNotIn, 1), disruption}, actionFailIndex},
		{"count", []batchv1.PodFailurePolicyRule{rule(batchv1.PodFailurePolicyActionCount, batchv1.PodFailurePolicyOnExitCodesOpIn, 42)}, actionCount},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := matchFailurePolicy(&batchv1.PodFailurePolicy{Rules: tt.rules}, pod)
			if got != tt.want {
				t.Errorf("action %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSuccessPolicy(t *testing.T) {
	done := parseIndexes("0-2,5", 10)
	p := &batchv1.SuccessPolicy{Rules: []batchv1.SuccessPolicyRule{
		{SucceededIndexes: new("6-9")},
		{SucceededIndexes: new("0-4"), SucceededCount: new(int32(3))},
	}}
	if got := matchSuccessPolicy(p, done, 10); got != 1 {
		t.Errorf("matched rule %d, want 1", got)
	}
	if got := matchSuccessPolicy(&batchv1.SuccessPolicy{Rules: []batchv1.SuccessPolicyRule{{SucceededCount: new(int32(5))}}}, done, 10); got != -1 {
		t.Errorf("matched rule %d, want none", got)
	}
}
