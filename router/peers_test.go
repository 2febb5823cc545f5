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
// the requests all the routers may be placing at that moment: the cheapest
// replica, then whichever is cheapest with the places before counted.
func TestColdFillPlaces(t *testing.T) {
	tu := &CacheAwareConfig{} // λ = μ = 0: cost is pending prefill per weight
	scores := []Score{
		{Pending: 0, Weight: 1},
		{Pending: 1, Weight: 1},
		{Pending: 15000, Weight: 1},
		{Pending: 100000, Weight: 2},
	}
	all := func(int) bool { return true }
	for _, tc := range []struct {
		name   string
		tokens float64
		want   []int // the replica of each place
	}{
		// 0 (then at 10000), 1 (10001), 0 (20000), 1.
		{"10k-token requests", 10000, []int{0, 1, 0, 1}},
		// 0, 1, then 2 at 15000 before 0 and 1 at 20000.
		{"20k-token requests", 20000, []int{0, 1, 2, 0}},
	} {
		for pick, want := range tc.want {
			if got := leastCost(scores, all, tu, tc.tokens, pick); got != want {
				t.Errorf("%s: place %d on replica %d, want %d", tc.name, pick, got, want)
			}
		}
	}
	// Only eligible replicas take places.
	for pick := range 4 {
		if i := leastCost(scores, func(i int) bool { return i != 0 }, tu, 10000, pick); i == 0 {
			t.Fatal("an ineligible replica was chosen")
		}
	}
}

// The places a new branch of a shared prefix gets from several routers at
// once: the holder while its work, the places before included, stays within
// the balance, then the replica with the least work.
func TestBranchFillPlaces(t *testing.T) {
	tu := &CacheAwareConfig{BranchBalance: 1.25, Lambda: 2048, Nu: 0.1}
	scores := []Score{{Matched: 512, Weight: 1}, {Matched: 0, Weight: 1}}
	raw := func(i int) int { return scores[i].Matched }
	all := func(int) bool { return true }
	for _, tc := range []struct {
		pick   int
		want   int
		spread bool
	}{
		// Work 0.5 and 1.5, each request adds 1: the holder is within
		// 1.25 × the mean for two places (1.5 ≤ 1.875, 2.5 ≤ 2.5), not a
		// third (3.5 > 3.125).
		{0, 0, false}, {1, 0, false}, {2, 1, true},
	} {
		work := []float64{0.5, 1.5}
		i, spread := branchFill(scores, work, []float64{1, 1}, all, raw, 512, tu, tc.pick)
		if i != tc.want || spread != tc.spread {
			t.Errorf("place %d: replica %d (spread %v), want %d (spread %v)", tc.pick, i, spread, tc.want, tc.spread)
		}
	}
	if scores[0].Score != 0 || scores[0].Load != 0 {
		t.Errorf("the caller's scores changed: %+v", scores[0])
	}
}

// Of the holders within the balance, a new conversation whose own tokens
// are fewer than the prefix it shares goes to the one of least work after
// it, though another scores better this instant (its prompt still pending
// on the one of least work): its later turns follow it there. Of equal
// work, the better score decides; so it does for a conversation whose own
// tokens pass the prefix's.
func TestBranchPlaceWeighsWorkOverWaiting(t *testing.T) {
	tu := &CacheAwareConfig{BranchBalance: 1.25, Lambda: 2048, Nu: 0.1}
	all := func(int) bool { return true }
	for _, tc := range []struct {
		name   string
		prefix int
		own    float64
		work   []float64
		scores []float64
		want   int
	}{
		{"least work, worse score", 8000, 4000, []float64{20000, 16000, 20000}, []float64{8000, 6800, 7900}, 1},
		{"equal work, better score", 8000, 4000, []float64{16000, 16000, 20000}, []float64{7000, 7500, 8000}, 1},
		{"own tokens past the prefix", 512, 4000, []float64{20000, 16000, 20000}, []float64{500, 300, 400}, 0},
	} {
		scores := make([]Score, len(tc.scores))
		for i, s := range tc.scores {
			scores[i] = Score{Matched: tc.prefix, Weight: 1, Score: s}
		}
		raw := func(int) int { return tc.prefix }
		adds := []float64{tc.own, tc.own, tc.own}
		if i, spread := branchFill(scores, tc.work, adds, all, raw, tc.prefix, tu, 0); i != tc.want || spread {
			t.Errorf("%s: replica %d (spread %v), want %d", tc.name, i, spread, tc.want)
		}
	}
}
