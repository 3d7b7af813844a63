// Package clusterroleaggregation keeps aggregated ClusterRoles current, as
// kube-controller-manager's clusterrole-aggregation controller does: the
// rules of a ClusterRole with an aggregationRule are the union of the
// rules of every other ClusterRole matching one of its selectors, in the
// order of their names, without duplicates. Whenever any ClusterRole
// changes, every aggregated one is recomputed.
package clusterroleaggregation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	rbaclisters "k8s.io/client-go/listers/rbac/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/controllers/internal/kit"
)

// Config configures the controller. Client and Informers are required.
type Config struct {
	// Client updates the aggregated ClusterRoles; it needs escalate on
	// clusterroles, since it writes rules it may not hold itself.
	Client kubernetes.Interface
	// Informers is the shared factory the controller registers its
	// ClusterRole informer on; New must be called before it starts.
	Informers informers.SharedInformerFactory
	// Workers is the number of ClusterRoles handled at once; zero means 1.
	Workers int
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Controller recomputes aggregated ClusterRoles.
type Controller struct {
	cfg    Config
	log    *slog.Logger
	queue  *kit.Queue
	roles  rbaclisters.ClusterRoleLister
	synced cache.InformerSynced
}

// New registers the controller's informer; nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil || cfg.Informers == nil {
		return nil, errors.New("create clusterrole-aggregation controller: client and informers are required")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	inf := cfg.Informers.Rbac().V1().ClusterRoles()
	c := &Controller{
		cfg:    cfg,
		log:    log,
		queue:  kit.NewQueue("clusterrole-aggregation", kit.WithBackoff(10*time.Millisecond, time.Minute)),
		roles:  inf.Lister(),
		synced: inf.Informer().HasSynced,
	}
	// Any ClusterRole may start or stop matching a selector: recompute
	// every aggregated one.
	all := func(any) { c.enqueueAggregated() }
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    all,
		UpdateFunc: func(_, n any) { all(n) },
		DeleteFunc: all,
	}); err != nil {
		return nil, fmt.Errorf("add event handler: %w", err)
	}
	return c, nil
}

func (c *Controller) enqueueAggregated() {
	roles, err := c.roles.List(labels.Everything())
	if err != nil {
		return
	}
	for _, r := range roles {
		if r.AggregationRule != nil {
			c.queue.Add(r.Name)
		}
	}
}

// Run waits for the informer, then keeps aggregated ClusterRoles current
// until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced) {
		return nil
	}
	c.log.Info("clusterrole-aggregation controller running")
	c.queue.Run(ctx, c.cfg.Workers, c.log, c.sync)
	return nil
}

// sync sets the rules of the aggregated ClusterRole name.
func (c *Controller) sync(ctx context.Context, name string) error {
	role, err := c.roles.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get clusterrole %s: %w", name, err)
	}
	if role.AggregationRule == nil {
		return nil
	}
	rules, err := c.aggregate(role)
	if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(rules, role.Rules) {
		return nil
	}
	upd := role.DeepCopy()
	upd.Rules = rules
	if _, err := c.cfg.Client.RbacV1().ClusterRoles().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("update clusterrole %s: %w", name, err)
	}
	return nil
}

// aggregate returns the union of the rules of the ClusterRoles role's
// selectors match, role itself left out.
func (c *Controller) aggregate(role *rbacv1.ClusterRole) ([]rbacv1.PolicyRule, error) {
	seen := map[string]bool{}
	var rules []rbacv1.PolicyRule
	for _, ls := range role.AggregationRule.ClusterRoleSelectors {
		sel, err := metav1.LabelSelectorAsSelector(&ls)
		if err != nil {
			// Validation keeps such selectors out; skip one that slipped
			// through rather than stop aggregating the others.
			c.log.Warn("invalid aggregation selector", "clusterrole", role.Name, "err", err)
			continue
		}
		matched, err := c.roles.List(sel)
		if err != nil {
			return nil, fmt.Errorf("list clusterroles: %w", err)
		}
		sort.Slice(matched, func(i, j int) bool { return matched[i].Name < matched[j].Name })
		for _, m := range matched {
			if m.Name == role.Name || seen[m.Name] {
				continue
			}
			seen[m.Name] = true
			for _, r := range m.Rules {
				if !containsRule(rules, r) {
					rules = append(rules, *r.DeepCopy())
				}
			}
		}
	}
	return rules, nil
}

func containsRule(rules []rbacv1.PolicyRule, r rbacv1.PolicyRule) bool {
	for _, x := range rules {
		if equality.Semantic.DeepEqual(x, r) {
			return true
		}
	}
	return false
}
