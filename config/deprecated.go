package config

import (
	"maps"
	"slices"
	"strings"

	"github.com/spf13/viper"
)

// A deprecated key still works: its value, from the file or the
// environment, is read as the key that replaced it, and a warning names
// both (Config.Deprecated; the server logs them at start and at each
// reload). Setting both is an error.

// replaced maps each deprecated section or key to where its keys went,
// tried in order: a key of the section goes to the first of them that has
// a key of the same name.
var replaced = []struct {
	from string
	to   []string
}{
	{"cache_aware", []string{"policies.cache_aware", "index"}},
	{"session.epsilon", []string{"policies.session.epsilon"}},
}

// replacement returns the key that replaced key, if key is deprecated.
func replacement(key string) (string, bool) {
	settables := current().settables
	for _, r := range replaced {
		var rest string
		switch {
		case key == r.from:
		case strings.HasPrefix(key, r.from+"."):
			rest = key[len(r.from)+1:]
		default:
			continue
		}
		for _, to := range r.to {
			k := to
			if rest != "" {
				k = joinPath(to, rest)
			}
			if _, ok := settables[k]; ok {
				return k, true
			}
		}
	}
	return "", false
}

// deprecated reports whether key is a deprecated key.
func deprecated(key string) bool {
	_, ok := replacement(key)
	return ok
}

// migrate moves the value of each deprecated key set in the file or the
// environment to the key that replaced it, with its source, and notes a
// warning; the deprecated key itself is then left empty.
func (l *loader) migrate(v *viper.Viper) {
	for _, old := range slices.Sorted(maps.Keys(l.sources)) {
		src := l.sources[old]
		if src.Default {
			continue
		}
		key, ok := replacement(old)
		if !ok {
			continue
		}
		if s, both := l.sources[key]; both {
			l.fail(src, old, "is deprecated and %s is set too (%s); keep %s only", key, s, key)
			continue
		}
		v.Set(key, v.Get(old))
		v.Set(old, nil)
		l.sources[key], l.raw[key] = src, l.raw[old]
		l.deprecated = append(l.deprecated, src.String()+": "+old+" is deprecated; write "+key)
	}
}
