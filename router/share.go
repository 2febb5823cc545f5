package router

import (
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/backends"
)

// Sharer hears of what this router decides, to tell the other routers of a
// cluster. Its methods are called on the request path: they must return
// at once and must not keep key.
type Sharer interface {
	// Placed: a request was sent to rep. key is the routing key the Index
	// recorded for it (nil when the policy recorded none), exact its exact
	// key when it recorded that too (precise mode), uncached the prompt
	// tokens counted as pending prefill, ticket the cluster leader's ticket
	// when the leader chose rep (Coordinator), else 0. The result names
	// the placement in the lifecycle calls that follow.
	Placed(model string, key, exact []uint32, uncached int64, rep *backends.Replica, ticket uint64, now time.Time) uint64
	// Prefilled: rep sent the placement's first response byte.
	Prefilled(id uint64)
	// Finished: the placement's attempt ended (its in-flight slot went).
	Finished(id uint64)
	// Failed: the attempt failed before any response byte; the placement
	// is retracted.
	Failed(id uint64)
	// Trimmed: the engine reported only cached of the placement's prompt
	// tokens in its cache, and the Index was trimmed past them
	// (index.Placement.Trim).
	Trimmed(id uint64, cached int)
	// Settled: the engine's usage report put the placement's prefill work
	// at work tokens (its prompt less what it found cached), in place of
	// the uncached tokens Placed counted. Not called when the two agree.
	Settled(id uint64, work int64)
	// Bound: the session is bound to rep.
	Bound(session string, rep *backends.Replica, now time.Time)
	// Stored: rep stored the Responses-API response id.
	Stored(responseID string, rep *backends.Replica)
}

// sharerBox holds a Sharer for an atomic pointer.
type sharerBox struct{ s Sharer }

// SetSharer makes s hear of every decision from now on (nil: none). The
// stored response ids of the Responses table in force, and of any set
// later, are shared too.
func (r *Router) SetSharer(s Sharer) {
	if s == nil {
		r.sharer.Store(nil)
	} else {
		r.sharer.Store(&sharerBox{s})
	}
	r.Responses().setSharer(s)
}

// share readies dec, the decision for req, to be told to the Sharer, when
// there is one, once it is dispatched (Decision.Dispatched).
func (r *Router) share(dec *Decision, req *Request) {
	b := r.sharer.Load()
	if b == nil || dec.Replica == nil {
		return
	}
	dec.rec.share = shareRec{s: b.s, model: req.Model}
	if dec.rec.session != nil {
		dec.rec.share.session = req.Session
	}
}

// shareRec is a decision's placement as its Sharer knows it: what it was
// told so far, so that each call is made once. model and session may alias
// the request body: they are read at dispatch, while the request is
// handled.
type shareRec struct {
	s          Sharer
	model      string
	session    string // bound by the decision; "" when none
	id         uint64
	dispatched bool
	prefilled  bool
	failed     bool
}

func (s *shareRec) prefill() {
	if s.dispatched && !s.prefilled {
		s.prefilled = true
		s.s.Prefilled(s.id)
	}
}

func (s *shareRec) trim(cached int) {
	if s.dispatched {
		s.s.Trimmed(s.id, cached)
	}
}

func (s *shareRec) settle(work int64) {
	if s.dispatched {
		s.s.Settled(s.id, work)
	}
}

func (s *shareRec) fail() {
	if s.dispatched && !s.failed {
		s.failed = true
		s.s.Failed(s.id)
	}
}

// Dispatched tells the Sharer, when the decision has one, that the request
// was sent to its replica: the placement (with the key the Index recorded
// and the prompt tokens counted pending) and the session binding are
// shared now, never for an attempt that was not sent. It returns release
// (the replica's in-flight slot, as backends.Replica.Acquire returns it)
// made to also tell the Sharer when the attempt ends.
func (d *Decision) Dispatched(release func()) func() {
	s := &d.rec.share
	if s.s == nil || s.dispatched {
		return release
	}
	now := time.Now()
	s.id = s.s.Placed(s.model, d.rec.place.Key(), d.rec.exact.Key(), d.rec.pending.Tokens(), d.Replica, d.rec.ticket, now)
	s.dispatched = true
	if s.session != "" {
		s.s.Bound(s.session, d.Replica, now)
	}
	sharer, id := s.s, s.id
	var once atomic.Bool
	return func() {
		release()
		if once.CompareAndSwap(false, true) {
			sharer.Finished(id)
		}
	}
}
