package aggregator

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	"github.com/tether-edge/tether/hub/registry"
)

func TestAPIServiceValidation(t *testing.T) {
	k := apiServiceKind()
	port := int32(8443)
	valid := func() *apiregistrationv1.APIService {
		return &apiregistrationv1.APIService{
			ObjectMeta: metav1.ObjectMeta{Name: "v1beta1.metrics.k8s.io"},
			Spec: apiregistrationv1.APIServiceSpec{Group: "metrics.k8s.io", Version: "v1beta1", InsecureSkipTLSVerify: true,
				Service:              &apiregistrationv1.ServiceReference{Namespace: "kube-system", Name: "metrics-server"},
				GroupPriorityMinimum: 100, VersionPriority: 100},
		}
	}
	s := valid()
	k.Default(s)
	if s.Spec.Service.Port == nil || *s.Spec.Service.Port != 443 {
		t.Fatalf("service port not defaulted to 443: %v", s.Spec.Service.Port)
	}
	if errs := k.Validate(s); len(errs) != 0 {
		t.Fatalf("valid APIService refused: %v", errs)
	}
	cases := []struct {
		name   string
		mutate func(*apiregistrationv1.APIService)
		field  string
		detail string
	}{
		{"name not version.group", func(s *apiregistrationv1.APIService) { s.Name = "metrics" }, "metadata.name", "must be `spec.version+\".\"+spec.group`"},
		{"group priority", func(s *apiregistrationv1.APIService) { s.Spec.GroupPriorityMinimum = 20001 }, "spec.groupPriorityMinimum", "must be positive and less than 20000"},
		{"version priority", func(s *apiregistrationv1.APIService) { s.Spec.VersionPriority = 0 }, "spec.versionPriority", "must be positive and less than 1000"},
		{"port", func(s *apiregistrationv1.APIService) { s.Spec.Service.Port = &port; *s.Spec.Service.Port = 70000 }, "spec.service.port", "port is not valid"},
		{"both tls modes", func(s *apiregistrationv1.APIService) { s.Spec.CABundle = []byte("x") }, "spec.insecureSkipTLSVerify", "may not be true if caBundle is present"},
		{"bad pem", func(s *apiregistrationv1.APIService) {
			s.Spec.InsecureSkipTLSVerify = false
			s.Spec.CABundle = []byte("not pem")
		}, "spec.caBundle", "PEM"},
		{"local with caBundle", func(s *apiregistrationv1.APIService) {
			s.Spec.Service = nil
			s.Spec.InsecureSkipTLSVerify = false
			s.Spec.CABundle = []byte("x")
		}, "spec.caBundle", "local APIServices may not have a caBundle"},
		{"empty group", func(s *apiregistrationv1.APIService) { s.Spec.Group = ""; s.Name = "v1beta1." }, "spec.group", "only v1 may have an empty group"},
	}
	for _, c := range cases {
		s := valid()
		c.mutate(s)
		k.Default(s)
		errs := k.Validate(s)
		found := false
		for _, e := range errs {
			if e.Field == c.field && strings.Contains(e.Error(), c.detail) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: want %s %q, got %v", c.name, c.field, c.detail, errs)
		}
	}
	if r := pathSegmentName("v1.", false); len(r) != 0 {
		t.Errorf("name v1. refused: %v", r)
	}
	if r := pathSegmentName("a/b", false); len(r) == 0 {
		t.Error("name with a slash accepted")
	}
}

func TestAPIServiceTable(t *testing.T) {
	k := apiServiceKind()
	now := time.Now()
	local := &apiregistrationv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: "v1.apps", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))}}
	local.Status.Conditions = []apiregistrationv1.APIServiceCondition{{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionTrue, Reason: "Local"}}
	remote := remoteAPIService(nil, false)
	remote.Status.Conditions = []apiregistrationv1.APIServiceCondition{{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionFalse, Reason: "MissingEndpoints"}}
	var names []string
	for _, c := range k.Columns {
		names = append(names, c.Name)
	}
	if strings.Join(names, ",") != "Name,Service,Available,Age" {
		t.Fatalf("columns %v", names)
	}
	if got := k.Cells(local, now); got[1] != "Local" || got[2] != "True" || got[3] != "60m" {
		t.Errorf("local row %v", got)
	}
	if got := k.Cells(remote, now); got[1] != "echo/api" || got[2] != "False (MissingEndpoints)" {
		t.Errorf("remote row %v", got)
	}
	if got := k.Cells(&apiregistrationv1.APIService{}, now); got[2] != "Unknown" {
		t.Errorf("no condition: %v", got)
	}
}

func TestLocalAPIServicesOfKinds(t *testing.T) {
	custom := &registry.Kind{GVK: schema.GroupVersionKind{Group: "stable.example.com", Version: "v1", Kind: "CronTab"}, Resource: "crontabs"}
	got := localAPIServices(append(registry.All(), append(Kinds(), custom)...))
	for name, want := range map[string]struct {
		group, version string
		gp, vp         int32
		managed        string
	}{
		"v1.":                       {"", "v1", 18000, 1, managedOnStart},
		"v1.apps":                   {"apps", "v1", 17800, 15, managedOnStart},
		"v1.apiregistration.k8s.io": {"apiregistration.k8s.io", "v1", 18000, 15, managedOnStart},
		"v1.stable.example.com":     {"stable.example.com", "v1", 1000, 100, managedSync},
	} {
		s := got[name]
		if s == nil {
			t.Errorf("no Local APIService %s", name)
			continue
		}
		if s.Spec.Service != nil || s.Spec.Group != want.group || s.Spec.Version != want.version ||
			s.Spec.GroupPriorityMinimum != want.gp || s.Spec.VersionPriority != want.vp || s.Labels[labelAutoManaged] != want.managed {
			t.Errorf("%s: %+v %v", name, s.Spec, s.Labels)
		}
		if errs := apiServiceKind().Validate(s); len(errs) != 0 {
			t.Errorf("%s invalid: %v", name, errs)
		}
	}
}
