package config

import (
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// exampleLeftOut are the settable keys config.yaml leaves out on purpose,
// each with the reason. None today: the example writes every key.
var exampleLeftOut = map[string]string{}

// config.yaml is the commented example: every key it sets exists and holds
// its default, and it writes every key the environment may set.
func TestExampleHoldsTheDefaults(t *testing.T) {
	data, err := os.ReadFile("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	written := map[string]bool{}
	exampleKeys(doc.Content[0], "", written)
	c, err := LoadBytes("config.yaml", data, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dflt := Default()
	for _, k := range sortedKeys(written) {
		if _, ok := current().settables[k]; !ok || deprecated(k) {
			t.Errorf("config.yaml sets %s, which is no settable key (or a deprecated one)", k)
			continue
		}
		if got, want := valueAt(c, k), valueAt(dflt, k); !sameValue(got, want) {
			t.Errorf("config.yaml sets %s to %v; the default is %v", k, got, want)
		}
	}
	for _, k := range sortedKeys(current().settables) {
		// A policy's section is optional: adding a policy is its own file
		// and a registration line; the generated reference lists its keys.
		if !written[k] && exampleLeftOut[k] == "" && !deprecated(k) && !strings.HasPrefix(k, policiesKey+".") {
			t.Errorf("config.yaml does not write %s: add it with its default and a comment (or to exampleLeftOut, with the reason)", k)
		}
	}
	for k := range exampleLeftOut {
		if written[k] {
			t.Errorf("exampleLeftOut names %s, which config.yaml writes", k)
		}
	}
}

// config.yaml shows every key of a backend and of its kv_events, set or
// commented out (# weight: 1).
func TestExampleShowsEveryBackendKey(t *testing.T) {
	data, err := os.ReadFile("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	backend := configSchema().byKey["backends"].sub
	keys := backend.keys()
	keys = append(keys, backend.byKey["kv_events"].sub.keys()...)
	for _, k := range keys {
		if !regexp.MustCompile(`(?m)^\s*(- )?(# )?\s*` + k + `:`).Match(data) {
			t.Errorf("config.yaml shows no backend key %s (set it, or write it commented out with its default)", k)
		}
	}
}

// exampleKeys records the key of every scalar or list node under n, a
// mapping at prefix; the backends list is no settable key.
func exampleKeys(n *yaml.Node, prefix string, out map[string]bool) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, v := joinPath(prefix, n.Content[i].Value), n.Content[i+1]
		switch {
		case key == "backends":
		case v.Kind == yaml.MappingNode:
			exampleKeys(v, key, out)
		default:
			out[key] = true
		}
	}
}

// valueAt is the value of key, a settable, in c.
func valueAt(c *Config, key string) any {
	v, s := reflect.ValueOf(c).Elem(), configSchema()
	for _, part := range strings.Split(key, ".") {
		f := s.byKey[part]
		v, s = f.value(v), f.sub
	}
	return v.Interface()
}

// sameValue is reflect.DeepEqual, but a nil list equals an empty one.
func sameValue(a, b any) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if va.Kind() == reflect.Slice && vb.Kind() == reflect.Slice && va.Len() == 0 && vb.Len() == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
