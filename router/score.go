package router

import (
	"cmp"
	"math"
	"math/rand/v2"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/radix"
)

// Score is one candidate's breakdown, for /debug/route and tests.
type Score struct {
	Replica   string  `json:"replica"`
	Matched   int     `json:"matched_tokens"`  // whole blocks the replica is believed to hold
	Queue     float64 `json:"queue"`           // waiting requests plus unseen in-flight
	KVUsage   float64 `json:"kv_usage"`        // 0–1
	Load      int64   `json:"load"`            // requests in flight through this router
	Weight    float64 `json:"weight"`          // relative capacity w (backends[].weight)
	Pending   int64   `json:"pending_prefill"` // prompt tokens sent and not yet prefilled
	OverBound bool    `json:"over_bound"`      // load above its weight's share of (1+ε)·total, its match not paying for it (loadBound, relaxBound)
	Evicts    int64   `json:"evicts_tokens"`   // cached tokens this placement would push out of the replica's share of the Index
	Score     float64 `json:"score"`           // m − (λ·q + ν·pending)/w − μ·k
	Precise   bool    `json:"precise"`         // matched on the exact key (the replica's engine events)

	excess float64 // requests past the load bound (loadBound.excess; 0 or less: within)
}

type scoreScratch struct {
	matches  []radix.Match
	byID     []int32   // raw match in tokens by replica ID
	heldMost int       // the longest of them over the candidates
	exact    []int32   // the same on the exact key, for precise replicas
	branches []int32   // branch counts by replica ID (branch.go)
	work     []float64 // recent prefill work by candidate, per unit of weight (branch.go)
	adds     []float64 // what the request would add to it
	capped   []bool    // the candidates workCap leaves (branch.go)
	occ      []radix.Occupancy
	ids      []radix.ReplicaID
	scores   []Score
	// explain: the scores are only shown (Explain), no leader is asked.
	explain bool
	// ticket is the cluster leader's ticket for the choice it made, 0
	// when it made none (CacheAware.fill).
	ticket uint64
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

// cmpLoad compares the load per unit of weight of a and b (-1, 0 or 1).
func cmpLoad(a, b Score) int {
	return cmp.Compare(float64(a.Load)*b.Weight, float64(b.Load)*a.Weight)
}

// ranked is the running result of a scan for the best candidate: the best
// index so far and how many candidates rank equal with it. Ties are broken
// uniformly at random (reservoir sampling, no allocation). The zero value
// has seen no candidate.
type ranked struct{ best, ties int }

// offer considers candidate i, where c is how it compares with the best so
// far (c < 0: i ranks first); c is ignored for the first candidate offered.
func (r *ranked) offer(i, c int) {
	switch {
	case r.ties == 0 || c < 0:
		r.best, r.ties = i, 1
	case c == 0:
		r.ties++
		if rand.IntN(r.ties) == 0 {
			r.best = i
		}
	}
}
