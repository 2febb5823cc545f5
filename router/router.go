// Package router chooses a replica for each request. A Policy scores the
// available replicas; the Router applies what every policy shares: the model
// filter, the availability predicate, the exclusion of replicas already
// tried for this request and the holding back of backup replicas while a
// primary one is left.
package router

import (
	"cmp"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/radix"
)

// Request is what a policy sees of one request. Model and Session may alias
// the request body (see oai.Request): a policy that keeps them copies them.
type Request struct {
	Kind    oai.Kind
	Model   string
	Stream  bool
	Session string // session identity: the session header, else the OpenAI user field
	// Key is the routing key: one value per whole block of the prompt's
	// tokens (see tokenize.Tokenizer.AppendBlocks; the policy's KeyBlock
	// says how many tokens a value stands for); nil when the policy needs
	// none.
	Key []uint32
	// Tokens is the prompt's length in tokens; 0 means len(Key)×KeyBlock.
	Tokens int
	// ResponseID names the stored response the request refers to (a
	// responses request's previous_response_id): the replica that stored
	// it gets the request (see Responses).
	ResponseID string

	// Exact is the exact routing key, from the engine's own tokens
	// (precise mode, see Exact), and ExactTokens the prompt's length in
	// those tokens; nil when there is none. Replicas whose Index entries
	// follow their engine's events are scored on it.
	Exact       []uint32
	ExactTokens int

	// PoolWait: this attempt may wait for a connection of a replica whose
	// pool is full (Available); the proxy sets it for one attempt once
	// every candidate's pool was full (proxy/poolfull.go). Without it,
	// replicas with a full pool are no candidates.
	PoolWait bool

	// Leg is the side of a disaggregated request this route is for:
	// RolePrefill (prefill or both replicas, chosen by the policy) or
	// RoleDecode (decode or both replicas, chosen by load: pickDecode).
	// "" routes a whole request over every replica.
	Leg backends.Role
	// LocalPrefill, on a decode leg (vLLM's protocol only), says when a
	// decode replica computes the prompt itself: the request goes to it
	// whole, with no prefill leg (routeDecode, Decision.Local). The zero
	// value: never.
	LocalPrefill LocalPrefill
	// Prefilled, on a decode leg, says its prompt's prefill is done (the
	// decode replica of a vLLM pair is chosen after it): no decode replica
	// computes the prompt itself, whatever LocalPrefill says.
	Prefilled bool

	keyBuf   *keyBuffer // Key's pooled buffer, returned by Router.Release
	exactBuf *keyBuffer // Exact's
	lead     bool       // placed by the cluster's leader for another router (Router.Reserve)
}

// Errors a route can end in.
var (
	// ErrUnknownModel: no replica in the fleet serves the requested model.
	ErrUnknownModel = errors.New("no replica serves the requested model")
	// ErrNoReplica: replicas serve the model but none is available now.
	ErrNoReplica = errors.New("no replica is available")
	// ErrNoExplain: the policy in force cannot tell its choice without
	// making it (it is no Explainer).
	ErrNoExplain = errors.New("the policy cannot explain a decision without making it")
)

// Fleet is the part of backends.Fleet the router needs.
type Fleet interface {
	Replicas() []*backends.Replica
}

// Router applies a Policy to the fleet's available replicas. It owns what
// every policy shares (Deps: the Index, the session table, the policies' configurations) and
// the tokenizer that renders prompts to routing keys.
type Router struct {
	fleet  Fleet
	policy atomic.Pointer[policyBox]
	deps   Deps
	tok    Tokenizer // nil: never a routing key
	// responses maps stored response ids to their replicas; nil: none.
	responses atomic.Pointer[Responses]
	rr        wrr // round-robin state for requests not routed by prompt
	// sharer hears of every decision (SetSharer); nil: none.
	sharer atomic.Pointer[sharerBox]
	// exact gives requests their exact keys (SetExact); nil: none.
	exact atomic.Pointer[exactBox]
}

type policyBox struct{ p Policy }

// New builds a Router over fleet with policy p, which has components of its
// own (tests); no tokenizer.
func New(fleet Fleet, p Policy) *Router {
	r := &Router{fleet: fleet}
	r.SetPolicy(p)
	return r
}

// NewNamed builds a Router over fleet with the registered policy named
// policy, built from deps (see NewPolicy), and tok as the tokenizer of
// routing keys (nil: none).
func NewNamed(fleet Fleet, policy string, deps Deps, tok Tokenizer) (*Router, error) {
	deps = deps.filled()
	p, err := NewPolicy(policy, deps)
	if err != nil {
		return nil, err
	}
	r := &Router{fleet: fleet, deps: deps, tok: tok}
	r.SetPolicy(p)
	return r, nil
}

// SetPolicy swaps the policy; requests in flight keep the old one.
func (r *Router) SetPolicy(p Policy) { r.policy.Store(&policyBox{p}) }

// UsePolicy swaps the policy for the registered one named name, built from
// the Router's Deps: the Index, sessions and configurations stay.
func (r *Router) UsePolicy(name string) error {
	p, err := NewPolicy(name, r.deps)
	if err != nil {
		return err
	}
	r.SetPolicy(p)
	return nil
}

// Policy returns the current policy.
func (r *Router) Policy() Policy { return r.policy.Load().p }

// Index returns the fleet's cache state the policies share: the Router's,
// else the current policy's own (an IndexUser built outside the Router),
// else nil.
func (r *Router) Index() *index.Index {
	if r.deps.Index != nil {
		return r.deps.Index
	}
	if iu, ok := r.Policy().(IndexUser); ok {
		return iu.Index()
	}
	return nil
}

// Sessions returns the session table the policies share, or nil.
func (r *Router) Sessions() *Sessions { return r.deps.Sessions }

// Forget drops everything the Router and its policy know of a replica that
// left the fleet: its Index entries, session bindings, stored responses and
// the policy's own state.
func (r *Router) Forget(rep *backends.Replica) {
	if f, ok := r.Policy().(Forgetter); ok {
		f.Forget(rep)
	}
	if ix := r.Index(); ix != nil {
		ix.Forget(rep)
	}
	if r.deps.Sessions != nil {
		r.deps.Sessions.Forget(rep)
	}
	if t := r.Responses(); t != nil {
		t.Forget(rep)
	}
}

func tried(rep *backends.Replica, exclude []*backends.Replica) bool {
	for _, t := range exclude {
		if t == rep {
			return true
		}
	}
	return false
}

// candidates appends to dst the available replicas (Available, with
// poolWait) serving model that are not in exclude: the primary ones, or when there is no such primary, the
// backups (as nginx's backup servers, which get requests only when every
// primary is down or already tried). known reports whether any replica at
// all serves model.
func (r *Router) candidates(dst []*backends.Replica, model string, leg backends.Role, exclude []*backends.Replica, poolWait bool) (_ []*backends.Replica, known bool) {
	reps := r.fleet.Replicas()
	start, backups := len(dst), false
	for _, rep := range reps {
		if model != "" && !rep.Serves(model) {
			continue
		}
		if !onLeg(rep, leg) {
			continue
		}
		known = true
		if Available(rep, poolWait) && !tried(rep, exclude) {
			if rep.Backup() {
				backups = true
				continue
			}
			dst = append(dst, rep)
		}
	}
	if len(dst) > start || !backups {
		return dst, known
	}
	for _, rep := range reps {
		if rep.Backup() && (model == "" || rep.Serves(model)) && onLeg(rep, leg) && Available(rep, poolWait) && !tried(rep, exclude) {
			dst = append(dst, rep)
		}
	}
	return dst, known
}

// Route picks a replica for req, skipping those in exclude (already tried)
// and, unless req.PoolWait, those whose connection pool is full.
func (r *Router) Route(req *Request, exclude []*backends.Replica) (Decision, error) {
	// Passed to a Policy, the candidates escape: their buffer is pooled
	// rather than allocated per request.
	bp := candPool.Get().(*[]*backends.Replica)
	cands, known := r.candidates((*bp)[:0], req.Model, req.Leg, exclude, req.PoolWait)
	defer func() {
		clear(cands) // keep no replica alive
		*bp = cands[:0]
		candPool.Put(bp)
	}()
	if !known {
		return Decision{}, ErrUnknownModel
	}
	if req.ResponseID != "" && req.Leg != backends.RolePrefill {
		// The replica holding a stored response answers: on the decode
		// side of a disaggregated fleet.
		if dec, ok, err := r.pinned(req.ResponseID, req.Model, exclude); ok {
			if err == nil {
				r.share(&dec, req)
			}
			return dec, err
		}
	}
	if len(cands) == 0 {
		return Decision{}, ErrNoReplica
	}
	policy := r.Policy()
	if req.Leg == backends.RoleDecode {
		if d, ok := policy.(DecodePicker); ok {
			return d.PickDecode(req, cands), nil
		}
		return r.routeDecode(req, cands), nil
	}
	dec := policy.Pick(req, cands)
	r.share(&dec, req)
	return dec, nil
}

// Held appends to dst, by replica ID, the prompt tokens of req's key each
// replica is believed to hold (0 for none), read from the Index; dst is
// returned as it was when req has no key or the policy keeps no Index.
// Flow control asks it of a queued request to wait for the replica that
// holds its prefix.
func (r *Router) Held(req *Request, dst []int32) []int32 {
	ix := r.Index()
	if ix == nil || len(req.Key) == 0 {
		return dst
	}
	v := ix.View(time.Now())
	mp := matchPool.Get().(*[]radix.Match)
	defer matchPool.Put(mp)
	*mp = v.Match((*mp)[:0], req.Key, false)
	for _, m := range *mp {
		id := int(m.Replica)
		for len(dst) <= id {
			dst = append(dst, 0)
		}
		dst[id] = max(dst[id], int32(min(m.Tokens, math.MaxInt32))) //nolint:gosec // bounded above
	}
	return dst
}

// matchPool holds the match buffers of Held.
var matchPool = sync.Pool{New: func() any { return new([]radix.Match) }}

// candPool holds the candidate buffers of Route.
var candPool = sync.Pool{New: func() any { return new([]*backends.Replica) }}

// Next picks a replica by weighted round-robin for a request that is not
// routed by prompt (any other path or method), skipping those in exclude
// and those whose connection pool is full.
func (r *Router) Next(exclude []*backends.Replica) (Decision, error) { return r.next(exclude, false) }

// next is Next; with poolWait, a replica whose pool is full is a candidate.
func (r *Router) next(exclude []*backends.Replica, poolWait bool) (Decision, error) {
	var buf [16]*backends.Replica
	cands, _ := r.candidates(buf[:0], "", "", exclude, poolWait)
	if len(cands) == 0 {
		return Decision{}, ErrNoReplica
	}
	return Decision{Replica: r.rr.pick(cands), Reason: "passthrough"}, nil
}

// Explain returns the decision the policy would give req now and, for
// policies that score, every candidate's score, while changing nothing
// (see Explainer): the next Route of req makes the same choice, but for
// ties broken at random and a cluster leader's say. It fails with
// ErrNoExplain for a policy that is no Explainer. A request referring to
// a stored response (ResponseID) is explained as the policy would place
// it, without looking the response up. The candidates are Route's.
func (r *Router) Explain(req *Request) (Decision, []Score, error) {
	ex, ok := r.Policy().(Explainer)
	if !ok {
		return Decision{}, nil, ErrNoExplain
	}
	var buf [16]*backends.Replica
	cands, known := r.candidates(buf[:0], req.Model, req.Leg, nil, req.PoolWait)
	if !known {
		return Decision{}, nil, ErrUnknownModel
	}
	if len(cands) == 0 && !req.PoolWait {
		// Every pool is full: the proxy would let one attempt wait, on
		// the replica the policy prefers among them.
		cands, _ = r.candidates(buf[:0], req.Model, req.Leg, nil, true)
	}
	if len(cands) == 0 {
		return Decision{}, nil, ErrNoReplica
	}
	d, s := ex.Explain(req, cands)
	return d, s, nil
}

// Room sorts the available replicas serving model on leg by full: it
// appends those full says are full to dst and returns them with one that
// has room, and true; nil, nil and true when no replica is available for
// the request at all (routing then answers why); dst and false when every
// one is full. Flow control asks it whether a request may go now, and
// keeps the request it lets go off the full ones.
func (r *Router) Room(dst []*backends.Replica, model string, leg backends.Role, full func(*backends.Replica) bool) (crowded []*backends.Replica, room *backends.Replica, ok bool) {
	bp := candPool.Get().(*[]*backends.Replica)
	cands, _ := r.candidates((*bp)[:0], model, leg, nil, true)
	defer func() {
		clear(cands)
		*bp = cands[:0]
		candPool.Put(bp)
	}()
	if len(cands) == 0 {
		return nil, nil, true
	}
	for _, c := range cands {
		if !full(c) {
			room = cmp.Or(room, c)
		} else {
			dst = append(dst, c)
		}
	}
	return dst, room, room != nil
}
