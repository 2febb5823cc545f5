package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/router"
)

// The policies: section holds a section for each registered policy that
// has settings (router.Entry.Config), decoded into the policy's own
// configuration type: policies.cache_aware.lambda is a field of
// router.CacheAwareConfig. The section's Go type is made from the registry
// (policiesType), again whenever the registry changes, so a policy
// registered by a test or by a program embedding kvroute has its section,
// its defaults, its environment variables and its errors with line
// numbers like every other.
//
// Config.Policies holds a value (not a pointer) of that type: copying a
// Config copies the policies' settings with it. Read one with
// (*Config).PolicyConfig, change one with UpdatePolicy.

// policiesKey is the section's key.
const policiesKey = "policies"

// policiesTypes caches the section's type for one generation of the
// registry.
var policiesTypes struct {
	sync.Mutex
	gen     uint64
	t       reflect.Type
	entries []router.Entry // the entries with settings, one per field
}

// policiesType returns the struct type of the policies: section and the
// registry entries of its fields, in order.
func policiesType() (reflect.Type, []router.Entry) {
	gen := router.Generation()
	policiesTypes.Lock()
	defer policiesTypes.Unlock()
	if policiesTypes.t != nil && policiesTypes.gen == gen {
		return policiesTypes.t, policiesTypes.entries
	}
	var fields []reflect.StructField
	var entries []router.Entry
	for _, e := range router.Policies() {
		if e.Config == nil {
			continue
		}
		fields = append(fields, reflect.StructField{Name: policyField(e.Name), Type: e.Config,
			Tag: reflect.StructTag(`mapstructure:"` + e.Name + `"`)})
		entries = append(entries, e)
	}
	policiesTypes.gen, policiesTypes.t, policiesTypes.entries = gen, reflect.StructOf(fields), entries
	return policiesTypes.t, entries
}

// policyField is the Go name of the field of the policy named name: an
// exported identifier whatever the name (which the registry does not
// restrict).
func policyField(name string) string {
	var b strings.Builder
	b.WriteString("P_")
	for _, r := range name {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			fmt.Fprintf(&b, "_%x_", r)
		}
	}
	return b.String()
}

// newPolicies returns a value of policiesType holding every policy's
// defaults.
func newPolicies() any {
	t, entries := policiesType()
	v := reflect.New(t).Elem()
	for i, e := range entries {
		v.Field(i).Set(reflect.ValueOf(e.Defaults()).Elem())
	}
	return v.Interface()
}

// policyDefaults adds each policy's defaults to d, by key
// (policies.cache_aware.lambda), written as Defaults writes them.
func policyDefaults(d map[string]any) {
	_, entries := policiesType()
	for _, e := range entries {
		addDefaults(d, joinPath(policiesKey, e.Name), reflect.ValueOf(e.Defaults()).Elem(), schemaOf(e.Config))
	}
}

// addDefaults adds the leaves of v (a struct of schema s) to d under
// prefix.
func addDefaults(d map[string]any, prefix string, v reflect.Value, s *schema) {
	for _, f := range s.fields {
		key, fv := joinPath(prefix, f.key), v.Field(f.index)
		switch {
		case f.kind == structField:
			addDefaults(d, key, fv, f.sub)
		case f.kind != leafField:
		case f.typ == durationType:
			d[key] = formatDuration(time.Duration(fv.Int()))
		default:
			d[key] = fv.Interface()
		}
	}
}

// formatDuration writes d as the defaults do: 10m, 1m30s, 250ms, 0s.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// PolicyConfig returns a copy of the settings of the policy named name, as a
// pointer to its configuration type (router.Entry.Config), or nil when the
// policy has none or was registered after c was loaded.
func (c *Config) PolicyConfig(name string) any {
	f := c.policyValue(name)
	if !f.IsValid() {
		return nil
	}
	p := reflect.New(f.Type())
	p.Elem().Set(f)
	return p.Interface()
}

// policyValue is the field of c.Policies of the policy named name, or the
// zero Value.
func (c *Config) policyValue(name string) reflect.Value {
	if c.Policies == nil {
		return reflect.Value{}
	}
	return reflect.ValueOf(c.Policies).FieldByName(policyField(name))
}

// UpdatePolicy changes the settings of the policy named name, of type C,
// in c: f gets a copy to change, which then replaces them. It fails when
// the policy has no settings of type C.
func UpdatePolicy[C any](c *Config, name string, f func(*C)) error {
	cur := c.policyValue(name)
	if !cur.IsValid() || cur.Type() != reflect.TypeFor[C]() {
		return fmt.Errorf("config: policy %q has no settings of type %v", name, reflect.TypeFor[C]())
	}
	all := reflect.New(reflect.TypeOf(c.Policies)).Elem()
	all.Set(reflect.ValueOf(c.Policies))
	p := all.FieldByName(policyField(name)).Addr().Interface().(*C)
	f(p)
	c.Policies = all.Interface()
	return nil
}

// checkPolicies runs each policy's own validation and reports its errors
// under the policy's section.
func checkPolicies(c *Config, bad func(field, format string, args ...any)) {
	_, entries := policiesType()
	for _, e := range entries {
		cfg := c.PolicyConfig(e.Name)
		if cfg == nil {
			continue
		}
		err := e.Validate(cfg)
		if err == nil {
			continue
		}
		errs := []error{err}
		var joined interface{ Unwrap() []error }
		if errors.As(err, &joined) {
			errs = joined.Unwrap()
		}
		prefix := joinPath(policiesKey, e.Name)
		for _, err := range errs {
			var fe *router.FieldError
			if errors.As(err, &fe) {
				bad(joinPath(prefix, fe.Key), "%s", fe.Msg)
			} else {
				bad(prefix, "%v", err)
			}
		}
	}
}
