package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
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
	var c Config
	if err := decode(newViper(), &c); err != nil {
		panic("config: defaults do not decode: " + err.Error()) // a programming error
	}
	return &c
}

// newViper returns a viper holding Defaults().
func newViper() *viper.Viper {
	v := viper.New()
	for k, d := range Defaults() {
		v.SetDefault(k, d)
	}
	return v
}

// decode decodes v's merged layers into c strictly: a key c does not have
// is an error, and so is a value the hooks refuse (a duration without its
// unit, an empty number, a number that would be rounded).
func decode(v *viper.Viper, c *Config) error {
	if c.Policies == nil {
		c.Policies = newPolicies()
	}
	return v.UnmarshalExact(c, viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
		durationHook, strictHook, listHook)))
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
	l := &loader{name: name, sources: map[string]Source{}, raw: map[string]string{}, failed: map[string]bool{}, seen: map[string]bool{}}
	v := newViper()
	if l.walk(data) {
		v.SetConfigType("yaml")
		if err := v.ReadConfig(bytes.NewReader(data)); err != nil {
			// The walk has said why (a key set twice), or this does.
			l.unread = true
			if len(l.errs) == 0 {
				l.yamlError(err)
			}
		}
	}
	l.env(v, env, l.flags(v, fs))
	l.migrate(v)
	var c Config
	l.decodeErrors(decode(v, &c))
	c.Deprecated = l.deprecated
	for i := range c.Backends {
		if c.Backends[i].Engine == "" {
			c.Backends[i].Engine = "vllm"
		}
		// In code a zero weight means the default; written in the file it
		// would silently mean 1, so it is an error.
		k := fmt.Sprintf("backends[%d].weight", i)
		if _, written := l.sources[k]; c.Backends[i].Weight == 0 && !written {
			c.Backends[i].Weight = 1
		} else if c.Backends[i].Weight == 0 && !l.failedUnder(k) {
			l.fail(l.sourceOf(k), k, "must be positive (default 1), got 0")
		}
		if c.Backends[i].DataParallelSize == 0 {
			c.Backends[i].DataParallelSize = 1 // 0 ranks would mean one as well
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

// loader collects, for one load, where each value came from and every error.
type loader struct {
	name    string
	sources map[string]Source // key path (backends[1].url) → where its value came from
	raw     map[string]string // key path → its value as written (file scalar, variable, flag)
	failed  map[string]bool   // key paths whose value was rejected while loading
	errs    []error
	seen    map[string]bool // error texts already reported
	budget  int             // YAML nodes left to visit (bounds alias expansion)
	unknown bool            // the walk reported an unknown key
	// deprecated are the warnings about deprecated keys (migrate).
	deprecated []string
	// unread: the file could not be read as a configuration, so Validate's
	// errors would be about values it did not set.
	unread bool
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

// sourceOf is where key's value came from, by precedence (the flag, else
// the variable, else the file's line, else the default); for a key never
// set, where its closest enclosing key was (backends[1] for
// backends[1].name), else the file.
func (l *loader) sourceOf(key string) Source {
	for k := key; k != ""; {
		if s, ok := l.sources[k]; ok {
			return s
		}
		if _, ok := Defaults()[k]; ok {
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
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		errs = joined.Unwrap()
	}
	for _, e := range errs {
		var fe *fieldError
		switch {
		case !errors.As(e, &fe):
			l.add(&Error{Source: Source{File: l.name}, Msg: e.Error()})
		case !l.failedUnder(fe.field):
			l.add(&Error{Source: l.sourceOf(fe.field), Key: fe.field, Msg: fe.msg})
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

// flags binds the flags of fs that FlagKeys names to their keys and
// returns the keys of those that were set.
func (l *loader) flags(v *viper.Viper, fs *pflag.FlagSet) map[string]bool {
	set := map[string]bool{}
	if fs == nil {
		return set
	}
	for name, key := range FlagKeys {
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		_ = v.BindPFlag(key, f) // fails only for a nil flag
		if f.Changed {
			set[key] = true
			l.sources[key], l.raw[key] = Source{Flag: name}, f.Value.String()
		}
	}
	return set
}

// env sets each KVROUTE_* variable of env (empty ones included) over the
// file, except those for keys a flag set, and reports those that name no
// key. viper reads variables only from the process environment, so they
// are given to it as values.
func (l *loader) env(v *viper.Viper, env []string, flagged map[string]bool) {
	d := current()
	for _, e := range slices.Sorted(slices.Values(env)) {
		name, value, _ := strings.Cut(e, "=")
		if !strings.HasPrefix(name, EnvPrefix+"_") || IgnoredEnv(name) {
			continue
		}
		src := Source{Env: name}
		key, ok := d.env[name]
		switch {
		case !ok:
			names := make([]string, 0, len(d.env))
			for n, k := range d.env {
				if !d.lists[k] {
					names = append(names, n)
				}
			}
			hint := "the closest known variable is " + closest(name, names)
			if s := suggest(name, names); len(s) > 0 {
				sort.Strings(s)
				hint = "did you mean " + strings.Join(s, " or ") + "?"
			}
			l.add(&Error{Source: src, Msg: fmt.Sprintf("no configuration key is named %s (%s)", name, hint)})
		case d.lists[key]:
			l.fail(src, key, "a list of sections is set in the configuration file only")
		case !flagged[key]:
			l.sources[key], l.raw[key] = src, value
			v.Set(key, value)
		}
	}
}

// decodeErrors reports each of decode's errors with its key, its value as
// written and where it came from.
//
// The walk looks at each node of the error tree itself, before what it
// wraps (a DecodeError that wraps a join is one error, not several), so it
// switches on the node's type; errors.As would look through the node.
func (l *loader) decodeErrors(err error) {
	switch e := err.(type) { //nolint:errorlint // walks the tree node by node; see above
	case nil:
	case interface{ Unwrap() []error }:
		for _, e := range e.Unwrap() {
			l.decodeErrors(e)
		}
	case *mapstructure.DecodeError:
		key, cause := e.Name(), e.Unwrap()
		var item emptyItemError
		if errors.As(cause, &item) {
			key = fmt.Sprintf("%s[%d]", key, int(item))
		}
		switch {
		case strings.HasPrefix(cause.Error(), "has invalid keys"):
			if !l.unknown { // else the walk named them, with their lines
				l.fail(l.sourceOf(key), key, "%v", cause)
			}
		case !l.failedUnder(key):
			l.reject(l.sourceOf(key), key, "%s", l.explain(key, cause))
		}
	case interface{ Unwrap() error }:
		l.decodeErrors(e.Unwrap())
	default:
		l.add(&Error{Source: Source{File: l.name}, Msg: err.Error()})
	}
}

// explain renders one decoding error of key's value.
func (l *loader) explain(key string, cause error) string {
	raw, src := l.raw[key], l.sourceOf(key)
	shown := show(raw)
	if secret[key] || strings.HasPrefix(key, "auth.api_keys[") {
		shown = "the value"
	}
	var (
		unit  noUnitError
		parse *mapstructure.ParseError
		conv  *mapstructure.UnconvertibleTypeError
	)
	switch {
	case errors.As(cause, &unit):
		return noUnit(raw, float64(unit))
	case errors.Is(cause, errNotDuration):
		return strconv.Quote(raw) + " is not a duration; write a number with a unit (30s, 250ms, 1m30s, 1h)"
	case errors.Is(cause, errEmpty) && src.Env != "":
		return "is empty; unset " + src.Env + " to keep the default" + defaultNote(key) + ", or give a value"
	case errors.Is(cause, errEmpty) && src.Flag != "":
		return "is empty; leave --" + src.Flag + " out to keep the default" + defaultNote(key) + ", or give a value"
	case errors.Is(cause, errEmpty):
		return "is empty; give a value"
	case errors.As(cause, new(emptyItemError)):
		return "is empty; separate the items with single commas"
	case errors.As(cause, &parse):
		return shown + " is not " + typeName(parse.Expected.Type())
	case errors.As(cause, &conv) && conv.Expected.Kind() == reflect.String:
		return "want a string; write " + shown + " in quotes"
	case conv != nil:
		return "want " + typeName(conv.Expected.Type()) + ", not " + shown
	}
	return cause.Error()
}

// secret keys hold credentials: their values are never shown in messages.
var secret = map[string]bool{"auth.api_keys": true, "auth.admin_token": true}

// show renders a value as written: numbers bare, anything else quoted.
func show(s string) string {
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return s
	}
	return strconv.Quote(s)
}
