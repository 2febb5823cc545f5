package router

import (
	"cmp"
	"math/rand/v2"

	"github.com/kvroute/kvroute/backends"
)

// The picker: the candidate of best rank among those the filters leave,
// ties broken at random (ranked), by score for a cache hit (cmpWarm,
// cmpTurn, bestTurn), by cost for a request placed on load (leastCost,
// cheapest), which takes a place of the fill across routers (fill).

// tieDraw draws the tie-break of ranked: a uniform int in [0, n). Tests
// replace it to make ties deterministic.
var tieDraw = rand.IntN

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
		if tieDraw(r.ties) == 0 {
			r.best = i
		}
	}
}

// cmpLoad compares the load per unit of weight of a and b (-1, 0 or 1).
func cmpLoad(a, b Score) int {
	return cmp.Compare(float64(a.Load)*b.Weight, float64(b.Load)*a.Weight)
}

// cmpWarm ranks a before b (-1) when its score is higher, then when its
// load per unit of weight is lower.
func cmpWarm(a, b Score) int {
	if c := cmp.Compare(b.Score, a.Score); c != 0 {
		return c
	}
	return cmpLoad(a, b)
}

// cmpTurn is cmpWarm for a conversation's next turn, paying price (0–1) of
// the load prices in each score.
func cmpTurn(a, b Score, price float64) int {
	if price >= 1 {
		return cmpWarm(a, b)
	}
	// Score is m − cost; m − price·cost is m·(1−price) + price·Score.
	ta := float64(a.Matched)*(1-price) + price*a.Score
	tb := float64(b.Matched)*(1-price) + price*b.Score
	if c := cmp.Compare(tb, ta); c != 0 {
		return c
	}
	return cmpLoad(a, b)
}

// bestTurn returns the candidate keep leaves that ranks first by cmpTurn
// at price (0 when keep leaves none).
func bestTurn(scores []Score, keep mask, price float64) int {
	var r ranked
	for i := range scores {
		if keep[i] {
			r.offer(i, cmpTurn(scores[i], scores[r.best], price))
		}
	}
	return r.best
}

// leastCost returns the eligible index with the lowest coldCost, then the
// lowest load per unit of weight, then the lowest KV usage (the most free
// cache), then at random; with pick > 0, place pick (0 first) of those one
// router would give a request of tokens tokens from each router (see
// CacheAware.fill): each place taken adds one to that replica's queue and the
// prompt to its pending prefill.
func leastCost(scores []Score, eligible func(int) bool, t *CacheAwareConfig, tokens float64, pick int) int {
	if pick == 0 {
		return cheapest(scores, eligible, t, nil)
	}
	var stack [64]float64 // the costs of up to 64 candidates, not allocated
	costs := stack[:0]
	for _, s := range scores {
		costs = append(costs, coldCost(s, t))
	}
	for k := 0; ; k++ {
		i := cheapest(scores, eligible, t, costs)
		if k == pick {
			return i
		}
		costs[i] += (t.Lambda + coldPendingPrice*tokens) / scores[i].Weight
	}
}

// cheapest returns the eligible index with the lowest cost (coldCost, or
// costs[i] when costs is given), then the lowest load per unit of weight,
// then the lowest KV usage, then at random.
func cheapest(scores []Score, eligible func(int) bool, t *CacheAwareConfig, costs []float64) int {
	var r ranked
	var bestCost float64
	for i, s := range scores {
		if !eligible(i) {
			continue
		}
		var c float64
		if costs != nil {
			c = costs[i]
		} else {
			c = coldCost(s, t)
		}
		order := 0
		if r.ties > 0 {
			b := scores[r.best]
			if order = cmp.Compare(c, bestCost); order == 0 {
				if order = cmpLoad(s, b); order == 0 {
					order = cmp.Compare(s.KVUsage, b.KVUsage)
				}
			}
		}
		r.offer(i, order)
		if r.best == i {
			bestCost = c
		}
	}
	return r.best
}

// maxFillRouters bounds the routers fill assumes.
const maxFillRouters = 64

// fill says where a request placed on load goes while other routers place
// requests too: at index forced of cands when the cluster's leader chose
// one that eligible accepts (its ticket kept in sc for the placement), else
// at place pick (0 first) of those one router would give a request like it
// from each router. pick is 0 without peers, for the leader itself, and
// for a request the leader places for another router; with n peers and no
// answer from the leader it is one of the n+1 at random: the peers'
// decisions of the last moment are not known here yet (they arrive a
// batch interval later), and if every router sent its request to the
// replica it believes best, requests arriving together at several routers
// would all land on the same one. Taking a random place of such a fill,
// the routers together fill the fleet as one router would, in
// expectation. The leader is asked through the Coordinator in force
// (lead.go).
func (p *CacheAware) fill(req *Request, cands []*backends.Replica, sc *scoreScratch, eligible func(int) bool) (forced, pick int) {
	n := sc.view.Peers()
	if n == 0 || req.lead || sc.explain {
		return -1, 0
	}
	if c := p.coord.load(); c != nil {
		l := c.Coordinate(req.Model, req.Key, promptTokens(req, sc.view.KeyBlock()))
		if l.Self {
			return -1, 0
		}
		if l.Replica != "" {
			for i, c := range cands {
				if c.Name() == l.Replica && eligible(i) {
					sc.ticket = l.Ticket
					return i, 0
				}
			}
		}
	}
	return -1, rand.IntN(min(n+1, maxFillRouters))
}
