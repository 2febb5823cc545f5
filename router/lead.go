package router

import (
	"sync/atomic"

	"github.com/kvroute/kvroute/backends"
)

// Coordinator lets one router of a cluster, its leader, choose the replica
// of every request the routers place on load (a cold request, a new branch
// of a shared prefix). Routers deciding at the same moment do not see each
// other's choices until a batch interval later; the leader sees its own
// at once, so the cluster places such requests as one router would.
type Coordinator interface {
	// Coordinate returns the leader's choice for a request of model whose
	// routing key is key and prompt tokens tokens. It is called on the
	// request path: it returns within its deadline, and must not keep key.
	Coordinate(model string, key []uint32, tokens int) Lead
}

// Lead is a Coordinator's answer.
type Lead struct {
	// Self: this router leads, and places as the one router.
	Self bool
	// Replica is the leader's choice, by name; "" when there is none (no
	// leader reachable within the deadline, or no peer at all).
	Replica string
	// Ticket names the leader's reservation of the choice, passed with the
	// placement (Sharer.Placed) so that the leader releases it.
	Ticket uint64
}

// coordBox holds a Coordinator for an atomic pointer.
type coordBox struct{ c Coordinator }

// coordSlot holds the Coordinator in force for the policies built from one
// Deps (Router.SetCoordinator); its zero value holds none.
type coordSlot struct{ p atomic.Pointer[coordBox] }

// set puts c in force (nil: none). A no-op on a nil coordSlot.
func (s *coordSlot) set(c Coordinator) {
	switch {
	case s == nil:
	case c == nil:
		s.p.Store(nil)
	default:
		s.p.Store(&coordBox{c})
	}
}

// load returns the Coordinator in force, or nil.
func (s *coordSlot) load() Coordinator {
	if s == nil {
		return nil
	}
	if b := s.p.Load(); b != nil {
		return b.c
	}
	return nil
}

// SetCoordinator makes c choose the replica of requests placed on load
// while peers share the fleet (nil: none; each router then takes a random
// place of the fill, see CacheAware.fill in picker.go), for the policies
// built from the Router's Deps (NewNamed, UsePolicy).
func (r *Router) SetCoordinator(c Coordinator) { r.deps.coord.set(c) }

// Reservation is a choice this router made as the cluster's leader for
// another router's request: recorded in the Index, the pending prefill and
// the recent work as if placed here, until Release (once that router's
// placement arrives, or when it never does).
type Reservation struct {
	Replica *backends.Replica
	dec     Decision
	done    atomic.Bool
}

// Reserve chooses, as the one router of the cluster, the replica of a
// request of model whose routing key is key (kept by the Reservation: the
// caller hands over its copy) and prompt tokens tokens, and records the
// choice until the Reservation's Release. Nothing is shared: the router
// that asked shares its placement itself.
func (r *Router) Reserve(model string, key []uint32, tokens int) (*Reservation, error) {
	// The request goes through the asking router's connection pools, not
	// this one's: a full pool here passes no replica over.
	var buf [16]*backends.Replica
	cands, known := r.candidates(buf[:0], model, backends.RolePrefill, nil, true)
	if !known {
		return nil, ErrUnknownModel
	}
	if len(cands) == 0 {
		return nil, ErrNoReplica
	}
	req := &Request{Model: model, Key: key, Tokens: tokens, lead: true}
	dec := r.Policy().Pick(req, cands)
	return &Reservation{Replica: dec.Replica, dec: dec}, nil
}

// Release takes back what Reserve recorded. Safe more than once.
func (s *Reservation) Release() {
	if s == nil || !s.done.CompareAndSwap(false, true) {
		return
	}
	s.dec.Undo()
}
