package sim

import "sync/atomic"

// arrivals lets the replicas of a fleet see, as a request arrives, how much
// of its prompt each of them holds: what a router that knew every cache
// could have found for it (Stats.ArrivalHeldTokens, ArrivalBestTokens).
type arrivals struct {
	reps atomic.Pointer[[]*Replica]
}

// add makes reps part of the fleet a observes. Call it before they serve.
func (a *arrivals) add(reps ...*Replica) {
	var next []*Replica
	if cur := a.reps.Load(); cur != nil {
		next = append(next, *cur...)
	}
	next = append(next, reps...)
	a.reps.Store(&next)
	for _, r := range reps {
		r.fleet = a
	}
}

// observe returns how many tokens of q's prompt self holds and the most any
// replica of the fleet holds, each replica's cache looked up under its own
// lock, one at a time (self's lock not held).
func (a *arrivals) observe(self *Replica, q *request) (held, best int) {
	reps := a.reps.Load()
	if reps == nil {
		return 0, 0
	}
	for _, r := range *reps {
		r.mu.Lock()
		n := r.heldRun(q)
		r.mu.Unlock()
		if r == self {
			held = n
		}
		best = max(best, n)
	}
	return held, best
}

// heldRun is how many tokens of q's prompt r would find cached were q
// admitted now: the leading run of its whole blocks in the GPU cache,
// continued in the host tier, short of its last token, as admission counts
// them. r.mu must be held.
func (r *Replica) heldRun(q *request) int {
	bs := r.cfg.BlockSize
	limit := q.maxHit(bs)
	n := r.cache.run(q.keys[:limit])
	if r.host != nil {
		n += r.host.run(q.keys[n:limit])
	}
	return n * bs
}
