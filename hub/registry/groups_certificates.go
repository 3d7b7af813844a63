package registry

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/go-cmp/cmp"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tether-edge/tether/hub/auth"
)

// csrKind is certificates.k8s.io/v1 CertificateSigningRequest. Its spec is
// fixed at creation, where spec.username, uid and groups are set from the
// requesting user; /approval adds or changes only the Approved and Denied
// conditions, /status the rest of the status (the certificate, Failed).
var csrKind = &Kind{
	GVK:        certificatesv1.SchemeGroupVersion.WithKind("CertificateSigningRequest"),
	Resource:   "certificatesigningrequests",
	Singular:   "certificatesigningrequest",
	ShortNames: []string{"csr"},
	HasStatus:  true,
	// Any name will do, as upstream.
	NameRule: func(string, bool) []string { return nil },
	Mutate:   mutateCSR,
	PrepareForUpdate: func(obj, old runtime.Object) {
		// Updates of the main resource change only metadata.
		obj.(*certificatesv1.CertificateSigningRequest).Spec = old.(*certificatesv1.CertificateSigningRequest).Spec
	},
	PrepareForStatusUpdate: func(obj, old runtime.Object) {
		c, o := obj.(*certificatesv1.CertificateSigningRequest), old.(*certificatesv1.CertificateSigningRequest)
		c.Spec = o.Spec
		// /status keeps the approval conditions as they are; adding or
		// removing one fails validation.
		keepConditions(c, o, certificatesv1.CertificateApproved)
		keepConditions(c, o, certificatesv1.CertificateDenied)
		stampConditions(c, o)
	},
	Subresources: map[string]*SubresourceUpdate{"approval": {
		PrepareForUpdate: func(obj, old runtime.Object) {
			c, o := obj.(*certificatesv1.CertificateSigningRequest), old.(*certificatesv1.CertificateSigningRequest)
			stampConditions(c, o)
			conds := c.Status.Conditions
			c.Spec = o.Spec
			c.Status = *o.Status.DeepCopy()
			c.Status.Conditions = conds
		},
		ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
			return validateCSRUpdate(obj.(*certificatesv1.CertificateSigningRequest), old.(*certificatesv1.CertificateSigningRequest), csrApproval)
		},
	}},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validateCSR(obj.(*certificatesv1.CertificateSigningRequest), csrOptions(nil, nil))
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		return validateCSRUpdate(obj.(*certificatesv1.CertificateSigningRequest), old.(*certificatesv1.CertificateSigningRequest), 0)
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		return validateCSRUpdate(obj.(*certificatesv1.CertificateSigningRequest), old.(*certificatesv1.CertificateSigningRequest), csrStatus)
	},
	Fields: func(obj runtime.Object) fields.Set {
		return fields.Set{"spec.signerName": obj.(*certificatesv1.CertificateSigningRequest).Spec.SignerName}
	},
	FieldLabels: []string{"spec.signerName"},
	Columns: []metav1.TableColumnDefinition{
		nameColumn, ageColumn,
		column("SignerName", "string", 0, "signerName indicates the requested signer, and is a qualified name."),
		column("Requestor", "string", 0, "request contains an x509 certificate signing request encoded in a \"CERTIFICATE REQUEST\" PEM block."),
		column("RequestedDuration", "string", 0, "expirationSeconds is the requested duration of validity of the issued certificate."),
		column("Condition", "string", 0, "conditions applied to the request. Known conditions are \"Approved\", \"Denied\", and \"Failed\"."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		c := obj.(*certificatesv1.CertificateSigningRequest)
		signer := "<none>"
		if c.Spec.SignerName != "" {
			signer = c.Spec.SignerName
		}
		requested := "<none>"
		if c.Spec.ExpirationSeconds != nil {
			requested = duration.HumanDuration(time.Duration(*c.Spec.ExpirationSeconds) * time.Second)
		}
		return []any{c.Name, age(c.CreationTimestamp, now), signer, c.Spec.Username, requested, CSRCondition(c)}
	},
}

// mutateCSR records, on create, who asks: spec.username, uid, groups and
// extra come from the authenticated user and never from the request.
func mutateCSR(ctx context.Context, _ Lister, obj, old runtime.Object) error {
	if old != nil {
		return nil
	}
	c := obj.(*certificatesv1.CertificateSigningRequest)
	c.Spec.Username, c.Spec.UID, c.Spec.Groups, c.Spec.Extra = "", "", nil, nil
	if u, ok := auth.UserFrom(ctx); ok && u != nil {
		c.Spec.Username, c.Spec.UID, c.Spec.Groups = u.Name, u.UID, slices.Clone(u.Groups)
	}
	return nil
}

// CSRCondition summarizes a request's conditions as kubectl's CONDITION
// column does: Denied, Approved or Pending, then ",Failed" and ",Issued".
func CSRCondition(c *certificatesv1.CertificateSigningRequest) string {
	var approved, denied, failed bool
	for _, cond := range c.Status.Conditions {
		switch cond.Type {
		case certificatesv1.CertificateApproved:
			approved = true
		case certificatesv1.CertificateDenied:
			denied = true
		case certificatesv1.CertificateFailed:
			failed = true
		}
	}
	s := "Pending"
	switch {
	case denied:
		s = "Denied"
	case approved:
		s = "Approved"
	}
	if failed {
		s += ",Failed"
	}
	if len(c.Status.Certificate) > 0 {
		s += ",Issued"
	}
	return s
}

// ParseCSR decodes the PEM "CERTIFICATE REQUEST" block of a request.
func ParseCSR(pemBytes []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("PEM block type must be CERTIFICATE REQUEST")
	}
	return x509.ParseCertificateRequest(block.Bytes)
}

// keepConditions puts old's conditions of type t back in place in c when
// c has as many of them; otherwise validation reports the change.
func keepConditions(c, old *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) {
	oi, ni := conditionIndices(old, t), conditionIndices(c, t)
	if len(oi) != len(ni) {
		return
	}
	for i, j := range oi {
		c.Status.Conditions[ni[i]] = old.Status.Conditions[j]
	}
}

func conditionIndices(c *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) []int {
	var out []int
	for i, cond := range c.Status.Conditions {
		if cond.Type == t {
			out = append(out, i)
		}
	}
	return out
}

// stampConditions fills missing lastUpdateTime with now, and missing
// lastTransitionTime with the old one of a condition of the same type and
// status, or now.
func stampConditions(c, old *certificatesv1.CertificateSigningRequest) {
	now := metav1.Now()
	for i := range c.Status.Conditions {
		cond := &c.Status.Conditions[i]
		if cond.LastUpdateTime.IsZero() {
			cond.LastUpdateTime = now
		}
		if !cond.LastTransitionTime.IsZero() {
			continue
		}
		cond.LastTransitionTime = now
		for _, oc := range old.Status.Conditions {
			if oc.Type == cond.Type && oc.Status == cond.Status && !oc.LastTransitionTime.IsZero() {
				cond.LastTransitionTime = oc.LastTransitionTime
				break
			}
		}
	}
}

// csrUpdate says what a write may change beyond metadata.
type csrUpdate int

const (
	csrStatus   csrUpdate = iota + 1 // /status: the certificate
	csrApproval                      // /approval: Approved and Denied
)

// csrValidation lists what a request may hold; the lenient options keep
// objects stored before a rule was tightened updatable, as upstream.
type csrValidation struct {
	bothApprovedAndDenied, duplicateConditionTypes, emptyConditionType bool
	arbitraryCertificate, unknownUsages, duplicateUsages               bool
}

func csrOptions(c, old *certificatesv1.CertificateSigningRequest) csrValidation {
	if old == nil {
		return csrValidation{}
	}
	var o csrValidation
	o.bothApprovedAndDenied = len(conditionIndices(old, certificatesv1.CertificateApproved)) > 0 &&
		len(conditionIndices(old, certificatesv1.CertificateDenied)) > 0
	seen := map[certificatesv1.RequestConditionType]bool{}
	for _, cond := range old.Status.Conditions {
		o.duplicateConditionTypes = o.duplicateConditionTypes || seen[cond.Type]
		o.emptyConditionType = o.emptyConditionType || cond.Type == ""
		seen[cond.Type] = true
	}
	o.arbitraryCertificate = c != nil && bytes.Equal(c.Status.Certificate, old.Status.Certificate) ||
		validateCertificate(old.Status.Certificate) != nil
	seenUsage := map[certificatesv1.KeyUsage]bool{}
	for _, u := range old.Spec.Usages {
		o.unknownUsages = o.unknownUsages || !slices.Contains(validUsages, string(u))
		o.duplicateUsages = o.duplicateUsages || seenUsage[u]
		seenUsage[u] = true
	}
	return o
}

// validUsages are the key usages a request may ask for, sorted.
var validUsages = func() []string {
	u := []certificatesv1.KeyUsage{
		certificatesv1.UsageSigning, certificatesv1.UsageDigitalSignature, certificatesv1.UsageContentCommitment,
		certificatesv1.UsageKeyEncipherment, certificatesv1.UsageKeyAgreement, certificatesv1.UsageDataEncipherment,
		certificatesv1.UsageCertSign, certificatesv1.UsageCRLSign, certificatesv1.UsageEncipherOnly,
		certificatesv1.UsageDecipherOnly, certificatesv1.UsageAny, certificatesv1.UsageServerAuth,
		certificatesv1.UsageClientAuth, certificatesv1.UsageCodeSigning, certificatesv1.UsageEmailProtection,
		certificatesv1.UsageSMIME, certificatesv1.UsageIPsecEndSystem, certificatesv1.UsageIPsecTunnel,
		certificatesv1.UsageIPsecUser, certificatesv1.UsageTimestamping, certificatesv1.UsageOCSPSigning,
		certificatesv1.UsageMicrosoftSGC, certificatesv1.UsageNetscapeSGC,
	}
	out := make([]string, len(u))
	for i, x := range u {
		out[i] = string(x)
	}
	slices.Sort(out)
	return out
}()

func validateCSR(c *certificatesv1.CertificateSigningRequest, o csrValidation) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	req, err := ParseCSR(c.Spec.Request)
	if err == nil {
		err = req.CheckSignature()
	}
	if err != nil {
		errs = append(errs, field.Invalid(spec.Child("request"), c.Spec.Request, err.Error()))
	}
	if len(c.Spec.Usages) == 0 {
		errs = append(errs, field.Required(spec.Child("usages"), ""))
	}
	seen := map[certificatesv1.KeyUsage]bool{}
	for i, u := range c.Spec.Usages {
		if !o.unknownUsages && !slices.Contains(validUsages, string(u)) {
			errs = append(errs, field.NotSupported(spec.Child("usages").Index(i), u, validUsages))
		}
		if !o.duplicateUsages && seen[u] {
			errs = append(errs, field.Duplicate(spec.Child("usages").Index(i), u))
		}
		seen[u] = true
	}
	errs = append(errs, validateSignerName(spec.Child("signerName"), c.Spec.SignerName)...)
	if e := c.Spec.ExpirationSeconds; e != nil && *e < 600 {
		errs = append(errs, field.Invalid(spec.Child("expirationSeconds"), *e, "may not specify a duration less than 600 seconds (10 minutes)"))
	}
	errs = append(errs, validateCSRConditions(field.NewPath("status", "conditions"), c, o)...)
	if !o.arbitraryCertificate {
		if err := validateCertificate(c.Status.Certificate); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("status", "certificate"), "<certificate data>", err.Error()))
		}
	}
	return errs
}

func validateCSRConditions(path *field.Path, c *certificatesv1.CertificateSigningRequest, o csrValidation) field.ErrorList {
	var errs field.ErrorList
	seen := map[certificatesv1.RequestConditionType]bool{}
	var approved, denied bool
	for i, cond := range c.Status.Conditions {
		p := path.Index(i)
		if !o.emptyConditionType && cond.Type == "" {
			errs = append(errs, field.Required(p.Child("type"), ""))
		}
		allowed := []string{string(corev1.ConditionFalse), string(corev1.ConditionTrue), string(corev1.ConditionUnknown)}
		switch cond.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			allowed = []string{string(corev1.ConditionTrue)}
		}
		switch {
		case cond.Status == "":
			errs = append(errs, field.Required(p.Child("status"), ""))
		case !slices.Contains(allowed, string(cond.Status)):
			errs = append(errs, field.NotSupported(p.Child("status"), cond.Status, allowed))
		}
		if !o.bothApprovedAndDenied {
			switch cond.Type {
			case certificatesv1.CertificateApproved:
				approved = true
				if denied {
					errs = append(errs, field.Invalid(p.Child("type"), cond.Type, "Approved and Denied conditions are mutually exclusive"))
				}
			case certificatesv1.CertificateDenied:
				denied = true
				if approved {
					errs = append(errs, field.Invalid(p.Child("type"), cond.Type, "Approved and Denied conditions are mutually exclusive"))
				}
			}
		}
		if !o.duplicateConditionTypes && seen[cond.Type] {
			errs = append(errs, field.Duplicate(p.Child("type"), cond.Type))
		}
		seen[cond.Type] = true
	}
	return errs
}

// validateCSRUpdate checks a write of the main resource (what 0), of
// /status or of /approval against the stored request: no condition of
// type Approved, Denied or Failed goes away, only /approval touches
// Approved and Denied, only /status sets the certificate, once.
func validateCSRUpdate(c, old *certificatesv1.CertificateSigningRequest, what csrUpdate) field.ErrorList {
	errs := validateCSR(c, csrOptions(c, old))
	conds := field.NewPath("status", "conditions")
	for _, t := range []certificatesv1.RequestConditionType{certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed} {
		if len(conditionIndices(c, t)) < len(conditionIndices(old, t)) {
			errs = append(errs, field.Forbidden(conds, fmt.Sprintf("updates may not remove a condition of type %q", t)))
		}
	}
	if what != csrApproval {
		for _, t := range []certificatesv1.RequestConditionType{certificatesv1.CertificateApproved, certificatesv1.CertificateDenied} {
			oc, nc := conditionsOf(old, t), conditionsOf(c, t)
			switch {
			case len(nc) < len(oc):
			case len(nc) > len(oc):
				errs = append(errs, field.Forbidden(conds, fmt.Sprintf("updates may not add a condition of type %q", t)))
			case !apiequality.Semantic.DeepEqual(oc, nc):
				errs = append(errs, field.Forbidden(conds, fmt.Sprintf("updates may not modify a condition of type %q\n%v", t, cmp.Diff(oc, nc))))
			}
		}
	}
	if !bytes.Equal(c.Status.Certificate, old.Status.Certificate) {
		if what != csrStatus {
			errs = append(errs, field.Forbidden(field.NewPath("status", "certificate"), "updates may not set certificate content"))
		} else if len(old.Status.Certificate) > 0 {
			errs = append(errs, field.Forbidden(field.NewPath("status", "certificate"), "updates may not modify existing certificate content"))
		}
	}
	return errs
}

func conditionsOf(c *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) []certificatesv1.CertificateSigningRequestCondition {
	var out []certificatesv1.CertificateSigningRequestCondition
	for _, i := range conditionIndices(c, t) {
		out = append(out, c.Status.Conditions[i])
	}
	return out
}

// validateCertificate accepts an empty status.certificate or one or more
// CERTIFICATE PEM blocks without headers.
func validateCertificate(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	blocks := 0
	for {
		block, rest := pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return fmt.Errorf("only CERTIFICATE PEM blocks are allowed, found %q", block.Type)
		}
		if len(block.Headers) != 0 {
			return errors.New("no PEM block headers are permitted")
		}
		blocks++
		certs, err := x509.ParseCertificates(block.Bytes)
		if err != nil {
			return err
		}
		if len(certs) == 0 {
			return errors.New("found CERTIFICATE PEM block containing 0 certificates")
		}
		data = rest
	}
	if blocks == 0 {
		return errors.New("must contain at least one CERTIFICATE PEM block")
	}
	return nil
}

// validateSignerName checks the form "example.com/signer-name": a domain
// of at least two DNS labels, one slash, and a path of DNS subdomains.
func validateSignerName(path *field.Path, name string) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(path, "")}
	}
	segs := strings.Split(name, "/")
	if len(segs) != 2 {
		return field.ErrorList{field.Invalid(path, name, "must be a fully qualified domain and path of the form 'example.com/signer-name'")}
	}
	var errs field.ErrorList
	if len(segs[0]) > validation.DNS1123SubdomainMaxLength {
		errs = append(errs, field.TooLong(path, "", validation.DNS1123SubdomainMaxLength))
	}
	labels := strings.Split(segs[0], ".")
	for _, l := range labels {
		if msgs := validation.IsDNS1123Label(l); len(msgs) > 0 {
			for _, m := range msgs {
				errs = append(errs, field.Invalid(path, segs[0], fmt.Sprintf("validating label %q: %s", l, m)))
			}
			break
		}
	}
	if len(labels) < 2 {
		errs = append(errs, field.Invalid(path, segs[0], "should be a domain with at least two segments separated by dots"))
	}
	for _, l := range strings.Split(segs[1], ".") {
		if msgs := validation.IsDNS1123Subdomain(l); len(msgs) > 0 {
			for _, m := range msgs {
				errs = append(errs, field.Invalid(path, segs[1], fmt.Sprintf("validating label %q: %s", l, m)))
			}
			break
		}
	}
	maxLen := 2*validation.DNS1123SubdomainMaxLength + validation.DNS1123LabelMaxLength + 2
	if len(name) > maxLen {
		errs = append(errs, field.TooLong(path, "", maxLen))
	}
	return errs
}
