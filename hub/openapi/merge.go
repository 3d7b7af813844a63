package openapi

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/registry"
)

// merge returns the documents of kinds: the built-in ones as generated at
// start-up, with the documents of custom kinds (registry.Kind.New set)
// merged in. Group-versions that only custom kinds serve get documents of
// their own; a custom kind in a built-in group-version joins its
// document. A kind's document that fails to build is left out.
func (h *Handler) merge(kinds []*registry.Kind) (*docSet, error) {
	byGV := map[schema.GroupVersion][]*registry.Kind{}
	var gvs []schema.GroupVersion
	var custom []*registry.Kind
	for _, k := range kinds {
		if k.New == nil {
			continue
		}
		custom = append(custom, k)
		gv := k.GVK.GroupVersion()
		if byGV[gv] == nil {
			gvs = append(gvs, gv)
		}
		byGV[gv] = append(byGV[gv], k)
	}
	h.forgetKinds(custom)
	if len(custom) == 0 {
		return h.base, nil
	}
	var c compressor
	d := &docSet{v3: maps.Clone(h.base.v3)}
	for _, gv := range gvs {
		body := []byte(`{"openapi":"3.0.0","info":{"title":"tether","version":"v1"},"paths":{},"components":{"schemas":{}}}`)
		if builtin := h.byGV[gv]; builtin != nil {
			var err error
			if body, err = v3Document(builtin, h.scheme); err != nil {
				return nil, err
			}
		}
		var parts [][]byte
		for _, k := range byGV[gv] {
			if b := h.kindDocument(k, true); b != nil {
				parts = append(parts, b)
			}
		}
		merged, err := mergeDocument(body, []string{"components", "schemas"}, parts)
		if err != nil {
			return nil, err
		}
		d.v3[v3Key(gv)] = c.doc(merged, "application/json")
	}
	index := map[string]map[string]string{}
	for key, doc := range d.v3 {
		index[key] = map[string]string{"serverRelativeURL": "/openapi/v3/" + key + "?hash=" + strings.Trim(doc.etag, `"`)}
	}
	d.v3Index = c.doc(mustJSON(map[string]any{"paths": index}), "application/json")

	base := h.base.v2JSON
	d.v2Build = func() (doc, error) {
		body, err := inflate(base)
		if err != nil {
			return doc{}, err
		}
		var parts [][]byte
		for _, k := range custom {
			if b := h.kindDocument(k, false); b != nil {
				parts = append(parts, b)
			}
		}
		merged, err := mergeDocument(body, []string{"definitions"}, parts)
		if err != nil {
			return doc{}, err
		}
		var c compressor
		return c.doc(merged, "application/json"), nil
	}
	return d, nil
}

// kindDocs are the encoded documents of one custom kind. Kinds do not
// change once registered (a changed definition registers new ones), so
// each is built once, however often the set changes around it.
type kindDocs struct {
	v2, v3         []byte
	v2Done, v3Done bool
}

// kindDocument returns the encoded OpenAPI v3 (or v2) document of k, nil
// if it has none or it fails to build.
func (h *Handler) kindDocument(k *registry.Kind, v3 bool) []byte {
	h.kindMu.Lock()
	defer h.kindMu.Unlock()
	d := h.kinds[k]
	if d == nil {
		d = &kindDocs{}
		h.kinds[k] = d
	}
	switch {
	case v3 && !d.v3Done:
		d.v3Done = true
		if k.OpenAPIV3 != nil {
			if spec, err := k.OpenAPIV3(); err == nil && spec != nil {
				d.v3, _ = json.Marshal(spec)
			}
		}
	case !v3 && !d.v2Done:
		d.v2Done = true
		if k.OpenAPIV2 != nil {
			if spec, err := k.OpenAPIV2(); err == nil && spec != nil {
				d.v2, _ = json.Marshal(spec)
			}
		}
	}
	if v3 {
		return d.v3
	}
	return d.v2
}

// forgetKinds drops the documents of kinds no longer served.
func (h *Handler) forgetKinds(served []*registry.Kind) {
	h.kindMu.Lock()
	defer h.kindMu.Unlock()
	for k := range h.kinds {
		if !slices.Contains(served, k) {
			delete(h.kinds, k)
		}
	}
}

// inflate returns the uncompressed body of d.
func inflate(d doc) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(d.gz))
	if err != nil {
		return nil, fmt.Errorf("read openapi document: %w", err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("read openapi document: %w", err)
	}
	return b, nil
}

// mergeDocument adds to the OpenAPI document base the paths and the
// schemas (found at defs: "definitions" in v2, "components"/"schemas" in
// v3) of each of parts. What base already has is kept: the schemas of
// the meta types every document carries are the same everywhere, and a
// custom kind never replaces a built-in path.
func mergeDocument(base []byte, defs []string, parts [][]byte) ([]byte, error) {
	top, paths, schemas, err := splitDocument(base, defs)
	if err != nil {
		return nil, err
	}
	for _, p := range parts {
		_, pp, ps, err := splitDocument(p, defs)
		if err != nil {
			continue // a malformed document of one kind leaves only that kind out
		}
		for k, v := range pp {
			if _, ok := paths[k]; !ok {
				paths[k] = v
			}
		}
		for k, v := range ps {
			if _, ok := schemas[k]; !ok {
				schemas[k] = v
			}
		}
	}
	top["paths"] = mustJSON(paths)
	if len(defs) == 1 {
		top[defs[0]] = mustJSON(schemas)
	} else {
		outer := map[string]json.RawMessage{}
		if raw, ok := top[defs[0]]; ok {
			if err := json.Unmarshal(raw, &outer); err != nil {
				return nil, fmt.Errorf("merge openapi documents: %w", err)
			}
		}
		outer[defs[1]] = mustJSON(schemas)
		top[defs[0]] = mustJSON(outer)
	}
	return mustJSON(top), nil
}

// splitDocument parses an OpenAPI document into its top-level fields, its
// paths and its schemas.
func splitDocument(b []byte, defs []string) (top, paths, schemas map[string]json.RawMessage, err error) {
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, nil, nil, fmt.Errorf("parse openapi document: %w", err)
	}
	paths, schemas = map[string]json.RawMessage{}, map[string]json.RawMessage{}
	if raw, ok := top["paths"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &paths); err != nil {
			return nil, nil, nil, fmt.Errorf("parse openapi paths: %w", err)
		}
	}
	raw := top[defs[0]]
	if len(defs) == 2 && raw != nil {
		var outer map[string]json.RawMessage
		if err := json.Unmarshal(raw, &outer); err != nil {
			return nil, nil, nil, fmt.Errorf("parse openapi components: %w", err)
		}
		raw = outer[defs[1]]
	}
	if raw != nil && string(raw) != "null" {
		if err := json.Unmarshal(raw, &schemas); err != nil {
			return nil, nil, nil, fmt.Errorf("parse openapi schemas: %w", err)
		}
	}
	return top, paths, schemas, nil
}
