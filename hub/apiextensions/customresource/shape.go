package customresource

import (
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
)

// Pruning, null removal, defaulting, the coercion and validation of
// embedded resources and the list-type checks each walk a custom object
// against its version's structural schema, and apiextensions' walks
// allocate as they go (a copy of each property's schema, a field path
// per value) whether or not the object holds anything they act on. What a
// schema can make them do is known once the CRD is read: a shape records
// it and tells, without allocating, when a walk would change and report
// nothing, so that coerce, defaults and validate leave that walk out. The
// walks themselves still do every change and report every error.

// shape is what the structural schema of one version can make the walks
// do. A nil *shape knows nothing: every walk runs.
type shape struct {
	// root is the schema as pruning reads it at the root of an object,
	// where apiVersion, kind and metadata are never pruned.
	root *pruneNode
	// defaults: some property, additional property or item has a
	// default.
	defaults bool
	// embedded: some value is an embedded resource
	// (x-kubernetes-embedded-resource).
	embedded bool
	// listSetsOrMaps: some list is x-kubernetes-list-type set or map.
	listSetsOrMaps bool
}

// pruneNode is one node of a structural schema, as pruning reads it. A nil
// *pruneNode is no schema: pruning drops every field of an object there.
type pruneNode struct {
	properties map[string]*pruneNode
	// additional is set when the schema has additionalProperties;
	// additionalSchema is its schema, nil for none.
	additional       bool
	additionalSchema *pruneNode
	items            *pruneNode
	preserveUnknown  bool
	embedded         bool
}

// newShape reads s, the structural schema of a version (nil for a
// version without one).
func newShape(s *structuralschema.Structural) *shape {
	sh := &shape{}
	root := sh.node(s)
	if root == nil {
		root = &pruneNode{}
	} else {
		c := *root
		root = &c
	}
	// As PruneWithOptions treats the root of a resource.
	root.embedded = true
	sh.root = root
	return sh
}

// node converts s and records what it holds in sh.
func (sh *shape) node(s *structuralschema.Structural) *pruneNode {
	if s == nil {
		return nil
	}
	n := &pruneNode{
		preserveUnknown: s.XPreserveUnknownFields,
		embedded:        s.XEmbeddedResource,
	}
	if s.Default.Object != nil {
		sh.defaults = true
	}
	if s.XEmbeddedResource {
		sh.embedded = true
	}
	if s.XListType != nil && (*s.XListType == "set" || *s.XListType == "map") {
		sh.listSetsOrMaps = true
	}
	if len(s.Properties) > 0 {
		n.properties = make(map[string]*pruneNode, len(s.Properties))
		for name := range s.Properties {
			p := s.Properties[name]
			n.properties[name] = sh.node(&p)
		}
	}
	if s.AdditionalProperties != nil {
		n.additional = true
		n.additionalSchema = sh.node(s.AdditionalProperties.Structural)
	}
	n.items = sh.node(s.Items)
	return n
}

// wouldPrune reports whether pruning obj, a whole custom object, removes
// anything.
func (sh *shape) wouldPrune(obj map[string]any) bool {
	if sh == nil {
		return true
	}
	return wouldPrune(obj, sh.root)
}

// isMetaField names the fields pruning keeps at the root of a resource.
func isMetaField(k string) bool {
	return k == "apiVersion" || k == "kind" || k == "metadata"
}

// wouldPrune follows apiextensions' pruning of x by n and reports whether
// it would remove a field.
func wouldPrune(x any, n *pruneNode) bool {
	if n != nil && n.preserveUnknown {
		return wouldPruneKnown(x, n)
	}
	switch x := x.(type) {
	case map[string]any:
		if n == nil {
			return len(x) > 0
		}
		for k, v := range x {
			if n.embedded && isMetaField(k) {
				continue
			}
			if p, ok := n.properties[k]; ok {
				if wouldPrune(v, p) {
					return true
				}
			} else if n.additional {
				if wouldPrune(v, n.additionalSchema) {
					return true
				}
			} else {
				return true
			}
		}
	case []any:
		var items *pruneNode
		if n != nil {
			items = n.items
		}
		for _, v := range x {
			if wouldPrune(v, items) {
				return true
			}
		}
	}
	return false
}

// wouldPruneKnown is wouldPrune under x-kubernetes-preserve-unknown-fields:
// unknown fields stay, known ones are pruned by their schema.
func wouldPruneKnown(x any, n *pruneNode) bool {
	if n == nil {
		return false
	}
	switch x := x.(type) {
	case map[string]any:
		for k, v := range x {
			if n.embedded && isMetaField(k) {
				continue
			}
			if p, ok := n.properties[k]; ok {
				if wouldPrune(v, p) {
					return true
				}
			} else if n.additional {
				if wouldPrune(v, n.additionalSchema) {
					return true
				}
			}
		}
	case []any:
		for _, v := range x {
			if wouldPruneKnown(v, n.items) {
				return true
			}
		}
	}
	return false
}

// hasNull reports whether a null is anywhere in x: removing the nulls a
// schema does not allow has nothing to do otherwise.
func hasNull(x any) bool {
	switch x := x.(type) {
	case nil:
		return true
	case map[string]any:
		for _, v := range x {
			if hasNull(v) {
				return true
			}
		}
	case []any:
		for _, v := range x {
			if hasNull(v) {
				return true
			}
		}
	}
	return false
}

// mayDefault reports whether defaulting can set anything.
func (sh *shape) mayDefault() bool { return sh == nil || sh.defaults }

// hasEmbedded reports whether the schema has embedded resources, whose
// metadata is coerced and validated.
func (sh *shape) hasEmbedded() bool { return sh == nil || sh.embedded }

// hasListSetsOrMaps reports whether the list-type checks can find
// anything.
func (sh *shape) hasListSetsOrMaps() bool { return sh == nil || sh.listSetsOrMaps }
