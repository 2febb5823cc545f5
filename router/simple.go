package router

import (
	"math/rand/v2"
	"sync/atomic"

	"github.com/kvroute/kvroute/backends"
)

// RoundRobin cycles through the candidates in order, like nginx's default.
type RoundRobin struct{ next atomic.Uint64 }

var _ Policy = (*RoundRobin)(nil)

// Name implements Policy.
func (*RoundRobin) Name() string { return "round_robin" }

// Pick implements Policy.
func (p *RoundRobin) Pick(_ *Request, cands []*backends.Replica) Decision {
	rep := cands[int(p.next.Add(1)-1)%len(cands)]
	return Decision{Replica: rep, Reason: "round_robin"}
}

// LeastLoad picks the candidate with the fewest requests in flight through
// this router, ties broken at random.
type LeastLoad struct{}

var _ Policy = LeastLoad{}

// Name implements Policy.
func (LeastLoad) Name() string { return "least_load" }

// Pick implements Policy.
func (LeastLoad) Pick(_ *Request, cands []*backends.Replica) Decision {
	return Decision{Replica: leastInFlight(cands), Reason: "least_load"}
}

// leastInFlight returns the candidate with the fewest in-flight requests,
// choosing uniformly at random among ties (reservoir sampling, no allocation).
func leastInFlight(cands []*backends.Replica) *backends.Replica {
	var best *backends.Replica
	var bestLoad int64
	ties := 0
	for _, c := range cands {
		l := c.InFlight()
		switch {
		case best == nil || l < bestLoad:
			best, bestLoad, ties = c, l, 1
		case l == bestLoad:
			ties++
			if rand.IntN(ties) == 0 {
				best = c
			}
		}
	}
	return best
}
