package deploy

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// ConfigKeyExcluded names the flags a config file may not set: the one
// that names the file, and help.
func ConfigKeyExcluded(name string) bool {
	return name == "config" || name == "help"
}

// LoadConfig sets the flags of fs from the config file at path, a YAML
// mapping from flag names (without the dashes) to values: a scalar for a
// single-valued flag, a scalar or a list for a list flag, a mapping for a
// key=value flag. A flag already set on the command line keeps its value:
// flags override the file. A key that names no flag of fs, or a value the
// flag does not take, is an error that names the key and its line; keys
// of the wrong shape are found before any flag is set.
//
// With opts.Optional a missing file is no error and sets nothing; with
// opts.IgnoreUnknown keys that name no flag of fs are skipped (a command
// that takes a subset of another's flags reading the other's file).
func LoadConfig(fset *pflag.FlagSet, path string, opts ConfigOptions) error {
	b, err := os.ReadFile(path)
	if err != nil {
		if opts.Optional && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read config file: %w", err)
	}
	entries, err := parseConfig(fset, path, b, opts.IgnoreUnknown)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := e.apply(fset); err != nil {
			return fmt.Errorf("config file %s: key %q: %w", path, e.key, err)
		}
	}
	return nil
}

// ConfigOptions are LoadConfig's options.
type ConfigOptions struct {
	Optional      bool
	IgnoreUnknown bool
}

// ConfigValue reads the scalar value of one key of a config file; ok is
// false when the file or the key is absent.
func ConfigValue(path, key string) (v string, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read config file: %w", err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		return "", false, fmt.Errorf("config file %s: %w", path, err)
	}
	x, ok := m[key]
	if !ok {
		return "", false, nil
	}
	s, isStr := x.(string)
	if !isStr {
		return "", false, fmt.Errorf("config file %s: key %q: want a string", path, key)
	}
	return s, true, nil
}

// configEntry is one key of a config file with its value as flag text.
type configEntry struct {
	key   string
	flag  *pflag.Flag
	items []string // the values given to Set, in order
	list  bool     // the value was a YAML list: Replace, not Set
	empty bool     // an empty mapping
}

// parseConfig decodes a config file and checks that each key names a flag
// of fs that takes the value's shape. Values are checked by the flags
// themselves when applied.
func parseConfig(fset *pflag.FlagSet, path string, b []byte, ignoreUnknown bool) ([]configEntry, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, nil // empty file
	}
	m := doc.Content[0]
	if m.Kind == yaml.ScalarNode && m.Tag == "!!null" {
		return nil, nil
	}
	if m.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("config file %s: want a mapping of flag names to values, line %d", path, m.Line)
	}
	var out []configEntry
	seen := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		key := k.Value
		if k.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("config file %s: line %d: a key must be a flag name", path, k.Line)
		}
		f := fset.Lookup(key)
		if f == nil && ignoreUnknown {
			continue
		}
		if f == nil || ConfigKeyExcluded(key) || f.Hidden {
			return nil, fmt.Errorf("config file %s: line %d: unknown key %q: no flag --%s", path, k.Line, key, key)
		}
		if seen[f.Name] {
			return nil, fmt.Errorf("config file %s: line %d: key %q given twice", path, k.Line, key)
		}
		seen[f.Name] = true
		e := configEntry{key: key, flag: f}
		_, isList := f.Value.(pflag.SliceValue)
		isMap := f.Value.Type() == "stringToString"
		switch {
		case v.Kind == yaml.AliasNode:
			return nil, fmt.Errorf("config file %s: line %d: key %q: aliases are not supported", path, v.Line, key)
		case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
			return nil, fmt.Errorf("config file %s: line %d: key %q has no value", path, v.Line, key)
		case v.Kind == yaml.ScalarNode:
			e.items = []string{v.Value}
		case v.Kind == yaml.SequenceNode && isList:
			e.list = true
			for _, it := range v.Content {
				if it.Kind != yaml.ScalarNode {
					return nil, fmt.Errorf("config file %s: line %d: key %q: want a list of %s values", path, it.Line, key, f.Value.Type())
				}
				e.items = append(e.items, it.Value)
			}
		case v.Kind == yaml.MappingNode && isMap:
			for j := 0; j+1 < len(v.Content); j += 2 {
				mk, mv := v.Content[j], v.Content[j+1]
				if mk.Kind != yaml.ScalarNode || mv.Kind != yaml.ScalarNode {
					return nil, fmt.Errorf("config file %s: line %d: key %q: want a mapping of strings to strings", path, mk.Line, key)
				}
				e.items = append(e.items, csvField(mk.Value+"="+mv.Value))
			}
			// An empty mapping sets the flag to its default, which
			// for the commands' key=value flags is empty.
			e.empty = len(e.items) == 0
		default:
			want := "a single " + f.Value.Type() + " value"
			switch {
			case isList:
				want = "a " + f.Value.Type() + " value or a list of them"
			case isMap:
				want = "a mapping of strings to strings"
			}
			return nil, fmt.Errorf("config file %s: line %d: key %q: want %s, not a %s", path, v.Line, key, want, kindName(v.Kind))
		}
		out = append(out, e)
	}
	return out, nil
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.SequenceNode:
		return "list"
	case yaml.MappingNode:
		return "mapping"
	}
	return "scalar"
}

// csvField quotes s as one field of a comma-separated flag value.
func csvField(s string) string {
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	_ = w.Write([]string{s})
	w.Flush()
	return strings.TrimSuffix(b.String(), "\n")
}

// apply sets the entry's flag in fs, unless the command line set it.
func (e configEntry) apply(fset *pflag.FlagSet) error {
	if e.flag.Changed {
		return nil
	}
	if e.empty {
		e.flag.Changed = true
		return nil
	}
	if e.list {
		sv := e.flag.Value.(pflag.SliceValue)
		if err := sv.Replace(e.items); err != nil {
			return fmt.Errorf("want a list of %s values: %w", e.flag.Value.Type(), err)
		}
		e.flag.Changed = true
		return nil
	}
	for _, it := range e.items {
		if err := fset.Set(e.flag.Name, it); err != nil {
			return fmt.Errorf("want a %s value: %w", e.flag.Value.Type(), err)
		}
	}
	return nil
}

// RenderConfig writes the flags of fs that were set (on the command line
// or from a config file) as a config file LoadConfig reads back to the
// same values, keys in order, under header as a comment. Flags for which
// skip is true are left out.
func RenderConfig(fset *pflag.FlagSet, header string, skip func(name string) bool) ([]byte, error) {
	var names []string
	fset.VisitAll(func(f *pflag.Flag) {
		if f.Changed && !ConfigKeyExcluded(f.Name) && (skip == nil || !skip(f.Name)) {
			names = append(names, f.Name)
		}
	})
	sort.Strings(names)
	m := &yaml.Node{Kind: yaml.MappingNode}
	for _, n := range names {
		f := fset.Lookup(n)
		v, err := valueNode(fset, f)
		if err != nil {
			return nil, err
		}
		m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: n}, v)
	}
	doc := &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{m}, HeadComment: header}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("render config: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("render config: %w", err)
	}
	return b.Bytes(), nil
}

// valueNode is the YAML form of a flag's value.
func valueNode(fset *pflag.FlagSet, f *pflag.Flag) (*yaml.Node, error) {
	str := func(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		seq := &yaml.Node{Kind: yaml.SequenceNode}
		for _, it := range sv.GetSlice() {
			seq.Content = append(seq.Content, str(it))
		}
		return seq, nil
	}
	t := f.Value.Type()
	switch {
	case t == "stringToString":
		kv, err := fset.GetStringToString(f.Name)
		if err != nil {
			return nil, fmt.Errorf("render config: --%s: %w", f.Name, err)
		}
		keys := make([]string, 0, len(kv))
		for k := range kv {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		mn := &yaml.Node{Kind: yaml.MappingNode}
		for _, k := range keys {
			mn.Content = append(mn.Content, str(k), str(kv[k]))
		}
		return mn, nil
	case t == "bool":
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: f.Value.String()}, nil
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: f.Value.String()}, nil
	case strings.HasPrefix(t, "float"):
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: f.Value.String()}, nil
	}
	return str(f.Value.String()), nil
}
