// Package router chooses a replica for each request. A Policy scores the
// available replicas; the Router applies what every policy shares: the model
// filter, the availability predicate, the exclusion of replicas already
// tried for this request and the holding back of backup replicas while a
// primary one is left.
package router

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/backends"
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

	keyBuf *[]uint32 // Key's pooled buffer, returned by Keyer.Release
}

// Decision is a policy's choice for one attempt.
type Decision struct {
	Replica *backends.Replica
	// Reason explains the choice (X-Kvroute-Route), e.g. "cache_hit matched=1536".
	Reason string
	// Matched is the number of prompt tokens the chosen replica is believed to hold.
	Matched int
	// Pinned: the replica holds the stored response the request refers to,
	// which no other replica has; the request is not retried elsewhere.
	Pinned bool
	// sessionUndo reverses the session binding the policy recorded for this
	// choice (cache_aware, session).
	sessionUndo func()
	// The tree entry cache_aware recorded, for Undo: key inserted for
	// replica id, of which held values were held before.
	tree *radix.Tree
	key  []uint32
	id   radix.ReplicaID
	held int
	// pending is the counter of prompt tokens not yet prefilled on the
	// replica, which prefill tokens of this choice joined until Started.
	pending *atomic.Int64
	prefill int64
}

// Undo reverses what the policy recorded for this choice. Call it when the
// attempt failed before any response byte reached the client. Safe to call
// on a zero Decision and more than once.
func (d *Decision) Undo() {
	d.Started()
	if d.tree != nil {
		d.tree.Undo(d.key, d.id, d.held)
		d.tree, d.key = nil, nil
	}
	if d.sessionUndo != nil {
		d.sessionUndo()
		d.sessionUndo = nil
	}
}

// Started tells the policy the replica began answering (its first response
// body byte, which engines send once the prompt is prefilled) or that the
// attempt ended. Safe to call on a zero Decision and more than once.
func (d *Decision) Started() {
	if d.pending != nil {
		d.pending.Add(-d.prefill)
		d.pending = nil
	}
}

// Policy picks one of cands, which is never empty and holds only available
// replicas serving the request's model, not yet tried for the request: the
// primary ones if there are any such, else the backups.
type Policy interface {
	Name() string
	Pick(req *Request, cands []*backends.Replica) Decision
}

// Errors a route can end in.
var (
	// ErrUnknownModel: no replica in the fleet serves the requested model.
	ErrUnknownModel = errors.New("no replica serves the requested model")
	// ErrNoReplica: replicas serve the model but none is available now.
	ErrNoReplica = errors.New("no replica is available")
)

// Fleet is the part of backends.Fleet the router needs.
type Fleet interface {
	Replicas() []*backends.Replica
}

// Router applies a Policy to the fleet's available replicas.
type Router struct {
	fleet  Fleet
	policy atomic.Pointer[policyBox]
	// responses maps stored response ids to their replicas; nil: none.
	responses atomic.Pointer[Responses]
	rr        wrr // round-robin state for requests not routed by prompt
}

type policyBox struct{ p Policy }

// New builds a Router over fleet with policy p.
func New(fleet Fleet, p Policy) *Router {
	r := &Router{fleet: fleet}
	r.SetPolicy(p)
	return r
}

// SetPolicy swaps the policy; requests in flight keep the old one.
func (r *Router) SetPolicy(p Policy) { r.policy.Store(&policyBox{p}) }

// Policy returns the current policy.
func (r *Router) Policy() Policy { return r.policy.Load().p }

// Available is the one availability predicate every policy shares: the
// replica is in service (not ejected).
func Available(rep *backends.Replica) bool { return rep.Healthy() }

func tried(rep *backends.Replica, exclude []*backends.Replica) bool {
	for _, t := range exclude {
		if t == rep {
			return true
		}
	}
	return false
}

// candidates appends to dst the available replicas serving model that are
// not in exclude: the primary ones, or when there is no such primary, the
// backups (as nginx's backup servers, which get requests only when every
// primary is down or already tried). known reports whether any replica at
// all serves model.
func (r *Router) candidates(dst []*backends.Replica, model string, exclude []*backends.Replica) (_ []*backends.Replica, known bool) {
	reps := r.fleet.Replicas()
	start, backups := len(dst), false
	for _, rep := range reps {
		if model != "" && !rep.Serves(model) {
			continue
		}
		known = true
		if Available(rep) && !tried(rep, exclude) {
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
		if rep.Backup() && (model == "" || rep.Serves(model)) && Available(rep) && !tried(rep, exclude) {
			dst = append(dst, rep)
		}
	}
	return dst, known
}

// Route picks a replica for req, skipping those in exclude (already tried).
func (r *Router) Route(req *Request, exclude []*backends.Replica) (Decision, error) {
	// Passed to a Policy, the candidates escape: their buffer is pooled
	// rather than allocated per request.
	bp := candPool.Get().(*[]*backends.Replica)
	cands, known := r.candidates((*bp)[:0], req.Model, exclude)
	defer func() {
		clear(cands) // keep no replica alive
		*bp = cands[:0]
		candPool.Put(bp)
	}()
	if !known {
		return Decision{}, ErrUnknownModel
	}
	if req.ResponseID != "" {
		if dec, ok, err := r.pinned(req.ResponseID, req.Model, exclude); ok {
			return dec, err
		}
	}
	if len(cands) == 0 {
		return Decision{}, ErrNoReplica
	}
	return r.Policy().Pick(req, cands), nil
}

// candPool holds the candidate buffers of Route.
var candPool = sync.Pool{New: func() any { return new([]*backends.Replica) }}

// Next picks a replica by weighted round-robin for a request that is not
// routed by prompt (any other path or method), skipping those in exclude.
func (r *Router) Next(exclude []*backends.Replica) (Decision, error) {
	var buf [16]*backends.Replica
	cands, _ := r.candidates(buf[:0], "", exclude)
	if len(cands) == 0 {
		return Decision{}, ErrNoReplica
	}
	return Decision{Replica: r.rr.pick(cands), Reason: "passthrough"}, nil
}

// Explainer is a policy that can show its scores without recording a choice.
type Explainer interface {
	Explain(req *Request, cands []*backends.Replica) (Decision, []Score)
}

// Explain returns the decision req would get now and, for policies that
// score, every candidate's score. Nothing is recorded.
func (r *Router) Explain(req *Request) (Decision, []Score, error) {
	var buf [16]*backends.Replica
	cands, known := r.candidates(buf[:0], req.Model, nil)
	if !known {
		return Decision{}, nil, ErrUnknownModel
	}
	if len(cands) == 0 {
		return Decision{}, nil, ErrNoReplica
	}
	if ex, ok := r.Policy().(Explainer); ok {
		d, s := ex.Explain(req, cands)
		return d, s, nil
	}
	d := r.Policy().Pick(req, cands)
	d.Undo()
	return d, nil, nil
}
