package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// EnvPrefix prefixes environment overrides: KVROUTE_LISTEN,
// KVROUTE_TIMEOUTS_FIRST_BYTE, and so on (dots become underscores). Every
// KVROUTE_* variable is configuration (except those IgnoredEnv names): one
// that names no key is an error, and one set to the empty string counts as
// the empty value (KVROUTE_ADMIN_LISTEN= disables the admin listener).
const EnvPrefix = "KVROUTE"

// FlagKeys maps command-line flag names to the configuration keys they override.
var FlagKeys = map[string]string{
	"listen":       "listen",
	"admin-listen": "admin_listen",
	"policy":       "policy",
	"log-level":    "log.level",
	"log-format":   "log.format",
}

// Default returns the configuration with every default applied and no
// backends; callers building a configuration in code start from it.
func Default() *Config {
	if defaultsErr != nil {
		panic("config: defaults do not decode: " + defaultsErr.Error()) // a programming error
	}
	return defaultConfig()
}

// defaults is Defaults() decoded, built once and never changed; each load
// starts from a copy (defaultConfig).
var defaults, defaultsErr = func() (Config, error) {
	l := newLoader("")
	var c Config
	l.defaults(&c)
	return c, errors.Join(l.errs...)
}()

// defaultConfig returns a copy of defaults that shares no memory with it.
func defaultConfig() *Config {
	c := defaults
	root := reflect.ValueOf(&c).Elem()
	for _, st := range settables {
		if f := root.FieldByIndex(st.index); f.Kind() == reflect.Slice {
			f.Set(reflect.AppendSlice(reflect.MakeSlice(f.Type(), 0, f.Len()), f))
		}
	}
	return &c
}

// Load reads path (if not empty), then KVROUTE_* environment variables, then
// the flags in fs that were set (in rising order of precedence), decodes
// strictly and validates. Every error names the key, the value and where it
// came from; all of them are reported, joined.
func Load(path string, fs *pflag.FlagSet) (*Config, error) {
	var data []byte
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
	}
	return LoadBytes(path, data, os.Environ(), fs)
}

// LoadBytes is Load with the file's contents (named name in messages) and
// the environment (KEY=value entries, as os.Environ returns) given. It reads
// nothing else and keeps no state between calls.
func LoadBytes(name string, data []byte, env []string, fs *pflag.FlagSet) (*Config, error) {
	if defaultsErr != nil {
		return nil, defaultsErr
	}
	l := newLoader(name)
	c := *defaultConfig()
	l.file(&c, data)
	l.env(&c, env)
	l.flags(&c, fs)
	for i := range c.Backends {
		if c.Backends[i].Engine == "" {
			c.Backends[i].Engine = "vllm"
		}
		// In code a zero weight means the default; in the file it would
		// silently mean 1, so it is an error.
		if k := fmt.Sprintf("backends[%d].weight", i); c.Backends[i].Weight == 0 && !l.failed[k] {
			l.fail(l.sourceOf(k), k, "must be positive (default 1), got 0")
		}
	}
	l.validate(&c)
	if len(l.errs) > 0 {
		return nil, errors.Join(l.errs...)
	}
	return &c, nil
}

// Source is where a configuration value came from.
type Source struct {
	File    string // the configuration file, for a value read from it
	Line    int    // the value's line in File (1-based), 0 when unknown
	Env     string // the environment variable that set it
	Flag    string // the flag that set it, without dashes
	Default bool   // the value is the default
}

func (s Source) String() string {
	switch {
	case s.Env != "":
		return "environment variable " + s.Env
	case s.Flag != "":
		return "flag --" + s.Flag
	case s.Default:
		return "default value"
	case s.File != "" && s.Line > 0:
		return s.File + ":" + strconv.Itoa(s.Line)
	}
	return s.File
}

// Error is one configuration error: where the value came from, the key it
// concerns and what is wrong with it.
type Error struct {
	Source Source
	Key    string // such as timeouts.first_byte or backends[1].url; may be empty
	Msg    string
	// named: Msg already names the key (unknown keys), so it is not repeated.
	named bool
}

func (e *Error) Error() string {
	var b strings.Builder
	if s := e.Source.String(); s != "" {
		b.WriteString(s)
		b.WriteString(": ")
	}
	if e.Key != "" && !e.named {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

type loader struct {
	name    string
	sources map[string]Source // key path (backends[1].url) → where its value came from
	failed  map[string]bool   // key paths whose value was rejected while loading
	errs    []error
	seen    map[string]bool // error texts already reported
	budget  int             // YAML nodes left to visit (bounds alias expansion)
	// unread: the file could not be read as a configuration, so Validate's
	// errors would be about values it did not set.
	unread bool
}

func newLoader(name string) *loader {
	return &loader{name: name, sources: map[string]Source{}, failed: map[string]bool{}, seen: map[string]bool{}}
}

// fail reports an error about key that leaves its value as it was.
func (l *loader) fail(src Source, key, format string, args ...any) {
	l.add(&Error{Source: src, Key: key, Msg: fmt.Sprintf(format, args...)})
}

// reject reports a value of key that could not be decoded; Validate's
// errors about key (which only repeat it) are then left out.
func (l *loader) reject(src Source, key, format string, args ...any) {
	l.failed[key] = true
	l.fail(src, key, format, args...)
}

func (l *loader) add(e *Error) {
	if s := e.Error(); !l.seen[s] {
		l.seen[s] = true
		l.errs = append(l.errs, e)
	}
}

// sourceOf is where key's value came from; for a key never set, where its
// closest enclosing key was (backends[1] for backends[1].name), else the file.
func (l *loader) sourceOf(key string) Source {
	for k := key; k != ""; {
		if s, ok := l.sources[k]; ok {
			return s
		}
		if defaultKeys[k] {
			return Source{Default: true}
		}
		if strings.HasSuffix(k, "]") {
			k = k[:strings.LastIndexByte(k, '[')]
		} else if i := strings.LastIndexByte(k, '.'); i >= 0 {
			k = k[:i]
		} else {
			break
		}
	}
	return Source{File: l.name}
}

// failedUnder reports whether key or a key enclosing it was rejected while
// loading (its validation error would only repeat that one).
func (l *loader) failedUnder(key string) bool {
	for k := range l.failed {
		if key == k || strings.HasPrefix(key, k+".") || strings.HasPrefix(key, k+"[") {
			return true
		}
	}
	return false
}

// validate runs Validate and gives each of its errors the source of the
// value it names.
func (l *loader) validate(c *Config) {
	err := c.Validate()
	if err == nil || l.unread {
		return
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var fe *fieldError
		if !errors.As(e, &fe) {
			l.errs = append(l.errs, e)
			continue
		}
		if l.failedUnder(fe.field) {
			continue
		}
		l.add(&Error{Source: l.sourceOf(fe.field), Key: fe.field, Msg: fe.msg})
	}
}

// defaultKeys are the keys Defaults gives a value.
var defaultKeys = func() map[string]bool {
	m := map[string]bool{}
	for k := range Defaults() {
		m[k] = true
	}
	return m
}()

func (l *loader) defaults(c *Config) {
	d := Defaults()
	keys := make([]string, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	root := reflect.ValueOf(c).Elem()
	src := Source{Default: true}
	for _, k := range keys {
		st, ok := settables[k]
		if !ok {
			l.fail(src, k, "a default for a key Config does not have")
			continue
		}
		dst := root.FieldByIndex(st.index)
		switch v := d[k].(type) {
		case []string:
			dst.Set(reflect.ValueOf(append([]string{}, v...)))
		case string:
			l.setString(dst, k, v, src)
		default:
			l.setString(dst, k, fmt.Sprint(v), src)
		}
	}
}

// defaultNote renders key's default for a message: " (60s)", or "".
func defaultNote(key string) string {
	if v, ok := Defaults()[key]; ok {
		if s := fmt.Sprint(v); s != "" && s != "[]" {
			return " (" + s + ")"
		}
	}
	return ""
}

func (l *loader) env(c *Config, env []string) {
	type kv struct{ name, value string }
	var vars []kv
	for _, e := range env {
		name, value, _ := strings.Cut(e, "=")
		if strings.HasPrefix(name, EnvPrefix+"_") && !IgnoredEnv(name) {
			vars = append(vars, kv{name, value})
		}
	}
	sort.SliceStable(vars, func(i, j int) bool { return vars[i].name < vars[j].name })
	root := reflect.ValueOf(c).Elem()
	for _, v := range vars {
		src := Source{Env: v.name}
		key, ok := envKeys[v.name]
		if !ok {
			names := make([]string, 0, len(envKeys))
			for n, k := range envKeys {
				if !listKeys[k] {
					names = append(names, n)
				}
			}
			hint := "the closest known variable is " + closest(v.name, names)
			if s := suggest(v.name, names); len(s) > 0 {
				sort.Strings(s)
				hint = "did you mean " + strings.Join(s, " or ") + "?"
			}
			l.add(&Error{Source: src, Msg: fmt.Sprintf("no configuration key is named %s (%s)", v.name, hint)})
			continue
		}
		if listKeys[key] {
			l.fail(src, key, "a list of sections is set in the configuration file only")
			continue
		}
		l.sources[key] = src
		l.setString(root.FieldByIndex(settables[key].index), key, v.value, src)
	}
}

func (l *loader) flags(c *Config, fs *pflag.FlagSet) {
	if fs == nil {
		return
	}
	names := make([]string, 0, len(FlagKeys))
	for n := range FlagKeys {
		names = append(names, n)
	}
	sort.Strings(names)
	root := reflect.ValueOf(c).Elem()
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil || !f.Changed {
			continue
		}
		key, src := FlagKeys[name], Source{Flag: name}
		st, ok := settables[key]
		if !ok {
			l.fail(src, key, "the flag names a key Config does not have")
			continue
		}
		s := f.Value.String()
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			s = strings.Join(sv.GetSlice(), ",")
		}
		l.sources[key] = src
		l.setString(root.FieldByIndex(st.index), key, s, src)
	}
}

// setString sets a leaf from text (a default, an environment variable or a
// flag). A list is comma-separated; empty text is an empty string or list,
// and an error for any other kind of value.
func (l *loader) setString(dst reflect.Value, key, s string, src Source) {
	if dst.Kind() == reflect.Slice {
		list := reflect.MakeSlice(dst.Type(), 0, 4)
		if s != "" {
			for i, part := range strings.Split(s, ",") {
				part = strings.TrimSpace(part)
				if part == "" {
					l.reject(src, fmt.Sprintf("%s[%d]", key, i), "is empty; separate the items with single commas")
					return
				}
				e := reflect.New(dst.Type().Elem()).Elem()
				if err := setScalar(e, part, "", nil); err != nil {
					l.reject(src, fmt.Sprintf("%s[%d]", key, i), "%v", err)
					return
				}
				list = reflect.Append(list, e)
			}
		}
		dst.Set(list)
		return
	}
	if s == "" && dst.Kind() != reflect.String {
		how := "give a value"
		switch {
		case src.Env != "":
			how = "unset " + src.Env + " to keep the default" + defaultNote(key) + ", or give a value"
		case src.Flag != "":
			how = "leave --" + src.Flag + " out to keep the default" + defaultNote(key) + ", or give a value"
		}
		l.reject(src, key, "is empty; %s", how)
		return
	}
	if err := setScalar(dst, s, "", nil); err != nil {
		l.reject(src, key, "%v", err)
	}
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// file decodes the YAML configuration over the defaults in c.
func (l *loader) file(c *Config, data []byte) {
	l.budget = 10*len(data) + 10000
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if !errors.Is(err, io.EOF) {
			l.unread = true
			l.yamlError(err)
		}
		return
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		l.unread = true
		l.add(&Error{Source: Source{File: l.name, Line: next.Line}, Msg: "a second YAML document (after ---); the configuration is one document"})
		return
	case !errors.Is(err, io.EOF):
		l.unread = true
		l.yamlError(err)
		return
	}
	root := &doc
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return
		}
		root = doc.Content[0]
	}
	if root = l.deref(root); isNull(root) {
		return
	}
	if root.Kind != yaml.MappingNode {
		l.unread = true
		l.add(&Error{Source: Source{File: l.name, Line: root.Line}, Msg: "the file must hold a mapping of keys (listen: ..., backends: ...), not " + describe(root)})
		return
	}
	l.mapping(root, configSchema, reflect.ValueOf(c).Elem(), "")
}

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

// mapping decodes the YAML mapping n into dst, a struct of schema s at path.
func (l *loader) mapping(n *yaml.Node, s *schema, dst reflect.Value, path string) {
	if n = l.deref(n); isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		l.reject(Source{File: l.name, Line: n.Line}, path, "want a mapping of keys (%s), not %s", strings.Join(s.keys(), ", "), describe(n))
		return
	}
	for _, e := range l.entries(n, path) {
		f := s.byKey[e.key.Value]
		full := joinPath(path, e.key.Value)
		if f == nil {
			l.unknown(e.key, s, path)
			continue
		}
		l.value(e.key, e.val, f, dst.Field(f.index), full)
	}
}

// unknown reports a key the schema does not have, with the closest known one.
func (l *loader) unknown(k *yaml.Node, s *schema, path string) {
	full := joinPath(path, k.Value)
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
	for k := range settables {
		if strings.HasSuffix(k, "."+name) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// value decodes the YAML value n of field f (whose key node is k) into dst.
func (l *loader) value(k, n *yaml.Node, f *field, dst reflect.Value, path string) {
	src := Source{File: l.name, Line: k.Line}
	l.sources[path] = src
	n = l.deref(n)
	switch f.kind {
	case structField:
		l.mapping(n, f.sub, dst, path)
	case ptrStructField:
		if isNull(n) {
			dst.SetZero()
			return
		}
		p := reflect.New(f.typ.Elem())
		l.mapping(n, f.sub, p.Elem(), path)
		dst.Set(p)
	case structListField:
		if isNull(n) {
			dst.SetZero()
			return
		}
		if n.Kind != yaml.SequenceNode {
			l.reject(src, path, "want a list of entries (- name: ...), not %s", describe(n))
			return
		}
		list := reflect.MakeSlice(f.typ, len(n.Content), len(n.Content))
		for i, item := range n.Content {
			ip := fmt.Sprintf("%s[%d]", path, i)
			l.sources[ip] = Source{File: l.name, Line: item.Line}
			elem := list.Index(i)
			if b, ok := elem.Addr().Interface().(*Backend); ok {
				b.Weight = 1 // the default; an explicit weight: 0 is rejected
			}
			l.mapping(item, f.sub, elem, ip)
		}
		dst.Set(list)
	default:
		l.leaf(src, n, dst, path)
	}
}

// leaf decodes a YAML scalar, or a list of scalars, into dst.
func (l *loader) leaf(src Source, n *yaml.Node, dst reflect.Value, path string) {
	switch {
	case n.Kind == yaml.SequenceNode && dst.Kind() == reflect.Slice:
		list := reflect.MakeSlice(dst.Type(), 0, len(n.Content))
		for i, item := range n.Content {
			ip := fmt.Sprintf("%s[%d]", path, i)
			isrc := Source{File: l.name, Line: item.Line}
			if item = l.deref(item); item.Kind != yaml.ScalarNode || isNull(item) {
				l.reject(isrc, ip, "want %s, not %s", typeName(dst.Type().Elem()), describe(item))
				return
			}
			e := reflect.New(dst.Type().Elem()).Elem()
			if err := setScalar(e, item.Value, item.ShortTag(), item); err != nil {
				l.reject(isrc, ip, "%v", err)
				return
			}
			list = reflect.Append(list, e)
		}
		dst.Set(list)
	case n.Kind != yaml.ScalarNode:
		l.reject(src, path, "want %s, not %s", typeName(dst.Type()), describe(n))
	case isNull(n):
		switch dst.Kind() {
		case reflect.String:
			dst.SetString("")
		case reflect.Slice:
			dst.Set(reflect.MakeSlice(dst.Type(), 0, 0))
		default:
			l.reject(src, path, "has no value; remove the key to keep the default%s, or give one", defaultNote(path))
		}
	case dst.Kind() == reflect.Slice && secret[path]:
		l.reject(src, path, "is not a list; write [...]")
	case dst.Kind() == reflect.Slice:
		l.reject(src, path, "%s is not a list; write [%s]", describe(n), n.Value)
	default:
		if err := setScalar(dst, n.Value, n.ShortTag(), n); err != nil {
			l.reject(src, path, "%v", err)
		}
	}
}

// secret keys hold credentials: their values are never shown in messages.
var secret = map[string]bool{"auth.api_keys": true, "auth.admin_token": true}

// typeName names a leaf's type for messages.
func typeName(t reflect.Type) string {
	if t == durationType {
		return "a duration (30s, 250ms)"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		return "a list of " + strings.TrimPrefix(strings.TrimPrefix(typeName(t.Elem()), "a "), "an ") + "s"
	}
	return t.String()
}

// setScalar sets a leaf from its text. tag is the YAML tag the text resolved
// to (!!int, !!str, ...; empty for the environment, flags and defaults) and
// n the YAML node, if any.
func setScalar(dst reflect.Value, s, tag string, n *yaml.Node) error {
	t := dst.Type()
	if t == durationType {
		d, err := parseDuration(s, tag, n)
		if err == nil {
			dst.SetInt(int64(d))
		}
		return err
	}
	switch t.Kind() {
	case reflect.String:
		dst.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("%s is not true or false", show(s))
		}
		dst.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		i, err := strconv.ParseInt(s, 10, 64)
		if err != nil && n != nil && (tag == "!!int" || tag == "!!float") {
			var f float64 // YAML's 0x10, 1e6 and 1_000
			if n.Decode(&f) == nil && f == float64(int64(f)) {
				i, err = int64(f), nil
			}
		}
		if err != nil || dst.OverflowInt(i) {
			return fmt.Errorf("%s is not a whole number", show(s))
		}
		dst.SetInt(i)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		u, err := strconv.ParseUint(s, 10, 64)
		if err != nil || dst.OverflowUint(u) {
			return fmt.Errorf("%s is not a whole number of zero or more", show(s))
		}
		dst.SetUint(u)
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil && n != nil && (tag == "!!int" || tag == "!!float") {
			err = n.Decode(&f) // YAML's .inf, 0x10
		}
		if err != nil {
			return fmt.Errorf("%s is not a number", show(s))
		}
		dst.SetFloat(f)
	default:
		return fmt.Errorf("values of type %s are not supported", t)
	}
	return nil
}

// show renders a value as written: numbers bare, anything else quoted.
func show(s string) string {
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return s
	}
	return strconv.Quote(s)
}
