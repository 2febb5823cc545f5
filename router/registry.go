package router

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kvroute/kvroute/index"
)

// The built-in policies' names, which are also the reasons their simplest
// decisions give (X-Kvroute-Route).
const (
	CacheAwareName = "cache_aware"
	SessionName    = "session"
	LeastLoadName  = "least_load"
	RoundRobinName = "round_robin"
)

// Deps is what a policy is built from: the components every policy shares,
// built once beside the Router and kept across reloads and policy changes.
type Deps struct {
	Index    *index.Index // the fleet's cache state
	Sessions *Sessions    // session bindings
	// Configs holds each policy's configuration in force.
	Configs *Configs

	// coord holds the cluster leader's Coordinator (Router.SetCoordinator).
	coord *coordSlot
}

// Configs holds each registered policy's configuration in force, by name,
// for the policies built from the same Deps: a reload stores a new one
// (Set), which the policy reads at its next decision, and a policy built
// again (a reload back to it) finds it. The zero value holds the defaults.
type Configs struct {
	mu sync.Mutex
	m  map[string]live
}

// live returns e's configuration in force, made of its defaults if none
// was set.
func (c *Configs) live(e Entry) live {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.m[e.Name]
	if !ok {
		l = e.newLive()
		if c.m == nil {
			c.m = map[string]live{}
		}
		c.m[e.Name] = l
	}
	return l
}

// Set puts cfg (a pointer to the configuration type of the policy named
// name, as config decodes it) in force for that policy.
func (c *Configs) Set(name string, cfg any) error {
	e, ok := Lookup(name)
	if !ok {
		return fmt.Errorf("router: no policy %q", name)
	}
	if e.Config == nil {
		return nil
	}
	return c.live(e).set(cfg)
}

// registry is every policy by name, in the order the documentation lists
// them. Adding a policy is its file plus one line here (or a Register call).
var registry = struct {
	sync.RWMutex
	entries []Entry
	gen     uint64 // counts changes, for those who cache what they derive
}{entries: []Entry{
	cacheAwareModule.entry(),
	sessionModule.entry(),
	leastLoadModule.entry(),
	roundRobinModule.entry(),
}}

// Register adds a policy to the registry. It fails when the name is taken
// or the module is incomplete.
func Register[C any](m Module[C]) error { return register(m.entry()) }

func register(e Entry) error {
	if e.Name == "" || e.build == nil {
		return fmt.Errorf("router: policy module needs a name and a constructor")
	}
	registry.Lock()
	defer registry.Unlock()
	if slices.ContainsFunc(registry.entries, func(x Entry) bool { return x.Name == e.Name }) {
		return fmt.Errorf("router: policy %q is registered already", e.Name)
	}
	registry.entries = append(registry.entries, e)
	registry.gen++
	return nil
}

// Generation counts the registry's changes: what is derived from
// Policies stays true while it is the same.
func Generation() uint64 {
	registry.RLock()
	defer registry.RUnlock()
	return registry.gen
}

// Policies returns the registered policies, in registry order.
func Policies() []Entry {
	registry.RLock()
	defer registry.RUnlock()
	return slices.Clone(registry.entries)
}

// Names returns the registered policies' names, in registry order.
func Names() []string {
	registry.RLock()
	defer registry.RUnlock()
	names := make([]string, 0, len(registry.entries))
	for _, e := range registry.entries {
		names = append(names, e.Name)
	}
	return names
}

// Lookup returns the entry named name.
func Lookup(name string) (Entry, bool) {
	registry.RLock()
	defer registry.RUnlock()
	i := slices.IndexFunc(registry.entries, func(x Entry) bool { return x.Name == name })
	if i < 0 {
		return Entry{}, false
	}
	return registry.entries[i], true
}

// NewPolicy builds the policy named name from deps; missing components of
// deps are made fresh (an empty Index, a session table without bounds, the
// policies' defaults).
func NewPolicy(name string, deps Deps) (Policy, error) {
	e, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (want one of %s)", name, strings.Join(Names(), ", "))
	}
	deps = deps.filled()
	return e.build(deps, deps.Configs.live(e)), nil
}

// filled returns d with its missing components made fresh: an empty Index,
// a session table without bounds, Configs holding the defaults, no
// Coordinator.
func (d Deps) filled() Deps {
	if d.Index == nil {
		d.Index = index.New(index.Options{})
	}
	if d.Sessions == nil {
		d.Sessions = NewSessions(0)
	}
	if d.Configs == nil {
		d.Configs = &Configs{}
	}
	if d.coord == nil {
		d.coord = &coordSlot{}
	}
	return d
}

// Configs returns the policies' configurations in force the Router's
// policies read (nil for a Router built with New).
func (r *Router) Configs() *Configs { return r.deps.Configs }
