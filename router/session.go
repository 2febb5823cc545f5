package router

import (
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/backends"
)

// SessionPolicy is sticky sessions only, kept for comparison with
// cache_aware: a request carrying a session goes to the replica that served
// the session last, while it is available and within the load bound; a new
// (or moved) session is placed by consistent hashing with bounded loads
// (CHWBL), the scheme of KubeAI and of HAProxy's hash-balance-factor.
// Requests without a session go to the least loaded replica. Weights
// (backends[].weight) scale each replica's share of the load bound and, as
// in nginx's consistent hash, its points on the ring.
type SessionPolicy struct {
	sessions *Sessions
	cfg      *Live[SessionConfig]
	now      func() time.Time

	mu   sync.Mutex
	ring *ring
}

// sessionModule registers the session policy.
var sessionModule = Module[SessionConfig]{
	Name:     SessionName,
	Summary:  "sticky sessions only; new sessions placed by consistent hashing with bounded loads",
	Defaults: SessionConfig{Epsilon: 0.25},
	New: func(d Deps, cfg *Live[SessionConfig]) Policy {
		return &SessionPolicy{sessions: d.Sessions, cfg: cfg, now: time.Now}
	},
}

// SessionConfig is the session policy's section, policies.session.
type SessionConfig struct {
	// Epsilon bounds load: a session leaves its replica when that would
	// carry more than (1+ε)·mean load. Default 0.25.
	Epsilon float64 `mapstructure:"epsilon"`
}

// Validate implements Validator.
func (c *SessionConfig) Validate() error {
	var fe fieldErrors
	nonNegative(&fe, "epsilon", c.Epsilon)
	return fe.err()
}

// NewSessionPolicy builds the policy on a configuration of its own;
// epsilon is the load bound's slack.
func NewSessionPolicy(sessions *Sessions, epsilon float64) *SessionPolicy {
	return &SessionPolicy{sessions: sessions, cfg: NewLive(SessionConfig{Epsilon: epsilon}), now: time.Now}
}

// Name implements Policy.
func (*SessionPolicy) Name() string { return SessionName }

// Pick implements Policy.
func (p *SessionPolicy) Pick(req *Request, cands []*backends.Replica) Decision {
	// A session ID the table rejects (too long) counts as none.
	if req.Session == "" || !p.sessions.admit(req.Session) {
		return Decision{Replica: leastInFlight(cands), Reason: LeastLoadName}
	}
	now := p.now()
	dec := p.place(req.Session, cands, now, true)
	dec.rec.session = p.sessions.Bind(req.Session, dec.Replica, now)
	return dec
}

// Explain implements Explainer: Pick's choice, with no session bound, no
// rejected ID counted and the ring kept as it is.
func (p *SessionPolicy) Explain(req *Request, cands []*backends.Replica) (Decision, []Score) {
	if req.Session == "" || !p.sessions.admits(req.Session) {
		return Decision{Replica: leastInFlight(cands), Reason: LeastLoadName}, nil
	}
	return p.place(req.Session, cands, p.now(), false), nil
}

// place chooses the replica of session, an ID the table takes: the one
// bound to it while it is a candidate within the load bound, else by
// consistent hashing with bounded loads. keep: a ring rebuilt for cands
// replaces the policy's (see ringFor).
func (p *SessionPolicy) place(session string, cands []*backends.Replica, now time.Time, keep bool) Decision {
	bound := newLoadBound(cands, p.cfg.Load().Epsilon, 0)
	within := func(r *backends.Replica) bool { return bound.within(boundLoad(r), r.Weight(), false) }
	if rep := p.sessions.Lookup(session, now); rep != nil && slices.Contains(cands, rep) && within(rep) {
		return Decision{Replica: rep, Reason: SessionName}
	}
	rep := p.ringFor(cands, keep).walk(hashString(session), cands, within)
	return Decision{Replica: rep, Reason: "session new"}
}

// ringFor returns a ring holding every candidate with its current weight,
// rebuilding it when a replica appears that it lacks or whose weight
// changed; with keep, the rebuilt ring replaces the policy's. Which
// candidate a walk finds does not depend on the other replicas a ring
// holds, so a ring rebuilt and not kept gives what the kept one would.
func (p *SessionPolicy) ringFor(cands []*backends.Replica, keep bool) *ring {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ring != nil && p.ring.covers(cands) {
		return p.ring
	}
	names := map[string]float64{}
	if p.ring != nil {
		for n, w := range p.ring.names {
			names[n] = w
		}
	}
	for _, c := range cands {
		names[c.Name()] = c.Weight()
	}
	r := newRing(names)
	if keep {
		p.ring = r
	}
	return r
}

// ring is a consistent-hash ring of replica names with virtual nodes.
type ring struct {
	points []ringPoint
	names  map[string]float64 // replica name → weight its points were made for
}

type ringPoint struct {
	hash uint64
	name string
}

// vnodes is the number of ring points of a weight-1 replica; a replica of
// weight w has w times as many (as nginx's consistent hash), at least 1 and
// at most maxVnodes.
const (
	vnodes    = 160
	maxVnodes = 100 * vnodes
)

func pointsFor(w float64) int {
	return int(min(max(math.Round(w*vnodes), 1), maxVnodes))
}

func newRing(names map[string]float64) *ring {
	r := &ring{names: names}
	for n, w := range names {
		for v := range pointsFor(w) {
			r.points = append(r.points, ringPoint{hashString(n + "#" + strconv.Itoa(v)), n})
		}
	}
	slices.SortFunc(r.points, func(a, b ringPoint) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return 0
	})
	return r
}

func (r *ring) covers(cands []*backends.Replica) bool {
	for _, c := range cands {
		if w, ok := r.names[c.Name()]; !ok || w != c.Weight() {
			return false
		}
	}
	return true
}

// walk returns the first candidate clockwise from h that ok accepts; if none
// does, the first candidate clockwise from h.
func (r *ring) walk(h uint64, cands []*backends.Replica, ok func(*backends.Replica) bool) *backends.Replica {
	byName := func(n string) *backends.Replica {
		for _, c := range cands {
			if c.Name() == n {
				return c
			}
		}
		return nil
	}
	start, _ := slices.BinarySearchFunc(r.points, h, func(p ringPoint, h uint64) int {
		switch {
		case p.hash < h:
			return -1
		case p.hash > h:
			return 1
		}
		return 0
	})
	var first *backends.Replica
	for i := 0; i < len(r.points); i++ {
		c := byName(r.points[(start+i)%len(r.points)].name)
		if c == nil {
			continue
		}
		if first == nil {
			first = c
		}
		if ok(c) {
			return c
		}
	}
	if first == nil {
		return cands[0]
	}
	return first
}

// hashString is FNV-1a finished with the splitmix64 mixer, so that short,
// similar names still land evenly on the ring.
func hashString(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
