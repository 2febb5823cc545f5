package router

import "testing"

// A peer's request that just ended is heard of late: one request a peer
// reports in flight does not push an otherwise idle replica over the load
// bound (a conversation's next turn keeps its replica); two do.
func TestBoundToleratesOnePeerRequest(t *testing.T) {
	reps := testFleet(t, 4)
	p := testPolicy()
	key := seqKey(3, 1000)
	home := p.Pick(&Request{Key: key}, reps)
	home.Started()
	for _, tc := range []struct {
		peer     int64
		overflow bool
	}{{0, false}, {1, false}, {2, true}} {
		home.Replica.SetPeerInFlight(tc.peer)
		d := p.Pick(&Request{Key: key}, reps)
		if got := d.Replica != home.Replica; got != tc.overflow {
			t.Errorf("%d peer requests in flight: went to %s (%s), overflow %v, want %v", tc.peer, d.Replica.Name(), d.Reason, got, tc.overflow)
		}
		d.Undo()
	}
}

// With peers, a cold request takes one of the places one router would give
// the requests all the routers may be placing at that moment: on replicas
// whose costs differ, the two cheapest take turns and the costly ones are
// never chosen; without peers it is always the cheapest.
func TestColdFillSpreadsLikeOneRouter(t *testing.T) {
	tu := &CacheAwareTuning{} // λ = μ = 0: cost is pending prefill per weight
	scores := []Score{
		{Pending: 0, Weight: 1},
		{Pending: 1, Weight: 1},
		{Pending: 15000, Weight: 1},
		{Pending: 100000, Weight: 1},
	}
	all := func(int) bool { return true }
	for _, tc := range []struct {
		name string
		fill coldFill
		want []float64 // share of picks per replica
	}{
		{"alone", coldFill{routers: 1}, []float64{1, 0, 0, 0}},
		// Slots of four 10k-token requests: 0, 1, 0 (at 10000), 1 (at 10001).
		{"four routers", coldFill{routers: 4, tokens: 10000}, []float64{0.5, 0.5, 0, 0}},
		// Three 20k-token requests: 0, 1, then 2 (15000 < 20000).
		{"three routers", coldFill{routers: 3, tokens: 20000}, []float64{1.0 / 3, 1.0 / 3, 1.0 / 3, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const draws = 6000
			got := make([]float64, len(scores))
			for range draws {
				got[leastCost(scores, all, tu, tc.fill)]++
			}
			for i := range got {
				got[i] /= draws
				// 5 standard deviations of a share estimated from draws.
				if d := got[i] - tc.want[i]; d*d > 25*tc.want[i]*(1-tc.want[i])/draws+1e-12 {
					t.Errorf("replica %d chosen %.3f of the time, want %.3f (all: %.3f)", i, got[i], tc.want[i], got)
				}
			}
		})
	}
	// Only eligible replicas take places.
	for range 200 {
		if i := leastCost(scores, func(i int) bool { return i != 0 }, tu, coldFill{routers: 4, tokens: 10000}); i == 0 {
			t.Fatal("an ineligible replica was chosen")
		}
	}
}
