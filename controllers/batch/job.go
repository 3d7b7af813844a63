package batch

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Labels, annotations and the finalizer the Job controller puts on pods.
const (
	TrackingFinalizer          = batchv1.JobTrackingFinalizer           // batch.kubernetes.io/job-tracking
	AnnotationCompletionIndex  = batchv1.JobCompletionIndexAnnotation   // batch.kubernetes.io/job-completion-index
	AnnotationIndexFailures    = batchv1.JobIndexFailureCountAnnotation // batch.kubernetes.io/job-index-failure-count
	EnvCompletionIndex         = "JOB_COMPLETION_INDEX"
	maxPodCreatesPerSync       = 500
	reasonCompleted            = "Completed"
	reasonSuspendedEvent       = "Suspended"
	reasonResumedEvent         = "Resumed"
	reasonTTLDeleted           = "Deleted"
	finalizerRemovalRetryDelay = time.Second
)

func metaTime(t time.Time) metav1.Time { return metav1.NewTime(t) }

func (c *Controller) registerJobHandlers(jobInf, podInf cache.SharedIndexInformer) error {
	if _, err := jobInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.jobQueue.Enqueue,
		UpdateFunc: func(_, n any) { c.jobQueue.Enqueue(n) },
		DeleteFunc: c.jobDeleted,
	}); err != nil {
		return fmt.Errorf("add job handler: %w", err)
	}
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.podEvent(nil, obj, false) },
		UpdateFunc: func(o, n any) { c.podEvent(o, n, false) },
		DeleteFunc: func(obj any) { c.podEvent(nil, obj, true) },
	}); err != nil {
		return fmt.Errorf("add pod handler: %w", err)
	}
	return nil
}

// jobOwnerKey returns the key of the Job controlling a pod.
func jobOwnerKey(p *corev1.Pod) (string, *metav1.OwnerReference) {
	ref := metav1.GetControllerOf(p)
	if ref == nil || ref.Kind != "Job" || ref.APIVersion != batchv1.SchemeGroupVersion.String() {
		return "", nil
	}
	return p.Namespace + "/" + ref.Name, ref
}

func (c *Controller) podEvent(oldObj, obj any, deleted bool) {
	p, ok := kit.Tombstone(obj).(*corev1.Pod)
	if !ok {
		return
	}
	key, ref := jobOwnerKey(p)
	if o, ok := oldObj.(*corev1.Pod); ok {
		if okey, _ := jobOwnerKey(o); okey != "" && okey != key {
			c.jobQueue.Add(okey)
		}
	}
	if key == "" {
		return
	}
	switch {
	case deleted || p.DeletionTimestamp != nil:
		c.expect.DeletionObserved(key, p.UID)
	case oldObj == nil:
		c.expect.CreationObserved(key)
	}
	if j, err := c.jobs.Jobs(p.Namespace).Get(ref.Name); (apierrors.IsNotFound(err) || (err == nil && j.UID != ref.UID)) &&
		!deleted && slices.Contains(p.Finalizers, TrackingFinalizer) {
		// Its Job is gone: nothing will count it, so only the finalizer
		// must go.
		go c.releaseOrphan(p)
		return
	}
	c.jobQueue.Add(key)
}

func (c *Controller) jobDeleted(obj any) {
	j, ok := kit.Tombstone(obj).(*batchv1.Job)
	if !ok {
		return
	}
	key := j.Namespace + "/" + j.Name
	c.expect.Forget(key)
	c.forgetJob(key)
	for _, p := range kit.ByIndex[*corev1.Pod](c.podIdx, string(j.UID)) {
		if slices.Contains(p.Finalizers, TrackingFinalizer) {
			go c.releaseOrphan(p)
		}
	}
}

// releaseOrphan removes the tracking finalizer of a pod whose Job is gone,
// after checking with the hub that it is.
func (c *Controller) releaseOrphan(p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, ref := jobOwnerKey(p)
	if ref != nil {
		j, err := c.cfg.Client.BatchV1().Jobs(p.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err == nil && j.UID == ref.UID {
			return
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return
		}
	}
	if err := c.removeFinalizer(ctx, p); err != nil {
		c.log.Info("remove finalizer of orphaned job pod", "pod", p.Namespace+"/"+p.Name, "err", err)
	}
}

// removeFinalizer removes the tracking finalizer with a JSON patch that
// first checks it is still where it was read.
func (c *Controller) removeFinalizer(ctx context.Context, p *corev1.Pod) error {
	i := slices.Index(p.Finalizers, TrackingFinalizer)
	if i < 0 {
		return nil
	}
	patch := fmt.Sprintf(`[{"op":"test","path":"/metadata/finalizers/%d","value":%q},{"op":"remove","path":"/metadata/finalizers/%d"}]`, i, TrackingFinalizer, i)
	_, err := c.cfg.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer of pod %s: %w", p.Name, err)
	}
	return nil
}

// jobMemory is what the controller keeps about a Job between syncs.
type jobMemory struct {
	removed     map[types.UID]bool // tracking finalizers removed, maybe not yet seen
	failures    int                // pod failures since the last success
	lastFailure time.Time
}

func (c *Controller) memory(key string) *jobMemory {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.jobMem[key]
	if m == nil {
		m = &jobMemory{removed: map[types.UID]bool{}}
		c.jobMem[key] = m
	}
	return m
}

func (c *Controller) forgetJob(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.jobMem, key)
}

func podIndex(p *corev1.Pod) int {
	v, ok := p.Annotations[AnnotationCompletionIndex]
	if !ok {
		v, ok = p.Labels[AnnotationCompletionIndex]
	}
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(v)
	if err != nil || i < 0 {
		return -1
	}
	return i
}

func isTerminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// claimPods returns the pods the Job controls, adopting and releasing as
// its selector says.
func (c *Controller) claimPods(ctx context.Context, job *batchv1.Job) ([]*corev1.Pod, error) {
	sel, err := metav1.LabelSelectorAsSelector(job.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("parse selector: %w", err)
	}
	cands, err := c.pods.Pods(job.Namespace).List(sel)
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	seen := map[types.UID]bool{}
	for _, p := range cands {
		seen[p.UID] = true
	}
	for _, p := range kit.ByIndex[*corev1.Pod](c.podIdx, string(job.UID)) {
		if !seen[p.UID] {
			cands = append(cands, p)
		}
	}
	cl := &kit.Claimer{Owner: job, OwnerGVK: jobGVK, Selector: sel, Fresh: func(ctx context.Context) (metav1.Object, error) {
		return c.cfg.Client.BatchV1().Jobs(job.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
	}}
	return kit.Claim(ctx, cl, cands, func(ctx context.Context, name string, data []byte) error {
		_, err := c.cfg.Client.CoreV1().Pods(job.Namespace).Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{})
		return err
	})
}

// syncJob reconciles one Job.
func (c *Controller) syncJob(ctx context.Context, key string) error {
	ns, name := kit.SplitKey(key)
	cached, err := c.jobs.Jobs(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.expect.Forget(key)
		c.forgetJob(key)
		return nil
	}
	if err != nil {
		return fmt.Errorf("get job: %w", err)
	}
	job := cached.DeepCopy()
	now := time.Now()
	pods, err := c.claimPods(ctx, job)
	if err != nil {
		return err
	}
	mem := c.memory(key)

	if _, done := isJobFinished(job); done {
		// The counts are final: whatever pods still hold the finalizer
		// are let go, then the Job waits for its time to live.
		for _, p := range pods {
			if slices.Contains(p.Finalizers, TrackingFinalizer) && !mem.removed[p.UID] {
				if err := c.removeFinalizer(ctx, p); err != nil {
					return err
				}
				mem.removed[p.UID] = true
			}
		}
		return c.handleTTL(ctx, job, now)
	}
	s := newJobState(c, job, pods, mem, now)
	return s.run(ctx, key)
}

// handleTTL deletes a finished Job once ttlSecondsAfterFinished has
// passed, with background propagation so its pods go too.
func (c *Controller) handleTTL(ctx context.Context, job *batchv1.Job, now time.Time) error {
	ttl := job.Spec.TTLSecondsAfterFinished
	if ttl == nil || job.DeletionTimestamp != nil {
		return nil
	}
	var finished time.Time
	for _, cond := range job.Status.Conditions {
		if (cond.Type == batchv1.JobComplete || cond.Type == batchv1.JobFailed) && cond.Status == corev1.ConditionTrue {
			finished = cond.LastTransitionTime.Time
		}
	}
	if job.Status.CompletionTime != nil {
		finished = job.Status.CompletionTime.Time
	}
	expire := finished.Add(time.Duration(*ttl) * time.Second)
	if now.Before(expire) {
		c.jobQueue.AddAfter(job.Namespace+"/"+job.Name, expire.Sub(now)+10*time.Millisecond)
		return nil
	}
	// Read it fresh: the TTL may have been changed since the cache saw it.
	fresh, err := c.cfg.Client.BatchV1().Jobs(job.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get job: %w", err)
	}
	if fresh.UID != job.UID || fresh.Spec.TTLSecondsAfterFinished == nil || *fresh.Spec.TTLSecondsAfterFinished != *ttl {
		c.jobQueue.Add(job.Namespace + "/" + job.Name)
		return nil
	}
	err = c.cfg.Client.BatchV1().Jobs(job.Namespace).Delete(ctx, job.Name, metav1.DeleteOptions{
		PropagationPolicy: new(metav1.DeletePropagationBackground),
		Preconditions:     &metav1.Preconditions{UID: &job.UID, ResourceVersion: &fresh.ResourceVersion},
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete expired job: %w", err)
	}
	c.log.Info("deleted finished job after its time to live", "job", job.Namespace+"/"+job.Name)
	return nil
}

// writeStatus writes the Job's status when it differs from orig and
// returns the Job as stored.
func (c *Controller) writeStatus(ctx context.Context, job *batchv1.Job, orig *batchv1.JobStatus) (*batchv1.Job, error) {
	if apiequality.Semantic.DeepEqual(job.Status, *orig) {
		return job, nil
	}
	got, err := c.cfg.Client.BatchV1().Jobs(job.Namespace).UpdateStatus(ctx, job, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("update job status: %w", err)
	}
	return got, nil
}

func uidSet(l []types.UID) sets.Set[types.UID] { return sets.New(l...) }
