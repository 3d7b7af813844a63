// Package disconnect defines the per-workload disconnect policy: what a
// pod's owner wants done when the pod's node can no longer be heard by
// the hub.
//
// The policy is written as annotations on a pod or on a workload's pod
// template, so every workload kind carries it and kubectl, Helm and GitOps
// tools need nothing new:
//
//	disconnect.tether.io/lost-after: 60s        # how long the pod counts as still running
//	disconnect.tether.io/replace: "true"        # start a replacement elsewhere after lost-after
//	disconnect.tether.io/reconcile: keepReplacement  # who stays when the original comes back
//
// The hub validates the annotations at admission, writes the policy in
// effect on every pod (EffectiveAnnotation) and turns it into the pod's
// toleration of the node.kubernetes.io/unreachable NoExecute taint; the
// node lifecycle controller does the rest. The edge default is
// replace=false: a shop's pods stay pinned to the shop however long its
// link is down. A node its site peers agree is dead is a different
// matter: its pods are replaced whatever their policy.
package disconnect

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The annotations.
const (
	Prefix              = "disconnect.tether.io/"
	LostAfterAnnotation = Prefix + "lost-after"
	ReplaceAnnotation   = Prefix + "replace"
	ReconcileAnnotation = Prefix + "reconcile"
	// EffectiveAnnotation is written by the hub on every pod: the policy
	// in effect once defaults are applied, for kubectl describe.
	EffectiveAnnotation = Prefix + "effective"
)

// Reconcile says which pod stays when a replaced original comes back.
type Reconcile string

// The reconcile modes.
const (
	// KeepReplacement removes the original on reconnect (the default).
	KeepReplacement Reconcile = "keepReplacement"
	// KeepOriginal removes the replacement on reconnect.
	KeepOriginal Reconcile = "keepOriginal"
	// LongestRunning keeps whichever pod has run longer.
	LongestRunning Reconcile = "longestRunning"
)

// DefaultLostAfter is lost-after when replace is true and lost-after is
// not given: upstream's default toleration of an unreachable node.
const DefaultLostAfter = 300 * time.Second

// Policy is a workload's disconnect policy with defaults applied.
type Policy struct {
	LostAfter time.Duration
	Replace   bool
	Reconcile Reconcile
}

// Default returns the policy of a pod that says nothing.
func Default() Policy {
	return Policy{LostAfter: DefaultLostAfter, Replace: false, Reconcile: KeepReplacement}
}

// Parse reads the policy from a pod's or pod template's annotations. path
// is the annotations' field path, for errors. Unknown keys under the
// prefix are errors, so that a typo does not silently leave the default.
func Parse(annotations map[string]string, path *field.Path) (Policy, field.ErrorList) {
	p := Default()
	var errs field.ErrorList
	for k, v := range annotations {
		if !strings.HasPrefix(k, Prefix) {
			continue
		}
		fp := path.Key(k)
		switch k {
		case LostAfterAnnotation:
			d, err := time.ParseDuration(v)
			switch {
			case err != nil:
				errs = append(errs, field.Invalid(fp, v, "must be a duration such as 60s or 10m"))
			case d < 0:
				errs = append(errs, field.Invalid(fp, v, "must be greater than or equal to 0"))
			case d%time.Second != 0:
				errs = append(errs, field.Invalid(fp, v, "must be a whole number of seconds"))
			default:
				p.LostAfter = d
			}
		case ReplaceAnnotation:
			b, err := strconv.ParseBool(v)
			if err != nil || (v != "true" && v != "false") {
				errs = append(errs, field.NotSupported(fp, v, []string{"true", "false"}))
				continue
			}
			p.Replace = b
		case ReconcileAnnotation:
			switch r := Reconcile(v); r {
			case KeepReplacement, KeepOriginal, LongestRunning:
				p.Reconcile = r
			default:
				errs = append(errs, field.NotSupported(fp, v, []string{string(KeepOriginal), string(KeepReplacement), string(LongestRunning)}))
			}
		case EffectiveAnnotation:
			// Written by the hub; a copy from a pod's manifest is
			// overwritten.
		default:
			errs = append(errs, field.NotSupported(fp, k, []string{LostAfterAnnotation, ReplaceAnnotation, ReconcileAnnotation}))
		}
	}
	return p, errs
}

// String is the policy as EffectiveAnnotation shows it.
func (p Policy) String() string {
	if !p.Replace {
		return "replace=false (never replaced while its node is unreachable)"
	}
	return fmt.Sprintf("lostAfter=%s replace=true reconcile=%s", p.LostAfter, p.Reconcile)
}

// Toleration is the toleration of the node.kubernetes.io/unreachable
// NoExecute taint that carries the policy: for ever when the pod is not
// replaced, for LostAfter when it is.
func (p Policy) Toleration() corev1.Toleration {
	t := corev1.Toleration{
		Key:      corev1.TaintNodeUnreachable,
		Operator: corev1.TolerationOpExists,
		Effect:   corev1.TaintEffectNoExecute,
	}
	if p.Replace {
		s := int64(p.LostAfter / time.Second)
		t.TolerationSeconds = &s
	}
	return t
}
