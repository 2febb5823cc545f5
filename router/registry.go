package router

import (
	"fmt"
	"slices"
	"strings"
	"sync"
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
	Index    *Index    // the fleet's cache state
	Sessions *Sessions // session bindings
	Tuning   *Tunings  // every policy's tuning, changed in place by reloads
}

// Entry describes one policy of the registry.
type Entry struct {
	Name string
	// Summary is one line of Markdown for --help and the README's table of
	// policies (TestReadmeListsThePolicies keeps the two the same).
	Summary string
	// Tuning names the configuration section that tunes the policy, or "".
	Tuning string
	// New builds the policy. Every field of deps is set.
	New func(deps Deps) Policy
}

// registry is every policy by name, in the order the documentation lists
// them. Adding a policy is its file plus one line here (or a Register call).
var registry = struct {
	sync.RWMutex
	entries []Entry
}{entries: []Entry{
	{Name: CacheAwareName, Tuning: CacheAwareName, New: newCacheAwarePolicy,
		Summary: "score `s(r) = m_r − (λ·q_r + ν·P_r)/w_r − μ·k_r`: matched prefix tokens in whole engine blocks, less λ per queued request and ν per prompt token kvroute sent to `r` that is not yet prefilled (both per unit of `weight`), and μ × KV usage; with the guard rails below"},
	{Name: SessionName, Tuning: SessionName, New: newSessionPolicy,
		Summary: "sticky sessions only; new sessions placed by consistent hashing with bounded loads"},
	{Name: LeastLoadName, New: func(Deps) Policy { return LeastLoad{} },
		Summary: "fewest requests in flight through kvroute per unit of `weight`, ties at random"},
	{Name: RoundRobinName, New: func(Deps) Policy { return &RoundRobin{} },
		Summary: "nginx's default: smooth weighted round-robin (weights 3 and 1 give a, a, b, a, …)"},
}}

// Register adds a policy to the registry. It fails when the name is taken
// or the entry is incomplete.
func Register(e Entry) error {
	if e.Name == "" || e.New == nil {
		return fmt.Errorf("router: policy entry needs a name and a constructor")
	}
	registry.Lock()
	defer registry.Unlock()
	if slices.ContainsFunc(registry.entries, func(x Entry) bool { return x.Name == e.Name }) {
		return fmt.Errorf("router: policy %q is registered already", e.Name)
	}
	registry.entries = append(registry.entries, e)
	return nil
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
// zero Tuning).
func NewPolicy(name string, deps Deps) (Policy, error) {
	e, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (want one of %s)", name, strings.Join(Names(), ", "))
	}
	return e.New(deps.filled()), nil
}

// filled returns d with its missing components made fresh: an empty Index,
// a session table without bounds, the zero Tuning.
func (d Deps) filled() Deps {
	if d.Index == nil {
		d.Index = NewIndex(IndexOptions{})
	}
	if d.Sessions == nil {
		d.Sessions = NewSessions(0)
	}
	if d.Tuning == nil {
		d.Tuning = &Tunings{}
	}
	return d
}
