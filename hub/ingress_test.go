package hub_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestKubectlIngress drives Ingresses and IngressClasses with a real
// kubectl: discovery, the tables, the default class given at create,
// invalid objects refused with upstream's field causes, and the status
// subresource.
func TestKubectlIngress(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	ctx := context.Background()
	apply := func(manifest string) (string, error) {
		return h.RunInput(ctx, manifest, nil, "apply", "-f", "-")
	}

	out := h.MustRun("api-resources", "--api-group", "networking.k8s.io")
	for _, re := range []string{`ingressclasses\s+networking.k8s.io/v1\s+false\s+IngressClass`, `ingresses\s+ing\s+networking.k8s.io/v1\s+true\s+Ingress`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("api-resources: no %s in\n%s", re, out)
		}
	}

	const classes = `apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: tether
  annotations:
    ingressclass.kubernetes.io/is-default-class: "true"
spec:
  controller: tether.io/ingress
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: other
spec:
  controller: example.com/other
  parameters:
    apiGroup: example.com
    kind: Config
    name: c
`
	if out, err := apply(classes); err != nil {
		t.Fatalf("apply classes: %q %v", out, err)
	}
	out = h.MustRun("get", "ingressclass")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "NAME CONTROLLER PARAMETERS AGE" ||
		!regexp.MustCompile(`^other\s+example.com/other\s+Config.example.com/c\s+\d+s$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^tether\s+tether.io/ingress\s+<none>\s+\d+s$`).MatchString(lines[2]) {
		t.Errorf("get ingressclass:\n%s", out)
	}

	const web = `apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
spec:
  tls:
  - hosts: [a.example.com]
    secretName: web-tls
  rules:
  - host: a.example.com
    http:
      paths:
      - path: /
        pathType: Prefix
        backend:
          service:
            name: web
            port:
              number: 80
  - host: "*.example.org"
    http:
      paths:
      - path: /api
        pathType: Exact
        backend:
          service:
            name: api
            port:
              name: http
`
	if out, err := apply(web); err != nil || !strings.Contains(out, "ingress.networking.k8s.io/web created") {
		t.Fatalf("apply ingress: %q %v", out, err)
	}
	if got := h.MustRun("get", "ingress", "web", "-o", "jsonpath={.spec.ingressClassName}"); got != "tether" {
		t.Errorf("default class: %q, want tether", got)
	}
	status := `{"status":{"loadBalancer":{"ingress":[{"ip":"192.0.2.7"},{"ip":"192.0.2.5"}]}}}`
	h.MustRun("patch", "ingress", "web", "--subresource", "status", "--type", "merge", "-p", status)
	out = h.MustRun("get", "ing")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME CLASS HOSTS ADDRESS PORTS AGE" ||
		!regexp.MustCompile(`^web\s+tether\s+a.example.com,\*.example.org\s+192.0.2.5,192.0.2.7\s+80, 443\s+\d+s$`).MatchString(lines[1]) {
		t.Errorf("get ingress:\n%s", out)
	}
	// A write of the main resource keeps the status.
	if out, err := apply(strings.Replace(web, "number: 80", "number: 8080", 1)); err != nil || !strings.Contains(out, "configured") {
		t.Fatalf("reapply: %q %v", out, err)
	}
	if got := h.MustRun("get", "ingress", "web", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip} {.metadata.generation}"); got != "192.0.2.7 192.0.2.5 2" {
		t.Errorf("status and generation after an update: %q", got)
	}
	_, err := h.Run("patch", "ingress", "web", "--subresource", "status", "--type", "merge", "-p", `{"status":{"loadBalancer":{"ingress":[{"ip":"not-an-ip"}]}}}`)
	if err == nil || !strings.Contains(err.Error(), `status.loadBalancer.ingress[0].ip: Invalid value: "not-an-ip"`) {
		t.Errorf("bad status: %v", err)
	}

	bad := `apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: bad
spec:
  ingressClassName: other
  rules:
  - host: 10.0.0.1
    http:
      paths:
      - path: foo
        pathType: Prefix
        backend:
          service:
            name: web
      - path: /x
        backend:
          service:
            name: web
            port:
              number: 80
`
	out, err = h.RunInput(ctx, bad, nil, "apply", "-f", "-", "-v=6")
	for _, want := range []string{
		`The Ingress "bad" is invalid`,
		`spec.rules[0].host: Invalid value: "10.0.0.1": must be a DNS name, not an IP address`,
		`spec.rules[0].http.paths[0].path: Invalid value: "foo": must be an absolute path`,
		`spec.rules[0].http.paths[0].backend: Required value: port name or number is required`,
		`spec.rules[0].http.paths[1].pathType: Required value: pathType must be specified`,
		"422 Unprocessable Entity",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("invalid ingress: want %q in %q %v", want, out, err)
		}
	}
	if _, err := h.Run("get", "ingress", "bad"); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("invalid ingress stored: %v", err)
	}
	_, err = apply(strings.Replace(classes, "controller: tether.io/ingress", "controller: tether.io/other", 1))
	if err == nil || !strings.Contains(err.Error(), `spec.controller: Invalid value: "tether.io/other": field is immutable`) {
		t.Errorf("controller change: %v", err)
	}
}
