package router

import (
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
)

// Module describes a policy to the registry: its name, a line for the
// documentation, its configuration type C with the defaults (decoded from
// the configuration file's own policies.<name> section) and its
// constructor. A policy without settings has C = NoConfig.
//
// C is a struct whose fields carry mapstructure tags (the keys of its
// section) and doc comments stating each default in a sentence
// "Default <value>." (the configuration reference is generated from
// them); *C may implement Validator.
type Module[C any] struct {
	Name string
	// Summary is one line of Markdown for --help and the policy tables
	// (generated from the registry: go run ./config/gen).
	Summary string
	// Defaults is the configuration a section starts from.
	Defaults C
	// New builds the policy over the shared components and the
	// configuration in force, which a reload replaces (Live.Store) while
	// the policy runs: read it once per decision.
	New func(deps Deps, cfg *Live[C]) Policy
}

// NoConfig is the configuration of a policy without settings.
type NoConfig struct{}

// Validator is a configuration that checks its values. Validate returns
// nil or one *FieldError per bad value, joined (errors.Join).
type Validator interface {
	Validate() error
}

// FieldError is a bad value of a policy's configuration: the key within
// its section (lambda) and what is wrong with it.
type FieldError struct{ Key, Msg string }

func (e *FieldError) Error() string { return e.Key + ": " + e.Msg }

// fieldErrors collects FieldErrors for a Validate method.
type fieldErrors []error

func (fe *fieldErrors) add(key, format string, args ...any) {
	*fe = append(*fe, &FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
}

func (fe fieldErrors) err() error { return errors.Join(fe...) }

// Live holds a policy's configuration in force behind an atomic pointer:
// the policy loads it once per decision, a reload stores a new one.
type Live[C any] struct{ p atomic.Pointer[C] }

// NewLive returns a Live holding c.
func NewLive[C any](c C) *Live[C] {
	l := &Live[C]{}
	l.Store(c)
	return l
}

// Load returns the configuration in force; it must not be modified.
func (l *Live[C]) Load() *C { return l.p.Load() }

// Store puts c in force for the decisions that follow.
func (l *Live[C]) Store(c C) { l.p.Store(&c) }

// set stores *cfg, which must be a *C.
func (l *Live[C]) set(cfg any) error {
	c, ok := cfg.(*C)
	if !ok || c == nil {
		return fmt.Errorf("router: a configuration of type %T where %v is wanted", cfg, reflect.TypeFor[C]())
	}
	l.Store(*c)
	return nil
}

// live is a Live of any configuration type.
type live interface {
	set(cfg any) error
}

// Entry is a Module as the registry keeps it, its configuration type
// erased.
type Entry struct {
	Name    string
	Summary string
	// Config is the policy's configuration type (a struct), nil for a
	// policy without settings.
	Config reflect.Type

	defaults func() any              // a *C holding the defaults
	newLive  func() live             // a Live[C] holding the defaults
	build    func(Deps, live) Policy // Module.New
}

// Defaults returns a new *C holding the policy's defaults (nil for a
// policy without settings), for the configuration loader to decode its
// section into.
func (e Entry) Defaults() any {
	if e.Config == nil {
		return nil
	}
	return e.defaults()
}

// Validate checks cfg (a *C) with C's Validator, if it has one.
func (e Entry) Validate(cfg any) error {
	if v, ok := cfg.(Validator); ok {
		return v.Validate()
	}
	return nil
}

// entry erases m's configuration type.
func (m Module[C]) entry() Entry {
	e := Entry{
		Name: m.Name, Summary: m.Summary,
		defaults: func() any { c := m.Defaults; return &c },
		newLive:  func() live { return NewLive(m.Defaults) },
	}
	if New := m.New; New != nil {
		e.build = func(d Deps, l live) Policy { return New(d, l.(*Live[C])) }
	}
	if t := reflect.TypeFor[C](); t != reflect.TypeFor[NoConfig]() {
		e.Config = t
	}
	return e
}
