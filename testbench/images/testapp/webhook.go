package main

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
)

// admissionReview is the part of an admission.k8s.io/v1 AdmissionReview
// the webhook reads and writes.
type admissionReview struct {
	APIVersion string             `json:"apiVersion"`
	Kind       string             `json:"kind"`
	Request    *admissionRequest  `json:"request,omitempty"`
	Response   *admissionResponse `json:"response,omitempty"`
}

type admissionRequest struct {
	UID    string `json:"uid"`
	Object struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	} `json:"object"`
}

type admissionResponse struct {
	UID       string          `json:"uid"`
	Allowed   bool            `json:"allowed"`
	Patch     []byte          `json:"patch,omitempty"`
	PatchType string          `json:"patchType,omitempty"`
	Result    *admissionError `json:"status,omitempty"`
}

type admissionError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// webhook serves admission webhooks over HTTPS on addr with the
// certificate and key in $WEBHOOK_CERT and $WEBHOOK_KEY (PEM): /mutate
// labels every object webhook=edge, /validate refuses objects labelled
// deny=true, /healthz answers ok. It exits on error.
func webhook(addr string) {
	if err := serveWebhook(addr); err != nil {
		fmt.Fprintln(os.Stderr, "webhook:", err)
		os.Exit(1)
	}
}

func serveWebhook(addr string) error {
	cert, err := tls.X509KeyPair([]byte(os.Getenv("WEBHOOK_CERT")), []byte(os.Getenv("WEBHOOK_KEY")))
	if err != nil {
		return fmt.Errorf("load webhook certificate: %w", err)
	}
	host, _ := os.Hostname()
	review := func(decide func(req *admissionRequest, resp *admissionResponse)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			var ar admissionReview
			if err := json.NewDecoder(r.Body).Decode(&ar); err != nil || ar.Request == nil {
				http.Error(w, "bad admission review", http.StatusBadRequest)
				return
			}
			resp := &admissionResponse{UID: ar.Request.UID, Allowed: true}
			decide(ar.Request, resp)
			fmt.Printf("%s %s allowed=%v\n", r.URL.Path, ar.Request.UID, resp.Allowed)
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(admissionReview{APIVersion: ar.APIVersion, Kind: ar.Kind, Response: resp})
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/mutate", review(func(req *admissionRequest, resp *admissionResponse) {
		patch := `[{"op":"add","path":"/metadata/labels/webhook","value":"edge"}]`
		if req.Object.Metadata.Labels == nil {
			patch = `[{"op":"add","path":"/metadata/labels","value":{"webhook":"edge"}}]`
		}
		resp.Patch, resp.PatchType = []byte(patch), "JSONPatch"
	}))
	mux.HandleFunc("/validate", review(func(req *admissionRequest, resp *admissionResponse) {
		if req.Object.Metadata.Labels["deny"] == "true" {
			resp.Allowed = false
			resp.Result = &admissionError{Code: 403, Message: "pods labelled deny=true are refused by " + host}
		}
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	srv := &http.Server{Addr: addr, Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	return srv.ListenAndServeTLS("", "")
}
