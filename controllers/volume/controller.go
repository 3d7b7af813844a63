// Package volume binds PersistentVolumeClaims to PersistentVolumes, and
// provisions tether's local-path volumes: the part of upstream's
// persistentvolume-binder controller that small sites need, plus the
// provisioner k3s users know as local-path.
//
// A claim is bound to the volume the scheduler reserved for it (the
// volume's claimRef), to the volume it names, or to the smallest Available
// static volume of its class that has the capacity, access modes and
// volume mode it asks for. A claim of a class whose provisioner is
// tether.io/local-path gets, once the scheduler chose its node (the
// selected-node annotation of WaitForFirstConsumer binding), a hostPath
// volume under the configured root on that node, with a node affinity that
// keeps its pods there. A volume whose claim is gone is Released, and
// deleted when its reclaim policy says Delete and tether provisioned it.
// The node's agent creates the directory when a pod first mounts it, and
// removes it once the volume is deleted.
//
// Claims carry upstream's kubernetes.io/pvc-protection finalizer: a claim
// deleted while a scheduled pod that has not finished uses it stays (with
// its deletion timestamp) until no such pod is left. Volumes carry
// kubernetes.io/pv-protection: a volume deleted while a claim is bound to
// it stays until that claim is gone. The hub's admission puts both on at
// creation; the controller adds them to objects stored before it did, and
// removes them once nothing holds the object.
package volume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Names the controller reads and writes, as upstream's.
const (
	// LocalPathProvisioner is the provisioner name of tether's local-path
	// StorageClass.
	LocalPathProvisioner = "tether.io/local-path"
	// DefaultLocalPathRoot is where local-path volumes live on nodes.
	DefaultLocalPathRoot = "/var/lib/tether/storage"

	annSelectedNode     = "volume.kubernetes.io/selected-node"
	annBindCompleted    = "pv.kubernetes.io/bind-completed"
	annBoundByCtrl      = "pv.kubernetes.io/bound-by-controller"
	annProvisionedBy    = "pv.kubernetes.io/provisioned-by"
	annBetaStorageClass = "volume.beta.kubernetes.io/storage-class"
	hostnameLabel       = "kubernetes.io/hostname"

	// PVCProtectionFinalizer keeps a claim that pods use.
	PVCProtectionFinalizer = "kubernetes.io/pvc-protection"
	// PVProtectionFinalizer keeps a volume that a claim is bound to.
	PVProtectionFinalizer = "kubernetes.io/pv-protection"
)

// Config configures the controller. Client and Informers are required.
type Config struct {
	Client    kubernetes.Interface
	Informers informers.SharedInformerFactory
	// Workers is the number of objects handled at once; zero means 2.
	Workers int
	Logger  *slog.Logger
	// LocalPathRoot is the directory on nodes under which local-path
	// volumes are made; empty means DefaultLocalPathRoot.
	LocalPathRoot string
}

// Controller binds claims and volumes.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	queue   *kit.Queue
	pvcs    corelisters.PersistentVolumeClaimLister
	pvs     corelisters.PersistentVolumeLister
	pods    corelisters.PodLister
	classes storagelisters.StorageClassLister
	synced  []cache.InformerSynced
}

// Keys in the queue: "claim/<ns>/<name>" and "volume/<name>".
const (
	claimPrefix  = "claim/"
	volumePrefix = "volume/"
)

// New registers the controller's informers; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create volume controller: client and informers are required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.LocalPathRoot == "" {
		cfg.LocalPathRoot = DefaultLocalPathRoot
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{
		cfg:   cfg,
		log:   log.With("controller", "persistentvolume-binder"),
		queue: kit.NewQueue("persistentvolume-binder", kit.WithBackoff(100*time.Millisecond, time.Minute)),
	}
	pvcInf := cfg.Informers.Core().V1().PersistentVolumeClaims()
	pvInf := cfg.Informers.Core().V1().PersistentVolumes()
	scInf := cfg.Informers.Storage().V1().StorageClasses()
	podInf := cfg.Informers.Core().V1().Pods()
	c.pvcs, c.pvs, c.classes, c.pods = pvcInf.Lister(), pvInf.Lister(), scInf.Lister(), podInf.Lister()
	c.synced = []cache.InformerSynced{pvcInf.Informer().HasSynced, pvInf.Informer().HasSynced, scInf.Informer().HasSynced,
		podInf.Informer().HasSynced}
	unwrap := func(obj any) any {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			return t.Obj
		}
		return obj
	}
	claim := func(obj any) {
		if p, ok := unwrap(obj).(*corev1.PersistentVolumeClaim); ok {
			c.queue.Add(claimPrefix + p.Namespace + "/" + p.Name)
			if p.Spec.VolumeName != "" {
				c.queue.Add(volumePrefix + p.Spec.VolumeName)
			}
		}
	}
	volume := func(obj any) {
		if v, ok := unwrap(obj).(*corev1.PersistentVolume); ok {
			c.queue.Add(volumePrefix + v.Name)
			if r := v.Spec.ClaimRef; r != nil {
				c.queue.Add(claimPrefix + r.Namespace + "/" + r.Name)
				return
			}
			// A free volume may suit a claim waiting for one.
			claims, _ := c.pvcs.List(labels.Everything())
			for _, p := range claims {
				if p.Spec.VolumeName == "" && claimClass(p) == volumeClass(v) {
					c.queue.Add(claimPrefix + p.Namespace + "/" + p.Name)
				}
			}
		}
	}
	for _, r := range []struct {
		inf cache.SharedIndexInformer
		f   func(any)
	}{{pvcInf.Informer(), claim}, {pvInf.Informer(), volume}} {
		if _, err := r.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: r.f, UpdateFunc: func(_, n any) { r.f(n) }, DeleteFunc: r.f,
		}); err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
	}
	// A pod that finished or went away may free a claim being deleted.
	released := func(obj any) {
		p, ok := unwrap(obj).(*corev1.Pod)
		if !ok {
			return
		}
		for _, name := range podClaims(p) {
			if pvc, err := c.pvcs.PersistentVolumeClaims(p.Namespace).Get(name); err == nil && pvc.DeletionTimestamp != nil {
				c.queue.Add(claimPrefix + p.Namespace + "/" + name)
			}
		}
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, n any) {
			if p, ok := n.(*corev1.Pod); ok && podDone(p) {
				released(p)
			}
		},
		DeleteFunc: released,
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	// A new class may make pending claims provisionable.
	if _, err := scInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) {
		claims, _ := c.pvcs.List(labels.Everything())
		for _, p := range claims {
			if p.Spec.VolumeName == "" {
				c.queue.Add(claimPrefix + p.Namespace + "/" + p.Name)
			}
		}
	}}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	return c, nil
}

// Run works until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("persistentvolume binder running", "workers", c.cfg.Workers, "local_path_root", c.cfg.LocalPathRoot)
	c.queue.Run(ctx, c.cfg.Workers, c.log, c.sync)
	return nil
}

// sync binds a queued claim or volume.
func (c *Controller) sync(ctx context.Context, key string) error {
	if rest, ok := strings.CutPrefix(key, claimPrefix); ok {
		ns, name, _ := strings.Cut(rest, "/")
		return c.syncClaim(ctx, ns, name)
	}
	return c.syncVolume(ctx, strings.TrimPrefix(key, volumePrefix))
}

func claimClass(p *corev1.PersistentVolumeClaim) string {
	if v, ok := p.Annotations[annBetaStorageClass]; ok {
		return v
	}
	if p.Spec.StorageClassName != nil {
		return *p.Spec.StorageClassName
	}
	return ""
}

func volumeClass(v *corev1.PersistentVolume) string {
	if c, ok := v.Annotations[annBetaStorageClass]; ok {
		return c
	}
	return v.Spec.StorageClassName
}

func claimedBy(v *corev1.PersistentVolume, p *corev1.PersistentVolumeClaim) bool {
	r := v.Spec.ClaimRef
	return r != nil && r.Namespace == p.Namespace && r.Name == p.Name && (r.UID == "" || r.UID == p.UID)
}

// syncClaim moves one claim towards Bound.
func (c *Controller) syncClaim(ctx context.Context, ns, name string) error {
	p, err := c.pvcs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if p.DeletionTimestamp != nil {
		return c.releaseClaim(ctx, p)
	}
	if !slices.Contains(p.Finalizers, PVCProtectionFinalizer) {
		np := p.DeepCopy()
		np.Finalizers = append(np.Finalizers, PVCProtectionFinalizer)
		if p, err = c.cfg.Client.CoreV1().PersistentVolumeClaims(ns).Update(ctx, np, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	if p.Spec.VolumeName != "" {
		v, err := c.pvs.Get(p.Spec.VolumeName)
		if apierrors.IsNotFound(err) {
			return c.setClaimPhase(ctx, p, corev1.ClaimLost)
		}
		if err != nil {
			return err
		}
		if v.Spec.ClaimRef == nil {
			return c.reserve(ctx, v, p)
		}
		if !claimedBy(v, p) {
			return c.setClaimPhase(ctx, p, corev1.ClaimLost)
		}
		return c.completeBind(ctx, p, v)
	}
	// A volume reserved for the claim: by the scheduler, by the user, or
	// just provisioned.
	vols, err := c.pvs.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, v := range vols {
		if claimedBy(v, p) && v.DeletionTimestamp == nil {
			return c.completeBind(ctx, p, v)
		}
	}
	className := claimClass(p)
	var class *storagev1.StorageClass
	if className != "" {
		if class, err = c.classes.Get(className); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	waitForConsumer := class != nil && class.VolumeBindingMode != nil && *class.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer
	if !waitForConsumer {
		if v := bestMatch(vols, p); v != nil {
			return c.reserve(ctx, v, p)
		}
	}
	if class == nil || class.Provisioner != LocalPathProvisioner {
		return nil // a static volume may come; another provisioner may act
	}
	node := p.Annotations[annSelectedNode]
	if node == "" {
		// Immediate local-path claims cannot be placed: the volume's node
		// is the consumer's. They wait like WaitForFirstConsumer ones.
		return nil
	}
	return c.provision(ctx, p, class, node)
}

// podClaims lists the claims a pod uses: its persistentVolumeClaim
// volumes and the claims of its generic ephemeral volumes.
func podClaims(p *corev1.Pod) []string {
	var out []string
	for _, v := range p.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			out = append(out, p.Name+"-"+v.Name)
		}
	}
	return out
}

// podDone tells a pod that no longer uses its volumes: it finished.
func podDone(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// claimInUse tells whether a scheduled pod that has not finished uses the
// claim; unscheduled pods do not count, as no node will start them with a
// claim being deleted.
func claimInUse(pods []*corev1.Pod, name string) bool {
	for _, p := range pods {
		if p.Spec.NodeName != "" && !podDone(p) && slices.Contains(podClaims(p), name) {
			return true
		}
	}
	return false
}

// releaseClaim lets a deleted claim go once no pod uses it. The hub is
// asked before: a pod just created may not have reached the informer.
func (c *Controller) releaseClaim(ctx context.Context, p *corev1.PersistentVolumeClaim) error {
	if !slices.Contains(p.Finalizers, PVCProtectionFinalizer) {
		return nil
	}
	cached, err := c.pods.Pods(p.Namespace).List(labels.Everything())
	if err != nil {
		return err
	}
	if claimInUse(cached, p.Name) {
		return nil // a pod event brings the claim back
	}
	live, err := c.cfg.Client.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pods := make([]*corev1.Pod, len(live.Items))
	for i := range live.Items {
		pods[i] = &live.Items[i]
	}
	if claimInUse(pods, p.Name) {
		return nil
	}
	np := p.DeepCopy()
	np.Finalizers = slices.DeleteFunc(np.Finalizers, func(f string) bool { return f == PVCProtectionFinalizer })
	_, err = c.cfg.Client.CoreV1().PersistentVolumeClaims(p.Namespace).Update(ctx, np, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// bestMatch is the smallest Available volume that satisfies the claim.
func bestMatch(vols []*corev1.PersistentVolume, p *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	want := p.Spec.Resources.Requests[corev1.ResourceStorage]
	mode := corev1.PersistentVolumeFilesystem
	if p.Spec.VolumeMode != nil {
		mode = *p.Spec.VolumeMode
	}
	var fits []*corev1.PersistentVolume
	for _, v := range vols {
		if v.Spec.ClaimRef != nil || v.DeletionTimestamp != nil || v.Status.Phase == corev1.VolumeReleased || v.Status.Phase == corev1.VolumeFailed {
			continue
		}
		if volumeClass(v) != claimClass(p) {
			continue
		}
		vm := corev1.PersistentVolumeFilesystem
		if v.Spec.VolumeMode != nil {
			vm = *v.Spec.VolumeMode
		}
		if vm != mode {
			continue
		}
		have := v.Spec.Capacity[corev1.ResourceStorage]
		if have.Cmp(want) < 0 || !hasModes(v.Spec.AccessModes, p.Spec.AccessModes) {
			continue
		}
		if p.Spec.Selector != nil {
			sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			if err != nil || !sel.Matches(labels.Set(v.Labels)) {
				continue
			}
		}
		fits = append(fits, v)
	}
	if len(fits) == 0 {
		return nil
	}
	sort.Slice(fits, func(i, j int) bool {
		a, b := fits[i].Spec.Capacity[corev1.ResourceStorage], fits[j].Spec.Capacity[corev1.ResourceStorage]
		if c := a.Cmp(b); c != 0 {
			return c < 0
		}
		return fits[i].Name < fits[j].Name
	})
	return fits[0]
}

func hasModes(have, want []corev1.PersistentVolumeAccessMode) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// reserve points the volume's claimRef at the claim; the claim's side
// follows on the next pass.
func (c *Controller) reserve(ctx context.Context, v *corev1.PersistentVolume, p *corev1.PersistentVolumeClaim) error {
	v = v.DeepCopy()
	v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
		Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion}
	if v.Annotations == nil {
		v.Annotations = map[string]string{}
	}
	v.Annotations[annBoundByCtrl] = "yes"
	_, err := c.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, v, metav1.UpdateOptions{})
	return err
}

// completeBind writes the claim's side of a binding and both statuses.
func (c *Controller) completeBind(ctx context.Context, p *corev1.PersistentVolumeClaim, v *corev1.PersistentVolume) error {
	if v.Spec.ClaimRef.UID == "" {
		nv := v.DeepCopy()
		nv.Spec.ClaimRef.UID = p.UID
		var err error
		if v, err = c.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, nv, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	if v.Status.Phase != corev1.VolumeBound {
		nv := v.DeepCopy()
		nv.Status.Phase, nv.Status.Message, nv.Status.Reason = corev1.VolumeBound, "", ""
		if _, err := c.cfg.Client.CoreV1().PersistentVolumes().UpdateStatus(ctx, nv, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	if p.Spec.VolumeName != v.Name || p.Annotations[annBindCompleted] != "yes" {
		np := p.DeepCopy()
		np.Spec.VolumeName = v.Name
		if np.Annotations == nil {
			np.Annotations = map[string]string{}
		}
		np.Annotations[annBindCompleted] = "yes"
		if p.Spec.VolumeName == "" {
			np.Annotations[annBoundByCtrl] = "yes"
		}
		var err error
		if p, err = c.cfg.Client.CoreV1().PersistentVolumeClaims(p.Namespace).Update(ctx, np, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	if p.Status.Phase != corev1.ClaimBound || !hasModes(p.Status.AccessModes, v.Spec.AccessModes) {
		np := p.DeepCopy()
		np.Status.Phase = corev1.ClaimBound
		np.Status.AccessModes = v.Spec.AccessModes
		np.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: v.Spec.Capacity[corev1.ResourceStorage]}
		if _, err := c.cfg.Client.CoreV1().PersistentVolumeClaims(p.Namespace).UpdateStatus(ctx, np, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func (c *Controller) setClaimPhase(ctx context.Context, p *corev1.PersistentVolumeClaim, phase corev1.PersistentVolumeClaimPhase) error {
	if p.Status.Phase == phase {
		return nil
	}
	np := p.DeepCopy()
	np.Status.Phase = phase
	_, err := c.cfg.Client.CoreV1().PersistentVolumeClaims(p.Namespace).UpdateStatus(ctx, np, metav1.UpdateOptions{})
	return err
}

// provision makes the local-path volume of a claim on node.
func (c *Controller) provision(ctx context.Context, p *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, node string) error {
	name := "pvc-" + string(p.UID)
	size := p.Spec.Resources.Requests[corev1.ResourceStorage]
	if size.IsZero() {
		size = resource.MustParse("1Gi")
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if class.ReclaimPolicy != nil {
		reclaim = *class.ReclaimPolicy
	}
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	modes := p.Spec.AccessModes
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	v := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{annProvisionedBy: LocalPathProvisioner, annBoundByCtrl: "yes"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes: modes,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: p.Namespace, Name: p.Name, UID: p.UID},
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              class.Name,
			VolumeMode:                    p.Spec.VolumeMode,
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: filepath.Join(c.cfg.LocalPathRoot, fmt.Sprintf("%s_%s_%s", name, p.Namespace, p.Name)), Type: &dirOrCreate}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
	_, err := c.cfg.Client.CoreV1().PersistentVolumes().Create(ctx, v, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err == nil {
		c.log.Info("provisioned volume", "volume", name, "claim", p.Namespace+"/"+p.Name, "node", node)
	}
	return err
}

// syncVolume keeps a volume's phase and reclaims it when its claim is
// gone.
func (c *Controller) syncVolume(ctx context.Context, name string) error {
	v, err := c.pvs.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if v.DeletionTimestamp != nil {
		return c.releaseVolume(ctx, v)
	}
	if !slices.Contains(v.Finalizers, PVProtectionFinalizer) {
		nv := v.DeepCopy()
		nv.Finalizers = append(nv.Finalizers, PVProtectionFinalizer)
		if v, err = c.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, nv, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	phase := corev1.VolumeAvailable
	if r := v.Spec.ClaimRef; r != nil {
		p, err := c.pvcs.PersistentVolumeClaims(r.Namespace).Get(r.Name)
		switch {
		case apierrors.IsNotFound(err) || (err == nil && r.UID != "" && p.UID != r.UID):
			// Ask the hub, not the cache, before reclaiming: a claim just
			// created may not have reached the informer yet.
			live, gerr := c.cfg.Client.CoreV1().PersistentVolumeClaims(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
			if gerr == nil && (r.UID == "" || live.UID == r.UID) {
				return nil
			}
			if gerr != nil && !apierrors.IsNotFound(gerr) {
				return gerr
			}
			if r.UID == "" {
				return nil // reserved for a claim that does not exist yet
			}
			phase = corev1.VolumeReleased
			if v.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete && v.Annotations[annProvisionedBy] == LocalPathProvisioner {
				err := c.cfg.Client.CoreV1().PersistentVolumes().Delete(ctx, v.Name, metav1.DeleteOptions{})
				if err == nil {
					c.log.Info("deleted released volume", "volume", v.Name)
				}
				if apierrors.IsNotFound(err) {
					return nil
				}
				return err
			}
		case err != nil:
			return err
		case p.Spec.VolumeName == v.Name:
			phase = corev1.VolumeBound
		default:
			return nil // the claim's side follows
		}
	}
	if v.Status.Phase == phase {
		return nil
	}
	nv := v.DeepCopy()
	nv.Status.Phase = phase
	_, err = c.cfg.Client.CoreV1().PersistentVolumes().UpdateStatus(ctx, nv, metav1.UpdateOptions{})
	return err
}

// holds reports whether the claim p, which v's claimRef names, keeps v
// from being deleted: the claim is the one v was bound to and either
// names v or v is Bound. A binding writes the volume's phase before the
// claim's volumeName, so a volume deleted as soon as it reads Bound is
// still kept for its claim, as upstream keeps every Bound volume.
func holds(v *corev1.PersistentVolume, p *corev1.PersistentVolumeClaim) bool {
	r := v.Spec.ClaimRef
	if r == nil || r.UID != "" && p.UID != r.UID {
		return false
	}
	return p.Spec.VolumeName == v.Name || r.UID != "" && v.Status.Phase == corev1.VolumeBound
}

// releaseVolume lets a deleted volume go once no claim is bound to it. The
// hub is asked before: the cache may not have seen the claim yet.
func (c *Controller) releaseVolume(ctx context.Context, v *corev1.PersistentVolume) error {
	if !slices.Contains(v.Finalizers, PVProtectionFinalizer) {
		return nil
	}
	if r := v.Spec.ClaimRef; r != nil {
		if p, err := c.pvcs.PersistentVolumeClaims(r.Namespace).Get(r.Name); err == nil && holds(v, p) {
			return nil // the claim's deletion brings the volume back
		}
		p, err := c.cfg.Client.CoreV1().PersistentVolumeClaims(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
		if err == nil && holds(v, p) {
			return nil
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	nv := v.DeepCopy()
	nv.Finalizers = slices.DeleteFunc(nv.Finalizers, func(f string) bool { return f == PVProtectionFinalizer })
	_, err := c.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, nv, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
