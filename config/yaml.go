package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The walk reads the configuration file as a YAML node tree, before viper
// decodes it, for what decoding a map cannot tell: each key's line and text
// as written (for messages), keys Config does not have (with the closest
// known one), keys set twice, and values of the wrong shape (a scalar where
// a list or section goes) that a weakly typed decoder would accept.

// walk records what it learns of data in l and reports its errors; it
// returns false when data cannot be read as a configuration at all.
func (l *loader) walk(data []byte) bool {
	l.budget = 10*len(data) + 10000
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc, next yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return true
		}
		l.unread = true
		l.yamlError(err)
		return false
	}
	switch err := dec.Decode(&next); {
	case err == nil:
		l.unread = true
		l.add(&Error{Source: Source{File: l.name, Line: next.Line}, Msg: "a second YAML document (after ---); the configuration is one document"})
		return false
	case !errors.Is(err, io.EOF):
		l.unread = true
		l.yamlError(err)
		return false
	}
	root := &doc
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		root = doc.Content[0]
	}
	if root = l.deref(root); isNull(root) || root.Kind == yaml.DocumentNode {
		return true
	}
	if root.Kind != yaml.MappingNode {
		l.unread = true
		l.add(&Error{Source: Source{File: l.name, Line: root.Line}, Msg: "the file must hold a mapping of keys (listen: ..., backends: ...), not " + describe(root)})
		return false
	}
	l.mapping(root, configSchema(), "")
	if l.budget <= 0 {
		l.unread = true
	}
	return l.budget > 0
}

var yamlLine = regexp.MustCompile(`yaml: line (\d+): (.*)$`)

func (l *loader) yamlError(err error) {
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		l.add(&Error{Source: Source{File: l.name, Line: n}, Msg: "YAML: " + m[2]})
		return
	}
	l.add(&Error{Source: Source{File: l.name}, Msg: err.Error()})
}

// spend counts one visited node against the budget; false once it is spent.
func (l *loader) spend() bool {
	if l.budget--; l.budget == 0 {
		l.add(&Error{Source: Source{File: l.name}, Msg: "YAML aliases expand to too many nodes"})
	}
	return l.budget > 0
}

func (l *loader) deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil && l.spend() {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func isMerge(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Value == "<<" && (n.Tag == "" || n.Tag == "!" || n.ShortTag() == "!!merge")
}

// describe names a node's kind for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping of keys"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if isNull(n) {
		return "no value"
	}
	return strconv.Quote(n.Value)
}

type entry struct{ key, val *yaml.Node }

// entries lists a mapping's keys and values, those merged in with << after
// the mapping's own (which win), each key once.
func (l *loader) entries(n *yaml.Node, path string) []entry {
	var out []entry
	seen := map[string]*yaml.Node{}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content) && l.spend(); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case isMerge(k):
			merges = append(merges, v)
			continue
		case k.Kind != yaml.ScalarNode:
			l.add(&Error{Source: Source{File: l.name, Line: k.Line}, Key: path, Msg: "a key must be a plain name, not " + describe(k)})
			continue
		}
		if first, dup := seen[k.Value]; dup {
			l.fail(Source{File: l.name, Line: k.Line}, joinPath(path, k.Value), "is set twice (first on line %d); keep one", first.Line)
			continue
		}
		seen[k.Value] = k
		out = append(out, entry{k, v})
	}
	for _, m := range merges {
		m = l.deref(m)
		from := []*yaml.Node{m}
		if m.Kind == yaml.SequenceNode {
			from = m.Content
		}
		for _, fm := range from {
			if fm = l.deref(fm); fm.Kind != yaml.MappingNode {
				l.add(&Error{Source: Source{File: l.name, Line: fm.Line}, Key: path, Msg: "<< merges a mapping of keys, not " + describe(fm)})
				continue
			}
			for _, e := range l.entries(fm, path) {
				if _, ok := seen[e.key.Value]; !ok {
					seen[e.key.Value] = e.key
					out = append(out, e)
				}
			}
		}
	}
	return out
}

// mapping walks the YAML mapping n, a section of schema s at path.
func (l *loader) mapping(n *yaml.Node, s *schema, path string) {
	if n = l.deref(n); isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		l.reject(Source{File: l.name, Line: n.Line}, path, "want a mapping of keys (%s), not %s", strings.Join(s.keys(), ", "), describe(n))
		return
	}
	for _, e := range l.entries(n, path) {
		if f := s.byKey[e.key.Value]; f != nil {
			l.value(e.key, e.val, f, joinPath(path, e.key.Value))
		} else {
			l.unknownKey(e.key, s, path)
		}
	}
}

// unknownKey reports a key the schema does not have, with the closest known
// one. What viper makes of it (a.b: is read as a: {b: }) is not reported.
func (l *loader) unknownKey(k *yaml.Node, s *schema, path string) {
	full := joinPath(path, k.Value)
	l.unknown, l.failed[full] = true, true
	var hint string
	if near := suggest(k.Value, s.keys()); len(near) > 0 {
		for i := range near {
			near[i] = joinPath(path, near[i])
		}
		hint = " (did you mean " + quoteList(near) + "?)"
	} else if elsewhere := keysNamed(k.Value); len(elsewhere) > 0 && path == "" {
		hint = " (did you mean " + quoteList(elsewhere) + "?)"
	} else {
		hint = " (known keys here: " + strings.Join(s.keys(), ", ") + ")"
	}
	l.add(&Error{Source: Source{File: l.name, Line: k.Line}, Key: full, Msg: fmt.Sprintf("unknown key %q%s", full, hint), named: true})
}

// keysNamed lists the settable keys whose last part is name (ttl →
// cache_aware.ttl, responses.ttl, session.ttl).
func keysNamed(name string) []string {
	var out []string
	for k := range current().settables {
		if strings.HasSuffix(k, "."+name) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// value walks the YAML value n of field f, whose key node is k.
func (l *loader) value(k, n *yaml.Node, f *field, path string) {
	src := Source{File: l.name, Line: k.Line}
	l.sources[path] = src
	n = l.deref(n)
	switch {
	case f.kind == structField || f.kind == ptrStructField:
		l.mapping(n, f.sub, path)
	case f.kind == structListField && isNull(n):
	case f.kind == structListField && n.Kind != yaml.SequenceNode:
		l.reject(src, path, "want a list of entries (- name: ...), not %s", describe(n))
	case f.kind == structListField:
		for i, item := range n.Content {
			ip := fmt.Sprintf("%s[%d]", path, i)
			l.sources[ip] = Source{File: l.name, Line: item.Line}
			l.mapping(item, f.sub, ip)
		}
	case isNull(n) && f.typ.Kind() == reflect.String: // viper would read the default
		l.reject(src, path, `has no value; write "" for none, or remove the key to keep the default%s`, defaultNote(path))
	case isNull(n) && f.typ.Kind() == reflect.Slice:
		l.reject(src, path, "has no value; write [] for none, or remove the key to keep the default%s", defaultNote(path))
	case isNull(n):
		l.reject(src, path, "has no value; remove the key to keep the default%s, or give one", defaultNote(path))
	case f.typ.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, item := range n.Content {
			ip, isrc := fmt.Sprintf("%s[%d]", path, i), Source{File: l.name, Line: item.Line}
			l.sources[ip] = isrc
			if item = l.deref(item); item.Kind != yaml.ScalarNode || isNull(item) {
				l.reject(isrc, ip, "want %s, not %s", typeName(f.typ.Elem()), describe(item))
				return
			}
			l.raw[ip] = item.Value
		}
	case f.typ.Kind() == reflect.Slice && n.Kind == yaml.ScalarNode && secret[path]:
		l.reject(src, path, "is not a list; write [...]")
	case f.typ.Kind() == reflect.Slice && n.Kind == yaml.ScalarNode:
		l.reject(src, path, "%s is not a list; write [%s]", describe(n), n.Value)
	case n.Kind != yaml.ScalarNode:
		l.reject(src, path, "want %s, not %s", typeName(f.typ), describe(n))
	default:
		l.raw[path] = n.Value
	}
}
