package hub_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

func createFile(t *testing.T, h *hubtest.Hub, manifest string) (string, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(f, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	return h.Run("create", "-f", f)
}

func dnsPod(name, policy, dnsConfig string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  dnsPolicy: ` + policy + `
  dnsConfig:
` + dnsConfig + `
  containers:
  - {name: app, image: app}
`
}

// TestKubectlPodDNSConfigLimits shows a real hub refusing, through a real
// kubectl, pods whose dnsConfig breaks upstream's limits, with upstream's
// messages, a 422 with field causes, and nothing stored.
func TestKubectlPodDNSConfigLimits(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	createDefaultAccounts(t, h, "default")

	// Upstream's example: policy None with one nameserver, two searches
	// and options.
	if out, err := createFile(t, h, dnsPod("dns-example", "None", `    nameservers: [192.0.2.1]
    searches: [ns1.svc.cluster-domain.example, my.dns.search.suffix]
    options:
    - {name: ndots, value: "2"}
    - name: edns0`)); err != nil {
		t.Fatalf("upstream's dnsConfig example: %v\n%s", err, out)
	}

	var searches []string
	for i := 0; i < 33; i++ {
		searches = append(searches, "s.example")
	}
	long := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63)
	var longList []string
	for i := 0; i < 11; i++ {
		longList = append(longList, long)
	}
	for _, c := range []struct {
		name, policy, config string
		want                 []string
	}{
		{"four-nameservers", "None", `    nameservers: [1.2.3.4, 5.6.7.8, 9.8.0.1, 2.3.4.5]`,
			[]string{`The Pod "four-nameservers" is invalid: spec.dnsConfig.nameservers: Invalid value: ["1.2.3.4","5.6.7.8","9.8.0.1","2.3.4.5"]: must not have more than 3 nameservers`}},
		{"no-nameserver", "None", `    searches: [a.example]`,
			[]string{`The Pod "no-nameserver" is invalid: spec.dnsConfig.nameservers: Required value: must provide at least one DNS nameserver when ` + "`dnsPolicy`" + ` is None`}},
		{"bad-nameserver", "ClusterFirst", `    nameservers: [1.2.3.c]`,
			[]string{`The Pod "bad-nameserver" is invalid: spec.dnsConfig.nameservers[0]: Invalid value: "1.2.3.c": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)`}},
		{"many-searches", "ClusterFirst", `    searches: [` + strings.Join(searches, ", ") + `]`,
			[]string{`The Pod "many-searches" is invalid: spec.dnsConfig.searches: Invalid value: [`, `]: must not have more than 32 search paths`}},
		{"long-searches", "ClusterFirst", `    searches: [` + strings.Join(longList, ", ") + `]`,
			[]string{`The Pod "long-searches" is invalid: spec.dnsConfig.searches: Invalid value: [`, `]: must not have more than 2048 characters (including spaces) in the search list`}},
	} {
		_, err := createFile(t, h, dnsPod(c.name, c.policy, c.config))
		if err == nil {
			t.Errorf("%s: created", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: got\n%v\nwant it to hold %q", c.name, err, w)
			}
		}
		if _, err := h.Run("get", "pod", c.name); err == nil {
			t.Errorf("%s: a refused pod was stored", c.name)
		}
	}

	// The Status is a 422 whose causes name the fields.
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "causes"},
		Spec: corev1.PodSpec{
			DNSPolicy: corev1.DNSNone,
			DNSConfig: &corev1.PodDNSConfig{
				Nameservers: []string{"1.1.1.1", "2.2.2.2", "3.3.3.3", "not-an-ip"},
				Searches:    searches,
			},
			Containers: []corev1.Container{{Name: "app", Image: "app"}},
		},
	}
	_, err = cs.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{})
	var se *apierrors.StatusError
	if !errors.As(err, &se) || se.ErrStatus.Code != http.StatusUnprocessableEntity || se.ErrStatus.Reason != metav1.StatusReasonInvalid {
		t.Fatalf("create: %v, want a 422 Invalid", err)
	}
	var fields []string
	for _, c := range se.ErrStatus.Details.Causes {
		fields = append(fields, string(c.Type)+" "+c.Field)
	}
	want := []string{
		"FieldValueInvalid spec.dnsConfig.nameservers",
		"FieldValueInvalid spec.dnsConfig.nameservers[3]",
		"FieldValueInvalid spec.dnsConfig.searches",
	}
	if strings.Join(fields, "; ") != strings.Join(want, "; ") {
		t.Errorf("causes: %q, want %q", fields, want)
	}
}

// TestKubectlGetExternalNameService shows kubectl get svc printing an
// ExternalName Service as upstream does: no cluster IP, the external name
// as EXTERNAL-IP, and <none> for PORT(S) when it has no ports.
func TestKubectlGetExternalNameService(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	if out, err := createFile(t, h, `apiVersion: v1
kind: Service
metadata:
  name: my-service
  namespace: default
spec:
  type: ExternalName
  externalName: my.database.example.com
`); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	h.MustRun("create", "service", "externalname", "with-port", "--external-name=db.example.com", "--tcp=5432")

	out := h.MustRun("get", "svc", "my-service", "with-port")
	rows := strings.Split(strings.TrimSpace(out), "\n")
	want := []*regexp.Regexp{
		regexp.MustCompile(`^NAME +TYPE +CLUSTER-IP +EXTERNAL-IP +PORT\(S\) +AGE$`),
		regexp.MustCompile(`^my-service +ExternalName +<none> +my\.database\.example\.com +<none> +\d+s$`),
		regexp.MustCompile(`^with-port +ExternalName +<none> +db\.example\.com +5432/TCP +\d+s$`),
	}
	if len(rows) != len(want) {
		t.Fatalf("kubectl get svc:\n%s", out)
	}
	for i, re := range want {
		if !re.MatchString(rows[i]) {
			t.Errorf("row %d: %q, want %s", i, rows[i], re)
		}
	}
	wide := h.MustRun("get", "svc", "my-service", "-o", "wide", "--no-headers")
	if !regexp.MustCompile(`^my-service +ExternalName +<none> +my\.database\.example\.com +<none> +\d+s +<none>\n?$`).MatchString(wide) {
		t.Errorf("kubectl get svc -o wide: %q", wide)
	}
}
