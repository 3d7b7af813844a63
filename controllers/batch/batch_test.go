package batch

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/controllers/internal/kit/kittest"
	"github.com/tether-edge/tether/edge/sim"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/testbench/hollow"
)

// hubArgs turn off the hub's own copy of the controller under test, which
// runs in the test process instead.
var hubArgs = []string{"--controllers=*,-job"}

type env struct {
	h    *hubtest.Hub
	kube kubernetes.Interface
}

// startHub starts a hub and a batch controller against it.
func startHub(t *testing.T, cfg Config) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a hub process")
	}
	h, _, kube := kittest.Hub(t, hubArgs)
	factory := informers.NewSharedInformerFactory(kube, 0)
	cfg.Client, cfg.Informers = kube, factory
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		factory.Shutdown()
	})
	return &env{h: h, kube: kube}
}

// startNodes joins n hollow nodes (edge agents with the sim runtime) to
// the hub, so the hub's scheduler places Job pods and the agents run them.
func (e *env) startNodes(t *testing.T, n int) {
	t.Helper()
	out, err := exec.Command(e.h.Bin, "token", "create", "--kubeconfig", e.h.Kubeconfig).Output()
	if err != nil {
		t.Fatalf("tether token create: %v", err)
	}
	f, err := hollow.New(hollow.Config{
		HubURL: "https://" + e.h.Addr, Token: strings.TrimSpace(string(out)), N: n, DataDir: t.TempDir(),
		Sim: sim.Config{StartDelay: 200 * time.Millisecond, LogInterval: -1}, StatusCheckInterval: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	kittest.WaitFor(t, "hollow nodes ready", 60*time.Second, func() (bool, error) {
		nodes, err := e.kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == n, fmt.Errorf("%d of %d nodes ready", ready, n)
	})
}

func template(ann map[string]string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Annotations: ann},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: "busybox:1"}},
		},
	}
}

// apply runs kubectl apply with manifest.
func (e *env) apply(t *testing.T, manifest string) {
	t.Helper()
	if out, err := e.h.RunInput(context.Background(), manifest, nil, "apply", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// createJob creates j in ns with kubectl apply, as a user would.
func (e *env) createJob(t *testing.T, ns string, j *batchv1.Job) *batchv1.Job {
	t.Helper()
	j = j.DeepCopy()
	j.Namespace, j.APIVersion, j.Kind = ns, "batch/v1", "Job"
	manifest, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	e.apply(t, string(manifest))
	got, err := e.kube.BatchV1().Jobs(ns).Get(context.Background(), j.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func (e *env) waitCondition(t *testing.T, ns, name string, ct batchv1.JobConditionType, reason string, timeout time.Duration) *batchv1.Job {
	t.Helper()
	var job *batchv1.Job
	kittest.WaitFor(t, fmt.Sprintf("job %s %s", name, ct), timeout, func() (bool, error) {
		j, err := e.kube.BatchV1().Jobs(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		job = j
		for _, c := range j.Status.Conditions {
			if c.Type == ct && c.Status == corev1.ConditionTrue {
				if reason != "" && c.Reason != reason {
					return false, fmt.Errorf("reason %s, want %s", c.Reason, reason)
				}
				return true, nil
			}
		}
		return false, fmt.Errorf("status %+v", j.Status)
	})
	return job
}

func (e *env) jobPods(t *testing.T, ns string, job *batchv1.Job) []corev1.Pod {
	t.Helper()
	l, err := e.kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: ControllerUIDLabel + "=" + string(job.UID)})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

const ControllerUIDLabel = batchv1.ControllerUidLabel

func TestJobsAgainstHub(t *testing.T) {
	e := startHub(t, Config{Workers: 2, BackoffBase: time.Second, BackoffMax: 4 * time.Second})
	e.startNodes(t, 2)
	ns := "default"
	ok := map[string]string{sim.ExitCode: "0", sim.CrashAfter: "500ms"}

	t.Run("CompletionsAndParallelism", func(t *testing.T) {
		t.Parallel()
		e.apply(t, `apiVersion: batch/v1
kind: Job
metadata: {name: pi, namespace: default}
spec:
  completions: 3
  parallelism: 2
  template:
    metadata:
      annotations: {`+sim.ExitCode+`: "0", `+sim.CrashAfter+`: 500ms}
    spec:
      restartPolicy: Never
      containers: [{name: main, image: "busybox:1"}]
`)
		j := e.waitCondition(t, ns, "pi", batchv1.JobComplete, reasonCompletionsReached, 60*time.Second)
		if j.Status.Succeeded != 3 || j.Status.Failed != 0 || j.Status.Active != 0 || j.Status.CompletionTime == nil || j.Status.StartTime == nil {
			t.Errorf("status %+v", j.Status)
		}
		if !conditionTrue(j, batchv1.JobSuccessCriteriaMet) {
			t.Errorf("no SuccessCriteriaMet condition: %+v", j.Status.Conditions)
		}
		pods := e.jobPods(t, ns, j)
		if len(pods) != 3 {
			t.Errorf("%d pods, want 3", len(pods))
		}
		for _, p := range pods {
			if slices.Contains(p.Finalizers, TrackingFinalizer) {
				t.Errorf("pod %s keeps the tracking finalizer", p.Name)
			}
			if p.Labels[batchv1.JobNameLabel] != "pi" || metav1.GetControllerOf(&p).UID != j.UID {
				t.Errorf("pod %s labels %v owner %v", p.Name, p.Labels, p.OwnerReferences)
			}
		}
		out := e.h.MustRun("get", "job", "pi", "--no-headers")
		if !strings.Contains(out, "Complete") || !strings.Contains(out, "3/3") {
			t.Errorf("kubectl get job: %s", out)
		}
	})

	t.Run("BackoffLimit", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		e.createJob(t, ns, &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "fails"},
			Spec:       batchv1.JobSpec{BackoffLimit: new(int32(2)), Template: template(map[string]string{sim.ExitCode: "1"})},
		})
		j := e.waitCondition(t, ns, "fails", batchv1.JobFailed, reasonBackoffLimitExceeded, 60*time.Second)
		took := time.Since(start)
		if j.Status.Failed != 3 || j.Status.Active != 0 {
			t.Errorf("status %+v", j.Status)
		}
		pods := e.jobPods(t, ns, j)
		slices.SortFunc(pods, func(a, b corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
		var gaps []time.Duration
		for i := 1; i < len(pods); i++ {
			gaps = append(gaps, pods[i].CreationTimestamp.Sub(pods[i-1].CreationTimestamp.Time))
		}
		t.Logf("3 failing pods in %v; gaps between pod creations %v (back-off 1s doubling)", took, gaps)
		if len(gaps) != 2 || gaps[1] < gaps[0] || gaps[0] < time.Second {
			t.Errorf("pod creations not backed off: %v", gaps)
		}
	})

	t.Run("PodFailurePolicyFailJob", func(t *testing.T) {
		t.Parallel()
		e.createJob(t, ns, &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "policy"},
			Spec: batchv1.JobSpec{
				BackoffLimit: new(int32(6)),
				PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
					Action:      batchv1.PodFailurePolicyActionFailJob,
					OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{42}},
				}}},
				Template: template(map[string]string{sim.ExitCode: "42"}),
			},
		})
		j := e.waitCondition(t, ns, "policy", batchv1.JobFailed, reasonPodFailurePolicy, 60*time.Second)
		if j.Status.Failed != 1 {
			t.Errorf("failed %d, want 1", j.Status.Failed)
		}
	})

	t.Run("Indexed", func(t *testing.T) {
		t.Parallel()
		e.createJob(t, ns, &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "idx"},
			Spec: batchv1.JobSpec{Completions: new(int32(3)), Parallelism: new(int32(3)),
				CompletionMode: new(batchv1.IndexedCompletion), Template: template(ok)},
		})
		j := e.waitCondition(t, ns, "idx", batchv1.JobComplete, "", 60*time.Second)
		if j.Status.CompletedIndexes != "0-2" || j.Status.Succeeded != 3 {
			t.Errorf("status %+v", j.Status)
		}
		seen := map[string]bool{}
		for _, p := range e.jobPods(t, ns, j) {
			idx := p.Annotations[AnnotationCompletionIndex]
			seen[idx] = true
			if p.Labels[AnnotationCompletionIndex] != idx || p.Spec.Hostname != "idx-"+idx || !strings.HasPrefix(p.Name, "idx-"+idx+"-") {
				t.Errorf("pod %s: index %s labels %v hostname %s", p.Name, idx, p.Labels, p.Spec.Hostname)
			}
			if !slices.ContainsFunc(p.Spec.Containers[0].Env, func(v corev1.EnvVar) bool { return v.Name == EnvCompletionIndex }) {
				t.Errorf("pod %s lacks %s", p.Name, EnvCompletionIndex)
			}
		}
		if len(seen) != 3 {
			t.Errorf("indexes %v", seen)
		}
	})

	t.Run("ActiveDeadline", func(t *testing.T) {
		t.Parallel()
		e.createJob(t, ns, &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "slow"},
			Spec:       batchv1.JobSpec{ActiveDeadlineSeconds: new(int64(3)), Template: template(nil)},
		})
		j := e.waitCondition(t, ns, "slow", batchv1.JobFailed, reasonDeadlineExceeded, 30*time.Second)
		if d := j.Status.Conditions[len(j.Status.Conditions)-1].LastTransitionTime.Sub(j.Status.StartTime.Time); d < 3*time.Second {
			t.Errorf("failed %v after start, before the deadline", d)
		}
		if j.Status.Active != 0 {
			t.Errorf("active %d", j.Status.Active)
		}
	})

	t.Run("Suspend", func(t *testing.T) {
		t.Parallel()
		e.createJob(t, ns, &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "later"},
			Spec:       batchv1.JobSpec{Suspend: new(true), Parallelism: new(int32(2)), Completions: new(int32(2)), Template: template(nil)},
		})
		j := e.waitCondition(t, ns, "later", batchv1.JobSuspended, reasonSuspended, 10*time.Second)
		if len(e.jobPods(t, ns, j)) != 0 || j.Status.StartTime != nil {
			t.Errorf("suspended job started: %+v", j.Status)
		}
		e.h.MustRun("patch", "job", "later", "--type=merge", "-p", `{"spec":{"suspend":false}}`)
		kittest.WaitFor(t, "resumed job runs 2 pods", 30*time.Second, func() (bool, error) {
			j, err := e.kube.BatchV1().Jobs(ns).Get(context.Background(), "later", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			c := findCondition(j, batchv1.JobSuspended)
			return j.Status.Active == 2 && c != nil && c.Status == corev1.ConditionFalse && c.Reason == reasonResumed, fmt.Errorf("%+v", j.Status)
		})
		e.h.MustRun("patch", "job", "later", "--type=merge", "-p", `{"spec":{"suspend":true}}`)
		kittest.WaitFor(t, "suspended job's pods deleted", 30*time.Second, func() (bool, error) {
			j, err := e.kube.BatchV1().Jobs(ns).Get(context.Background(), "later", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return j.Status.Active == 0 && conditionTrue(j, batchv1.JobSuspended) && j.Status.Failed == 0, fmt.Errorf("%+v", j.Status)
		})
	})

	t.Run("TTLAfterFinished", func(t *testing.T) {
		t.Parallel()
		j := e.createJob(t, ns, &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "brief"},
			Spec:       batchv1.JobSpec{TTLSecondsAfterFinished: new(int32(2)), Template: template(ok)},
		})
		e.waitCondition(t, ns, "brief", batchv1.JobComplete, "", 60*time.Second)
		kittest.WaitFor(t, "finished job deleted after its TTL", 30*time.Second, func() (bool, error) {
			_, err := e.kube.BatchV1().Jobs(ns).Get(context.Background(), "brief", metav1.GetOptions{})
			return apierrors.IsNotFound(err), err
		})
		kittest.WaitFor(t, "its pods deleted", 30*time.Second, func() (bool, error) {
			return len(e.jobPods(t, ns, j)) == 0, nil
		})
	})

	t.Run("CronJobFiresOnSchedule", func(t *testing.T) {
		t.Parallel()
		e.apply(t, `apiVersion: batch/v1
kind: CronJob
metadata: {name: hello, namespace: default}
spec:
  schedule: "*/1 * * * *"
  jobTemplate:
    spec:
      template:
        metadata:
          annotations: {`+sim.ExitCode+`: "0", `+sim.CrashAfter+`: 500ms}
        spec:
          restartPolicy: Never
          containers: [{name: main, image: "busybox:1"}]
`)
		// Client-side instantiation works at once.
		e.h.MustRun("create", "job", "--from=cronjob/hello", "hello-manual")
		e.waitCondition(t, ns, "hello-manual", batchv1.JobComplete, "", 60*time.Second)

		var fired *batchv1.Job
		kittest.WaitFor(t, "a Job started by the schedule", 75*time.Second, func() (bool, error) {
			l, err := e.kube.BatchV1().Jobs(ns).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for i := range l.Items {
				if _, ok := l.Items[i].Annotations[AnnotationScheduledTimestamp]; ok {
					fired = &l.Items[i]
					return true, nil
				}
			}
			return false, nil
		})
		at, err := time.Parse(time.RFC3339, fired.Annotations[AnnotationScheduledTimestamp])
		if err != nil {
			t.Fatal(err)
		}
		if want := jobNameFor("hello", at); fired.Name != want {
			t.Errorf("job name %s, want %s", fired.Name, want)
		}
		if lag := fired.CreationTimestamp.Sub(at); lag > 2*time.Second {
			t.Errorf("job created %v after its start time", lag)
		}
		t.Logf("cronjob fired: job %s for %s, created %v after it", fired.Name, at.Format(time.RFC3339), fired.CreationTimestamp.Sub(at))
		e.waitCondition(t, ns, fired.Name, batchv1.JobComplete, "", 60*time.Second)
		kittest.WaitFor(t, "lastSuccessfulTime", 10*time.Second, func() (bool, error) {
			cj, err := e.kube.BatchV1().CronJobs(ns).Get(context.Background(), "hello", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return cj.Status.LastScheduleTime != nil && cj.Status.LastScheduleTime.Equal(&metav1.Time{Time: at}) &&
				cj.Status.LastSuccessfulTime != nil, fmt.Errorf("%+v", cj.Status)
		})
	})
}

// TestCronJobPolicies drives the CronJob controller with a fake clock
// against a real hub: each step of the clock is a start time.
func TestCronJobPolicies(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Now())
	e := startHub(t, Config{Workers: 2, Clock: clk})
	ctx := context.Background()
	ns := "default"
	mk := func(name string, policy batchv1.ConcurrencyPolicy) {
		t.Helper()
		_, err := e.kube.BatchV1().CronJobs(ns).Create(ctx, &batchv1.CronJob{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: batchv1.CronJobSpec{
				Schedule: "* * * * *", ConcurrencyPolicy: policy,
				JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: template(nil)}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	mk("forbid", batchv1.ForbidConcurrent)
	mk("replace", batchv1.ReplaceConcurrent)
	time.Sleep(500 * time.Millisecond) // let the controller see them

	jobsOf := func(cj string) []batchv1.Job {
		l, err := e.kube.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []batchv1.Job
		for _, j := range l.Items {
			if ref := metav1.GetControllerOf(&j); ref != nil && ref.Name == cj && j.DeletionTimestamp == nil {
				out = append(out, j)
			}
		}
		return out
	}
	step := func() time.Time {
		// To the next minute boundary.
		now := clk.Now()
		next := now.Truncate(time.Minute).Add(time.Minute)
		clk.Step(next.Sub(now))
		return next
	}
	activeOf := func(name string) int {
		cj, err := e.kube.BatchV1().CronJobs(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(cj.Status.Active)
	}

	t1 := step()
	kittest.WaitFor(t, "first jobs", 10*time.Second, func() (bool, error) {
		return len(jobsOf("forbid")) == 1 && len(jobsOf("replace")) == 1 && activeOf("forbid") == 1 && activeOf("replace") == 1, nil
	})
	first := jobsOf("replace")[0]
	if first.Name != jobNameFor("replace", t1) {
		t.Errorf("job %s, want %s", first.Name, jobNameFor("replace", t1))
	}

	t2 := step()
	kittest.WaitFor(t, "Replace swapped its job", 10*time.Second, func() (bool, error) {
		js := jobsOf("replace")
		return len(js) == 1 && js[0].UID != first.UID, fmt.Errorf("%d jobs", len(js))
	})
	time.Sleep(time.Second)
	if js := jobsOf("forbid"); len(js) != 1 {
		t.Errorf("Forbid started a second job while the first runs: %d", len(js))
	}
	out := e.h.MustRun("get", "events", "--field-selector", "involvedObject.name=forbid", "-o", "jsonpath={.items[*].reason}")
	if !strings.Contains(out, "JobAlreadyActive") {
		t.Errorf("events of forbid: %s", out)
	}

	// The running job ends: the next start time starts a new one.
	j := jobsOf("forbid")[0]
	now := metav1.NewTime(time.Now())
	j.Status.StartTime = &now
	j.Status.CompletionTime = &now
	j.Status.Conditions = append(j.Status.Conditions,
		batchv1.JobCondition{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now},
		batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now})
	if _, err := e.kube.BatchV1().Jobs(ns).UpdateStatus(ctx, &j, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// With no startingDeadlineSeconds, the start time Forbid skipped is
	// still due: it starts as soon as nothing runs.
	kittest.WaitFor(t, "Forbid starts the skipped run once the running one ended", 10*time.Second, func() (bool, error) {
		cj, err := e.kube.BatchV1().CronJobs(ns).Get(ctx, "forbid", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return len(jobsOf("forbid")) == 2 && len(cj.Status.Active) == 1 && cj.Status.Active[0].Name == jobNameFor("forbid", t2) &&
			cj.Status.LastSuccessfulTime != nil, fmt.Errorf("%+v", cj.Status)
	})

	// Suspended: no start times are acted on.
	e.h.MustRun("patch", "cronjob", "replace", "--type=merge", "-p", `{"spec":{"suspend":true}}`)
	time.Sleep(500 * time.Millisecond)
	before := jobsOf("replace")[0].UID
	step()
	time.Sleep(time.Second)
	if js := jobsOf("replace"); len(js) != 1 || js[0].UID != before {
		t.Errorf("suspended cronjob acted: %d jobs", len(js))
	}
}
