// Package sitekeys keeps the gossip keys of every site: for each distinct
// topology.kubernetes.io/zone label value among Nodes, a Secret in
// kube-system (sitedigest.KeySecretName) holding the keys the site's
// agents encrypt and authenticate their gossip with. The node authorizer
// lets a node read exactly its own site's Secret.
//
// A site's Secret starts with one random 32-byte key and is rotated every
// Rotation: a new key goes first (agents encrypt with the first key and
// accept all of them), and the previous two stay, so members that have
// not seen the newest Secret yet still understand and are understood. The
// time of the last rotation is kept in an annotation of the Secret, so a
// restarted hub rotates neither early nor late.
package sitekeys

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/controllers/internal/kit"
	"github.com/tether-edge/tether/internal/sitedigest"
)

// Names the controller writes on a site's key Secret.
const (
	// LabelSite carries the site (the zone label value) the Secret's keys
	// belong to: the Secret's name holds only a hash of it.
	LabelSite = "site.tether.io/site"
	// AnnotationRotated is when the newest key was made (RFC 3339).
	AnnotationRotated = "site.tether.io/keys-rotated-at"
)

// KeySize is the length of one gossip key (AES-256).
const KeySize = 32

// Kept is how many keys a Secret holds at most: the newest and the two
// before it.
const Kept = 3

// DefaultRotation is how often keys are rotated unless configured.
const DefaultRotation = 24 * time.Hour

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client writes the Secrets and reads them (kube-system only).
	Client kubernetes.Interface
	// Informers is the shared factory the controller's Node informer is
	// registered on; New must be called before it starts.
	Informers informers.SharedInformerFactory
	// Rotation is how often a site's keys are rotated; zero means
	// DefaultRotation.
	Rotation time.Duration
	// Clock is the controller's time; nil means the real clock.
	Clock clock.WithTicker
	// Rand is the source of keys; nil means crypto/rand.
	Rand io.Reader
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Controller keeps each site's gossip key Secret.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	queue   *kit.Queue
	nodes   corelisters.NodeLister
	secrets corelisters.SecretLister
	// secretsFactory watches only the key Secrets of kube-system.
	secretsFactory informers.SharedInformerFactory
	synced         []cache.InformerSynced
}

// New registers the controller's informers; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create sitekeys controller: client and informers are required")
	}
	if cfg.Rotation <= 0 {
		cfg.Rotation = DefaultRotation
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Reader
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{
		cfg:   cfg,
		log:   log.With("controller", "sitekeys"),
		queue: kit.NewQueue("sitekeys", kit.WithBackoff(100*time.Millisecond, time.Minute), kit.WithClock(cfg.Clock)),
	}
	c.secretsFactory = informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0,
		informers.WithNamespace(sitedigest.KeySecretNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("type", sitedigest.KeySecretType).String()
		}))
	nodeInf := cfg.Informers.Core().V1().Nodes()
	secInf := c.secretsFactory.Core().V1().Secrets()
	c.nodes, c.secrets = nodeInf.Lister(), secInf.Lister()
	c.synced = []cache.InformerSynced{nodeInf.Informer().HasSynced, secInf.Informer().HasSynced}

	site := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		switch o := obj.(type) {
		case *corev1.Node:
			if z := o.Labels[corev1.LabelTopologyZone]; z != "" {
				c.queue.Add(z)
			}
		case *corev1.Secret:
			if z := o.Labels[LabelSite]; z != "" {
				c.queue.Add(z)
			}
		}
	}
	// A Node's site matters when the Node comes, goes or moves; its
	// other updates (status reports, most of all) leave the keys as they
	// are, and each sync looks at the site's Nodes.
	h := cache.ResourceEventHandlerFuncs{
		AddFunc: site,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			if ok1 && ok2 && o.Labels[corev1.LabelTopologyZone] == n.Labels[corev1.LabelTopologyZone] {
				return
			}
			site(old)
			site(cur)
		},
		DeleteFunc: site,
	}
	if _, err := nodeInf.Informer().AddEventHandler(h); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	// Only changes of a Secret bring its site back: a deleted or altered
	// one is written again.
	if _, err := secInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, cur any) { site(cur) },
		DeleteFunc: site,
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	return c, nil
}

// Run waits for the informers, then keeps the sites' keys until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	c.secretsFactory.Start(ctx.Done())
	defer c.secretsFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("sitekeys controller running", "rotation", c.cfg.Rotation)
	c.queue.Run(ctx, 1, c.log, c.sync)
	return nil
}

// hasNodes reports whether some Node is in site.
func (c *Controller) hasNodes(site string) (bool, error) {
	nodes, err := c.nodes.List(labelsZone(site))
	if err != nil {
		return false, err
	}
	return len(nodes) > 0, nil
}

// sync makes site's Secret exist and rotates it when due. The Secret of a
// site whose last node went is left as it is (a site's nodes may come
// back), and no longer rotated.
func (c *Controller) sync(ctx context.Context, site string) error {
	has, err := c.hasNodes(site)
	if err != nil || !has {
		return err
	}
	name := sitedigest.KeySecretName(site)
	now := c.cfg.Clock.Now()
	cur, err := c.secrets.Secrets(sitedigest.KeySecretNamespace).Get(name)
	if apierrors.IsNotFound(err) {
		return c.create(ctx, site, now)
	}
	if err != nil {
		return err
	}
	keys := cur.Data[sitedigest.KeySecretKey]
	rotated, perr := time.Parse(time.RFC3339, cur.Annotations[AnnotationRotated])
	rotating := false
	switch {
	case len(keys) == 0 || len(keys)%KeySize != 0 || len(keys) > Kept*KeySize:
		// Not keys this controller wrote: start over with a fresh one.
		c.log.Warn("site key secret holds no valid keys; replacing them", "site", site, "secret", name, "bytes", len(keys))
		if keys, err = c.newKey(); err != nil {
			return err
		}
		rotated = now
	case perr != nil:
		// No record of the last rotation: count from now rather than
		// rotate at once.
		rotated = now
	case !now.Before(rotated.Add(c.cfg.Rotation)):
		k, err := c.newKey()
		if err != nil {
			return err
		}
		keys = append(k, keys[:min(len(keys), (Kept-1)*KeySize)]...)
		rotated = now
		rotating = true
	}
	if err := c.update(ctx, cur, site, keys, rotated); err != nil {
		return err
	}
	if rotating {
		c.log.Info("rotated site gossip keys", "site", site, "secret", name, "keys", len(keys)/KeySize)
	}
	return kit.RequeueAfter(rotated.Add(c.cfg.Rotation).Sub(now))
}

func (c *Controller) newKey() ([]byte, error) {
	k := make([]byte, KeySize)
	if _, err := io.ReadFull(c.cfg.Rand, k); err != nil {
		return nil, fmt.Errorf("generate site gossip key: %w", err)
	}
	return k, nil
}

func (c *Controller) create(ctx context.Context, site string, now time.Time) error {
	k, err := c.newKey()
	if err != nil {
		return err
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:        sitedigest.KeySecretName(site),
			Namespace:   sitedigest.KeySecretNamespace,
			Labels:      map[string]string{LabelSite: site},
			Annotations: map[string]string{AnnotationRotated: now.UTC().Format(time.RFC3339)},
		},
		Type: sitedigest.KeySecretType,
		Data: map[string][]byte{sitedigest.KeySecretKey: k},
	}
	secrets := c.cfg.Client.CoreV1().Secrets(sitedigest.KeySecretNamespace)
	if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			if o, gerr := secrets.Get(ctx, s.Name, metav1.GetOptions{}); gerr == nil && o.Type != s.Type {
				// Not a key Secret (the informer sees those only): leave
				// it to whoever made it.
				c.log.Error("cannot keep site gossip keys: a secret of another type has their name", "site", site, "secret", s.Name, "type", o.Type)
				return nil
			}
		}
		return fmt.Errorf("create site key secret %s: %w", s.Name, err)
	}
	c.log.Info("created site gossip keys", "site", site, "secret", s.Name)
	return kit.RequeueAfter(c.cfg.Rotation)
}

// update writes keys, the site label and the rotation time unless the
// Secret holds them already.
func (c *Controller) update(ctx context.Context, cur *corev1.Secret, site string, keys []byte, rotated time.Time) error {
	at := rotated.UTC().Format(time.RFC3339)
	if bytes.Equal(cur.Data[sitedigest.KeySecretKey], keys) && cur.Annotations[AnnotationRotated] == at && cur.Labels[LabelSite] == site {
		return nil
	}
	s := cur.DeepCopy()
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[sitedigest.KeySecretKey] = keys
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels[LabelSite] = site
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[AnnotationRotated] = at
	if _, err := c.cfg.Client.CoreV1().Secrets(s.Namespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update site key secret %s: %w", s.Name, err)
	}
	return nil
}

func labelsZone(site string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{corev1.LabelTopologyZone: site})
}
