package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/router"
)

// The schema of the configuration is read from Config's mapstructure tags by
// reflection, so a field added to Config (or to a struct nested in it) is
// known to the loader, the environment and the unknown-key check at once.

type fieldKind int

const (
	leafField       fieldKind = iota // a scalar or a list of scalars
	structField                      // a nested section
	ptrStructField                   // an optional nested section (nil when absent)
	structListField                  // a list of sections (backends)
)

type field struct {
	key   string // the mapstructure tag
	index int
	typ   reflect.Type
	kind  fieldKind
	sub   *schema // the nested schema of a struct, pointer or list kind
	// dynamic: an interface field holding a struct of type typ (policies).
	dynamic bool
}

// value is f's value in v, the struct that holds it: for a dynamic field,
// the struct its interface holds (the zero Value when it holds none).
func (f *field) value(v reflect.Value) reflect.Value {
	fv := v.Field(f.index)
	if f.dynamic {
		fv = fv.Elem()
	}
	return fv
}

type schema struct {
	fields []*field
	byKey  map[string]*field
}

var durationType = reflect.TypeOf(time.Duration(0))

func schemaOf(t reflect.Type) *schema {
	s := &schema{byKey: map[string]*field{}}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		key, _, _ := strings.Cut(sf.Tag.Get("mapstructure"), ",")
		if key == "" || key == "-" || !sf.IsExported() {
			continue
		}
		f := &field{key: key, index: i, typ: sf.Type, kind: leafField}
		switch {
		case sf.Type.Kind() == reflect.Interface && key == policiesKey:
			// The policies' sections, whose type the registry makes
			// (policies.go); the field holds a value of it.
			f.typ, _ = policiesType()
			f.kind, f.sub, f.dynamic = structField, schemaOf(f.typ), true
		case sf.Type.Kind() == reflect.Struct && sf.Type != durationType:
			f.kind, f.sub = structField, schemaOf(sf.Type)
		case sf.Type.Kind() == reflect.Pointer && sf.Type.Elem().Kind() == reflect.Struct:
			f.kind, f.sub = ptrStructField, schemaOf(sf.Type.Elem())
		case sf.Type.Kind() == reflect.Slice && sf.Type.Elem().Kind() == reflect.Struct:
			f.kind, f.sub = structListField, schemaOf(sf.Type.Elem())
		}
		s.fields = append(s.fields, f)
		s.byKey[key] = f
	}
	return s
}

// keys returns the schema's keys in declaration order.
func (s *schema) keys() []string {
	out := make([]string, len(s.fields))
	for i, f := range s.fields {
		out[i] = f.key
	}
	return out
}

// settable is a key the environment and flags may set: a leaf reached from
// Config through nested sections only (not through lists or optional
// sections).
type settable struct{ field *field }

// derived is what the schema gives, made again when the policy registry
// changes (the policies' sections are part of it).
type derived struct {
	gen    uint64
	schema *schema
	// settables maps every key the environment and flags may set to its
	// field; lists names the keys that hold lists of sections, which only
	// the file can set; env maps each environment variable to its key.
	settables map[string]settable
	lists     map[string]bool
	env       map[string]string
}

var derivedNow struct {
	sync.Mutex
	d *derived
}

// current returns the schema and what it gives for the registry as it is.
func current() *derived {
	gen := router.Generation()
	derivedNow.Lock()
	defer derivedNow.Unlock()
	if d := derivedNow.d; d != nil && d.gen == gen {
		return d
	}
	d := &derived{gen: gen, schema: schemaOf(reflect.TypeOf(Config{})), env: map[string]string{}}
	d.settables, d.lists = collectSettables(d.schema, "", map[string]settable{}, map[string]bool{})
	for k := range d.settables {
		d.env[EnvName(k)] = k
	}
	for k := range d.lists {
		d.env[EnvName(k)] = k
	}
	derivedNow.d = d
	return d
}

// configSchema is Config's schema.
func configSchema() *schema { return current().schema }

func collectSettables(s *schema, prefix string, out map[string]settable, lists map[string]bool) (map[string]settable, map[string]bool) {
	for _, f := range s.fields {
		switch path := joinPath(prefix, f.key); f.kind {
		case leafField:
			out[path] = settable{f}
		case structField:
			collectSettables(f.sub, path, out, lists)
		default:
			lists[path] = true
		}
	}
	return out, lists
}

// EnvName is the environment variable that overrides key, such as
// KVROUTE_TIMEOUTS_FIRST_BYTE for timeouts.first_byte.
func EnvName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// IgnoredEnv reports whether a KVROUTE_* variable is not configuration:
// the service-link variables Kubernetes injects for a Service named kvroute (KVROUTE_PORT,
// KVROUTE_PORT_8080_TCP_ADDR, KVROUTE_SERVICE_HOST, ...). Every other
// KVROUTE_* variable must name a configuration key.
func IgnoredEnv(name string) bool {
	switch name {
	case "KVROUTE_PORT", "KVROUTE_SERVICE_HOST", "KVROUTE_SERVICE_PORT":
		return true
	}
	return strings.HasPrefix(name, "KVROUTE_PORT_") || strings.HasPrefix(name, "KVROUTE_SERVICE_PORT_")
}

func joinPath(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

// suggest returns the candidates closest to s, or none when none is close
// enough to be the likely meaning.
func suggest(s string, candidates []string) []string {
	var best []string
	bestD := -1
	for _, c := range candidates {
		d := editDistance(strings.ToLower(s), strings.ToLower(c))
		if !closeEnough(s, c, d) {
			continue
		}
		switch {
		case bestD < 0 || d < bestD:
			best, bestD = append(best[:0], c), d
		case d == bestD:
			best = append(best, c)
		}
	}
	return best
}

func closeEnough(s, c string, d int) bool {
	ls, lc := strings.ToLower(s), strings.ToLower(c)
	if len(ls) >= 3 && len(lc) >= 3 && (strings.HasPrefix(ls, lc) || strings.HasPrefix(lc, ls)) {
		return true
	}
	return d <= max(max(len(s), len(c))/3, 1)
}

// closest returns the candidate at the smallest edit distance from s (the
// first in sorted order on a tie).
func closest(s string, candidates []string) string {
	sorted := append([]string(nil), candidates...)
	sort.Strings(sorted)
	best, bestD := "", -1
	for _, c := range sorted {
		if d := editDistance(s, c); bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the optimal-string-alignment distance: insertions,
// deletions, substitutions and transpositions of adjacent bytes.
func editDistance(a, b string) int {
	if len(a) > 256 || len(b) > 256 { // keys are short; bound the work on junk
		return max(len(a), len(b))
	}
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// quoteList renders names as "a", "b" or "c" for messages.
func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	switch len(q) {
	case 1:
		return q[0]
	case 2:
		return q[0] + " or " + q[1]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
