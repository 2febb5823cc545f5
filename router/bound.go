package router

import (
	"math"

	"github.com/kvroute/kvroute/backends"
)

// The load-bound filter: a candidate past the bound on load (loadBound) is
// passed over unless its match pays for what it carries past it
// (relaxBound), or every candidate is past it.

// mask is one flag per candidate, as a filter leaves them: false passes
// the candidate over.
type mask []bool

// has reports whether m keeps candidate i.
func (m mask) has(i int) bool { return m[i] }

// all resizes m to n candidates, every one kept.
func (m mask) all(n int) mask {
	m = m[:0]
	for range n {
		m = append(m, true)
	}
	return m
}

// boundFilter is the load-bound filter. It clears the OverBound of each
// candidate whose match pays for its excess (relaxBound, at λ lambda) and
// returns in keep (resized) the candidates within the bound, or every
// candidate when none is (allOver).
func boundFilter(scores []Score, lambda float64, keep mask) (_ mask, allOver bool) {
	relaxBound(scores, lambda)
	allOver = true
	for _, s := range scores {
		if !s.OverBound {
			allOver = false
			break
		}
	}
	keep = keep[:0]
	for _, s := range scores {
		keep = append(keep, allOver || !s.OverBound)
	}
	return keep, allOver
}

// loadBound is the bound on load that no session and no ordinary cache
// hit may break (relaxBound names the exception): a replica of weight w
// may carry at most ceil(w·(1+ε)·(total+1)/W)
// requests in flight, the request being placed included, where total is
// the candidates' in-flight requests and W their total weight; with equal
// weights that is ceil((1+ε)·(total+1)/n), and a weight-2 replica may carry
// twice what a weight-1 replica may. A replica whose engine reported no
// request waiting at its last fresh scrape may carry w·floor if that is
// more: at light load the proportion would pass it over for one request
// while it batches all it has.
type loadBound struct{ perWeight, floor float64 }

// newLoadBound computes the bound over cands with slack eps and floor.
func newLoadBound(cands []*backends.Replica, eps float64, floor int) loadBound {
	var total int64
	var weight float64
	for _, c := range cands {
		total += c.Load()
		weight += c.Weight()
	}
	return loadBound{perWeight: (1 + eps) * float64(total+1) / weight, floor: float64(floor)}
}

// boundLoad is the load the bound and the queue estimate judge r by: its
// fleet-wide requests in flight (backends.Replica.Load), less one of its
// peers' when they report any. A peer's request that just ended is heard
// of a batch interval and a hop late; at low load that one request would
// otherwise push the replica over the bound, or price its queue above a
// cached prefix, and a conversation's next turn off its replica.
func boundLoad(r *backends.Replica) int64 {
	return r.Load() - min(r.PeerInFlight(), 1)
}

// within reports whether one more request on a replica carrying load
// requests, of weight w, stays within the bound; batching: the floor
// applies (replicaState).
func (b loadBound) within(load int64, w float64, batching bool) bool {
	return b.excess(load, w, batching) <= 0
}

// excess is how many requests one more on a replica carrying load
// requests, of weight w, would put it past the bound (0 or less: within).
func (b loadBound) excess(load int64, w float64, batching bool) float64 {
	limit := math.Ceil(b.perWeight * w)
	if batching {
		limit = max(limit, b.floor*w)
	}
	return float64(load+1) - limit
}

// relaxBound keeps eligible a candidate past the load bound whose cached
// prefix saves enough to pay for the requests it carries past it, at the
// score's own price of a queued request (λ tokens of match, per unit of
// weight): what it saves is its match less the best match among the
// candidates within the bound, where the request would otherwise go. A
// conversation whose history runs to tens of thousands of tokens keeps
// its replica a few requests past the bound rather than computing it all
// again elsewhere; a prefix every replica holds (a shared system prompt)
// saves nothing and the bound stands. Off with λ 0.
func relaxBound(scores []Score, lambda float64) {
	if lambda <= 0 {
		return
	}
	alt, over := 0, false
	for i := range scores {
		if scores[i].OverBound {
			over = true
		} else {
			alt = max(alt, scores[i].Matched)
		}
	}
	if !over {
		return
	}
	for i := range scores {
		s := &scores[i]
		if s.OverBound && float64(s.Matched-alt)*s.Weight/lambda >= s.excess {
			s.OverBound = false
		}
	}
}
