package router

import (
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
)

// Policy picks one of cands, which is never empty and holds only available
// replicas serving the request's model, not yet tried for the request: the
// primary ones if there are any such, else the backups. A policy is built
// from the registry (registry.go) and may implement the optional
// capabilities below.
type Policy interface {
	Name() string
	Pick(req *Request, cands []*backends.Replica) Decision
}

// Explainer is a policy that can tell the choice Pick would make now, and
// for a policy that scores, every candidate's score, while writing nothing:
// no rotation advanced, no Index entry placed or touched, no session bound,
// looked up into a change or counted, no pending prefill or work counted, no
// cluster leader asked (Router.Explain, /debug/route). The Decision records
// nothing, so its Undo does nothing. Every built-in policy is one; Explain
// refuses a policy that is not (ErrNoExplain).
type Explainer interface {
	Policy
	Explain(req *Request, cands []*backends.Replica) (Decision, []Score)
}

// KeyUser is a policy that routes by the request's routing key: the Router
// tokenizes a prompt only when the policy in force is one and UsesKey says
// so.
type KeyUser interface {
	Policy
	UsesKey() bool
}

// Forgetter is a policy with per-replica state of its own (beyond the
// Index and the session table, which the Router clears itself) to drop
// when a replica leaves the fleet.
type Forgetter interface {
	Policy
	Forget(rep *backends.Replica)
}

// DecodePicker is a policy that picks the decode side of a disaggregated
// request itself; for any other the Router picks it by load, keeping a
// session where it decoded last (routeDecode).
type DecodePicker interface {
	Policy
	PickDecode(req *Request, cands []*backends.Replica) Decision
}

// IndexUser is a policy that routes on an Index and records its choices in
// it.
type IndexUser interface {
	Policy
	Index() *index.Index
}

// The capabilities of the built-in policies.
var (
	_ Explainer    = (*CacheAware)(nil)
	_ KeyUser      = (*CacheAware)(nil)
	_ IndexUser    = (*CacheAware)(nil)
	_ Explainer    = (*SessionPolicy)(nil)
	_ Explainer    = (*RoundRobin)(nil)
	_ Forgetter    = (*RoundRobin)(nil)
	_ DecodePicker = (*RoundRobin)(nil)
	_ Explainer    = LeastLoad{}
)

// Decision is a policy's choice for one attempt.
type Decision struct {
	Replica *backends.Replica
	// Reason explains the choice (X-Kvroute-Route), e.g. "cache_hit matched=1536".
	Reason string
	// Matched is the number of prompt tokens the chosen replica is believed to hold.
	Matched int
	// Best is the most prompt tokens any candidate was believed to hold
	// (at least Matched for a policy that matches; 0 for one that keeps
	// no Index): Best − Matched is what the choice gave up for load.
	Best int
	// Precise: Matched was found on the engine's own tokens, over a replica
	// whose KV events are followed (precise mode), not on the approximate key.
	Precise bool
	// Pinned: the replica holds the stored response the request refers to,
	// which no other replica has; the request is not retried elsewhere.
	Pinned bool
	// Local: a decode replica was chosen to compute the prompt itself,
	// since it holds all of it but Request.LocalPrefill tokens; the
	// request goes to it whole, without a prefill leg.
	Local bool

	rec record
}

// record is what a policy wrote for a decision in the components it shares
// (the Index, the session table), kept so that Undo and Started can take it
// back without a closure per decision.
type record struct {
	place   index.Placement      // the Index entry recorded
	exact   index.Placement      // the entry of the exact key (precise mode), if any
	pending index.PendingPrefill // the prompt tokens counted as pending prefill
	session func()               // reverses the session binding, or nil
	share   shareRec             // the placement as the Sharer knows it
	ticket  uint64               // the cluster leader's ticket for the choice, or 0
	work    index.Work           // the prefill work counted for the choice
}

// Undo reverses what the policy recorded for this choice, the prefill work
// it counted on the replica included. Call it when the attempt failed
// before any response byte reached the client. Safe to call on a zero
// Decision and more than once.
func (d *Decision) Undo() {
	d.rec.pending.Prefilled()
	d.rec.work.Undo()
	d.rec.share.fail()
	d.rec.place.Retract()
	d.rec.exact.Retract()
	if d.rec.session != nil {
		d.rec.session()
		d.rec.session = nil
	}
}

// Feedback takes the engine's counts of the prompt's tokens (prompt, 0
// when not reported) and of those it found cached
// (usage.prompt_tokens_details.cached_tokens) once the replica answered.
// The prefill work the decision counted on the replica becomes prompt less
// cached (the first report only). A count clearly below Matched means the
// engine evicted part of what the Index believed it held: the Index is
// trimmed past the count (index.Placement.Trim). Clearly: by more than feedbackSlack of the prediction
// and one engine block, since the router's tokens only approximate the
// engine's. Otherwise the prompt is recorded as used now
// (index.Placement.Touch): its engine held its blocks until the answer ended and
// then freed them as its most recently used, so a long request placed
// before others outlives them in the Index as in the engine's cache. It
// reports whether the Index was trimmed. The Sharer hears of both, of the
// work only where it differs from the prediction.
func (d *Decision) Feedback(prompt, cached int) bool {
	if work, ok := d.rec.work.Settle(prompt, cached); ok {
		d.rec.share.settle(work)
	}
	now := time.Now()
	if cached >= d.Matched-max(d.Matched/feedbackSlack, feedbackMinTokens) {
		d.rec.place.Touch(now)
		d.rec.exact.Touch(now)
		return false
	}
	trimmed := d.rec.place.Trim(cached, now)
	if d.rec.exact.Trim(cached, now) {
		trimmed = true
	}
	if !trimmed {
		return false
	}
	d.rec.share.trim(cached)
	return true
}

// A reported cached count is taken as an eviction when it is more than
// 1/feedbackSlack of the prediction, and at least feedbackMinTokens, below
// it: the router's tokenizer and the engine's differ by a few percent.
const (
	feedbackSlack     = 16
	feedbackMinTokens = 16
)

// Started tells the policy the replica began answering (its first response
// body byte, which engines send once the prompt is prefilled) or that the
// attempt ended. Safe to call on a zero Decision and more than once.
func (d *Decision) Started() {
	d.rec.pending.Prefilled()
	d.rec.share.prefill()
}
