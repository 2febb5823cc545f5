package router

import (
	"fmt"
	"github.com/kvroute/kvroute/index"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/radix"
)

// repState is a replica's state for a scoring test: its weight, the
// requests in flight through the router, the prompt tokens pending
// prefill, and its metrics (nil: none scraped).
type repState struct {
	weight   float64
	inflight int
	pending  int64
	snap     *backends.Snapshot
	holds    bool // holds the test's prefix
}

// matches is what each replica holds of key in its exact share (exact) or
// its approximate one, read through a View: counting the entries used at
// or after since (zero: within the Index's TTL of now).
func matches(ix *index.Index, key []uint32, exact bool, since time.Time) []radix.Match {
	at := time.Now()
	if !since.IsZero() {
		at = since.Add(ix.TTL())
	}
	v := ix.View(at)
	return v.Match(nil, key, exact)
}

// pendingOf is rep's pending prefill, own and peers', in the Index.
func pendingOf(ix *index.Index, rep *backends.Replica) int64 {
	v := ix.View(time.Now())
	return v.Pending(rep)
}

// workOf is rep's recent prefill work in the Index at now.
func workOf(ix *index.Index, rep *backends.Replica, now time.Time) float64 {
	v := ix.View(now)
	return v.RecentWork(rep)
}

// stateFleet builds one replica per state, publishes each one's metrics,
// raises its in-flight count and pending prefill, and records the test
// prefix for the holders. The returned func releases the in-flight slots.
func stateFleet(t *testing.T, ix *index.Index, key []uint32, states []repState) []*backends.Replica {
	t.Helper()
	specs := make([]backends.Spec, 0, len(states))
	for i, s := range states {
		specs = append(specs, backends.Spec{Name: fmt.Sprintf("r%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 20000+i),
			Engine: backends.EngineVLLM, Weight: s.weight})
	}
	f, err := backends.NewFleet(specs, backends.Options{StaleAfter: time.Minute}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	reps := f.Replicas()
	now := time.Now()
	for i, s := range states {
		if s.snap != nil {
			snap := *s.snap
			if snap.At.IsZero() {
				snap.At = now
			}
			reps[i].Observe(snap)
		}
		for range s.inflight {
			t.Cleanup(reps[i].Acquire())
		}
		if s.pending > 0 {
			pp := ix.RouterWriter().AddPending(reps[i], s.pending)
			t.Cleanup(pp.Prefilled)
		}
		if s.holds {
			ix.RouterWriter().Place(key, false, reps[i], now)
		}
	}
	return reps
}

// TestScoreTerms checks each term of s(r) = m − (λ·q + ν·p)/w − μ·k, the
// load bound, ties and the cold path against the policy's own scores, with
// metrics injected.
func TestScoreTerms(t *testing.T) {
	const lambda, mu, nu = 100.0, 1000.0, 0.5
	key := seqKey(7, 1024) // 1024 tokens, whole 16-token blocks
	fresh := func(waiting, kv float64) *backends.Snapshot {
		return &backends.Snapshot{Waiting: waiting, KVUsage: kv}
	}
	stale := func(waiting, kv float64) *backends.Snapshot {
		return &backends.Snapshot{Waiting: waiting, KVUsage: kv, At: time.Now().Add(-time.Hour)}
	}
	tests := []struct {
		name   string
		eps    float64
		states []repState
		// want are the scores, by replica; pick is the replica chosen
		// (-1: either, at random, each at least once in 200 picks).
		want   []float64
		pick   int
		reason string
	}{
		{name: "queue from fresh metrics", eps: 1,
			states: []repState{{holds: true, snap: fresh(3, 0)}, {holds: true, snap: fresh(0, 0)}},
			want:   []float64{1024 - lambda*3, 1024}, pick: 1, reason: "cache_hit matched=1024"},
		{name: "queue adds in-flight sent since the scrape", eps: 1,
			states: []repState{{holds: true, snap: fresh(1, 0), inflight: 2}, {holds: true, snap: fresh(2, 0)}},
			want:   []float64{1024 - lambda*3, 1024 - lambda*2}, pick: 1, reason: "cache_hit matched=1024"},
		{name: "stale metrics: in-flight stands in, kv counts 0", eps: 1,
			states: []repState{{holds: true, snap: stale(50, 0.9), inflight: 1}, {holds: true, snap: fresh(0, 0.5)}},
			want:   []float64{1024 - lambda*1, 1024 - mu*0.5}, pick: 0, reason: "cache_hit matched=1024"},
		{name: "kv usage", eps: 1,
			states: []repState{{holds: true, snap: fresh(0, 0.9)}, {holds: true, snap: fresh(0, 0.2)}},
			want:   []float64{1024 - mu*0.9, 1024 - mu*0.2}, pick: 1, reason: "cache_hit matched=1024"},
		{name: "pending prefill", eps: 1,
			states: []repState{{holds: true, pending: 400}, {holds: true, pending: 100}},
			want:   []float64{1024 - nu*400, 1024 - nu*100}, pick: 1, reason: "cache_hit matched=1024"},
		{name: "weight scales queue and pending", eps: 1,
			states: []repState{{holds: true, weight: 4, snap: fresh(4, 0), pending: 400}, {holds: true, snap: fresh(2, 0)}},
			want:   []float64{1024 - (lambda*4+nu*400)/4, 1024 - lambda*2}, pick: 0, reason: "cache_hit matched=1024"},
		{name: "a match outweighs a queue", eps: 1,
			states: []repState{{holds: true, snap: fresh(2, 0)}, {snap: fresh(0, 0)}},
			want:   []float64{1024 - lambda*2, 0}, pick: 0, reason: "cache_hit matched=1024"},
		// ε 0, 24 in flight: the holder may carry ceil(25/2) = 13, and the
		// request would be its 25th, 12 past; its match pays for 10.24.
		{name: "load bound: the holder is past it by more than its match pays for, the prefix overflows", eps: 0,
			states: []repState{{holds: true, inflight: 24}, {}},
			want:   []float64{1024 - lambda*24, 0}, pick: 1, reason: "overflow matched=0"},
		// 3 in flight: the request would be its 4th, 2 past a bound of 2.
		{name: "load bound: a match that pays for the excess keeps the holder", eps: 0,
			states: []repState{{holds: true, inflight: 3}, {}},
			want:   []float64{1024 - lambda*3, 0}, pick: 0, reason: "cache_hit matched=1024"},
		{name: "ties break at random", eps: 1,
			states: []repState{{holds: true}, {holds: true}},
			want:   []float64{1024, 1024}, pick: -1, reason: "cache_hit matched=1024"},
		{name: "cold: least cost", eps: 1,
			states: []repState{{snap: fresh(1, 0)}, {snap: fresh(0, 0.05)}},
			want:   []float64{-lambda, -mu * 0.05}, pick: 1, reason: "cold least_load"},
		{name: "cold: equal cost, the most free cache", eps: 1,
			states: []repState{{snap: fresh(0, 0.1)}, {snap: fresh(1, 0)}},
			want:   []float64{-mu * 0.1, -lambda}, pick: 1, reason: "cold least_load"},
		{name: "cold: pending prefill at face value", eps: 1,
			// 150 pending costs 150 > 100 for one queued request (with ν
			// it would be 75 and r0 would win).
			states: []repState{{pending: 150}, {snap: fresh(1, 0)}},
			want:   []float64{-nu * 150, -lambda}, pick: 1, reason: "cold least_load"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := index.New(index.Options{TTL: time.Minute, BlockSize: 16})
			cs := &Configs{}
			mustSet(t, cs, CacheAwareName, &CacheAwareConfig{Lambda: lambda, Mu: mu, Nu: nu, Epsilon: tt.eps,
				MinMatchTokens: 256, TurnPrice: 1})
			pol, err := NewPolicy("cache_aware", Deps{Index: ix, Configs: cs})
			if err != nil {
				t.Fatal(err)
			}
			p := pol.(Explainer)
			probe := key
			if tt.reason == "cold least_load" {
				probe = seqKey(8, 1024) // nobody holds it
			}
			reps := stateFleet(t, ix, key, tt.states)
			req := &Request{Key: probe, Tokens: len(probe)}
			dec, scores := p.Explain(req, reps)
			for i, s := range scores {
				if math.Abs(s.Score-tt.want[i]) > 1e-9 {
					t.Errorf("%s: score %v, want %v (%+v)", s.Replica, s.Score, tt.want[i], s)
				}
			}
			if dec.Reason != tt.reason {
				t.Errorf("reason %q, want %q", dec.Reason, tt.reason)
			}
			if tt.pick >= 0 {
				if dec.Replica != reps[tt.pick] {
					t.Errorf("picked %s, want %s", dec.Replica.Name(), reps[tt.pick].Name())
				}
				return
			}
			seen := map[string]int{}
			for range 200 {
				d, _ := p.Explain(req, reps)
				seen[d.Replica.Name()]++
			}
			if len(seen) != len(reps) {
				t.Errorf("ties went to %v, want every replica", seen)
			}
		})
	}
}

// TestTuningChangesKeepTheIndex: a new configuration applies to the next decision
// and keeps every Index entry; each decision carries the longest match
// any candidate was believed to hold.
func TestTuningChangesKeepTheIndex(t *testing.T) {
	ix := index.New(index.Options{TTL: time.Minute, BlockSize: 16})
	cs := &Configs{}
	mustSet(t, cs, CacheAwareName, &CacheAwareConfig{Lambda: 1, Epsilon: 1, MinMatchTokens: 256, TurnPrice: 1})
	pol, err := NewPolicy("cache_aware", Deps{Index: ix, Configs: cs})
	if err != nil {
		t.Fatal(err)
	}
	key := seqKey(3, 512)
	reps := stateFleet(t, ix, key, []repState{{holds: true, inflight: 1}, {}})
	d := pol.Pick(&Request{Key: key}, reps)
	if d.Replica != reps[0] || d.Matched < 512 || d.Best != d.Matched {
		t.Fatalf("λ=1: picked %s (%s, best %d), want the holder, best its match", d.Replica.Name(), d.Reason, d.Best)
	}
	held := d.Matched
	// λ above the match: the holder's one request in flight now costs more
	// than its cache saves.
	mustSet(t, cs, CacheAwareName, &CacheAwareConfig{Lambda: 2048, Epsilon: 1, MinMatchTokens: 256, TurnPrice: 1})
	// The decision keeps what the holder was believed to hold: what the
	// choice gave up (Decision.Best), as Explain says too.
	if d := pol.Pick(&Request{Key: key}, reps); d.Replica != reps[1] || d.Reason != "overflow matched=0" || d.Best != held {
		t.Errorf("λ=2048: picked %s (%s, best %d), want r1 as an overflow, best %d", d.Replica.Name(), d.Reason, d.Best, held)
	}
	if d, _ := pol.(Explainer).Explain(&Request{Key: key}, reps); d.Best != held {
		t.Errorf("λ=2048: explained best %d, want %d", d.Best, held)
	}
	if held := ix.Stats().Held; held[0] < 512 {
		t.Errorf("the holder's entries after the tuning change: %d tokens, want ≥ 512", held[0])
	}
}

// TestPlacementAfterReleaseIsNotRetracted: once a request's key buffer is
// back in the pool, an Undo of its decision leaves the Index alone rather
// than retract whatever the reused buffer holds.
func TestPlacementAfterReleaseIsNotRetracted(t *testing.T) {
	ix := index.New(index.Options{})
	reps := stateFleet(t, ix, nil, []repState{{}})
	kb := new(keyBuffer)
	kb.vals = append(kb.vals, seqKey(5, 64)...)
	req := &Request{Key: kb.vals, keyBuf: kb}
	pl := ix.RouterWriter().PlaceOwned(req.Key, req.keyBuf.owner(), false, reps[0], time.Now())
	r := &Router{}
	r.Release(req)
	pl.Retract()
	if got := ix.Stats().Held[0]; got != 64 {
		t.Errorf("held after a retract past Release: %d tokens, want 64 (kept)", got)
	}
	pl2 := ix.RouterWriter().Place(seqKey(6, 32), false, reps[0], time.Now())
	pl2.Retract()
	if got := ix.Stats().Held[0]; got != 64 {
		t.Errorf("held after retracting a placement: %d tokens, want 64", got)
	}
	if w := ix.Writes(index.SourceRouter); w != 2 {
		t.Errorf("router writes %d, want 2", w)
	}
}

// The load bound: ceil(w·(1+ε)·(total+1)/W) requests in flight, the one
// being placed included; while the engine reports none waiting, at least
// w·floor.
func TestLoadBoundAndItsFloor(t *testing.T) {
	for _, tc := range []struct {
		name         string
		total, floor int
		load         int64
		w            float64
		batching, ok bool
	}{
		// 8 replicas of weight 1, 3 in flight: ceil(1.25·4/8) = 1.
		{"idle replica", 3, 0, 0, 1, false, true},
		{"one in flight, no floor", 3, 0, 1, 1, true, false},
		{"one in flight, floor, engine batching", 3, 8, 1, 1, true, true},
		{"one in flight, floor, engine queueing", 3, 8, 1, 1, false, false},
		{"floor reached", 3, 8, 8, 1, true, false},
		{"floor per unit of weight", 3, 8, 15, 2, true, true},
		// 40 in flight: ceil(1.25·41/8) = 7; the floor adds one.
		{"busy fleet, floor above the proportion", 40, 8, 7, 1, true, true},
		{"busy fleet, proportion above the floor", 40, 4, 6, 1, true, true},
		{"busy fleet, over both", 40, 4, 7, 1, true, false},
	} {
		b := loadBound{perWeight: 1.25 * float64(tc.total+1) / 8, floor: float64(tc.floor)}
		if got := b.within(tc.load, tc.w, tc.batching); got != tc.ok {
			t.Errorf("%s: within = %v, want %v", tc.name, got, tc.ok)
		}
	}
}

// TestTurnPrice: a conversation's next turn pays TurnPrice of the load
// prices against its match; whatever the price, the work cap still moves
// it off a busy holder carrying too much. The load bound alone does not.
func TestTurnPrice(t *testing.T) {
	const lambda = 100.0
	key := seqKey(9, 1024)
	queued := func(waiting float64) *backends.Snapshot { return &backends.Snapshot{Waiting: waiting} }
	tests := []struct {
		name   string
		price  float64
		eps    float64
		states []repState
		work   float64 // the holder's recent prefill work, tokens
		repeat bool    // the held prompt sent again whole, not a next turn
		holder bool    // the turn stays with its holder
	}{
		{name: "price 1: a long queue outprices the match", price: 1, eps: 1,
			states: []repState{{holds: true, snap: queued(20)}, {snap: queued(0)}}},
		{name: "price 0: the turn stays behind the queue", price: 0, eps: 1,
			states: []repState{{holds: true, snap: queued(20)}, {snap: queued(0)}}, holder: true},
		{name: "price 0.5: half the queue's price is below the match", price: 0.5, eps: 1,
			states: []repState{{holds: true, snap: queued(20)}, {snap: queued(0)}}, holder: true},
		{name: "price 0.5: a longer queue is not", price: 0.5, eps: 1,
			states: []repState{{holds: true, snap: queued(30)}, {snap: queued(0)}}},
		{name: "price 0: past the load bound, within the work cap", price: 0, eps: 0,
			states: []repState{{holds: true, inflight: 24}, {}}, holder: true},
		{name: "price 0: past the load bound and over the work cap", price: 0, eps: 0,
			states: []repState{{holds: true, inflight: 24}, {}}, work: 10000},
		{name: "price 0: a prompt sent again whole, past the load bound by more than its match pays for", price: 0, eps: 0,
			states: []repState{{holds: true, inflight: 24}, {}}, repeat: true},
		{name: "price 0: over the work cap, busy", price: 0, eps: 1,
			states: []repState{{holds: true, inflight: 2}, {}}, work: 10000},
		{name: "price 0: over the work cap, prefill pending", price: 0, eps: 1,
			states: []repState{{holds: true, pending: 500}, {}}, work: 10000},
		{name: "price 0: over the work cap only by its turns waiting for their prefill", price: 0, eps: 1,
			states: []repState{{holds: true, pending: 6000}, {}}, work: 10000, holder: true},
		{name: "price 0: over the work cap, idle (below the floor, nothing pending)", price: 0, eps: 1,
			states: []repState{{holds: true, inflight: 1}, {}}, work: 10000, holder: true},
		{name: "price 0: recent work within the cap", price: 0, eps: 1,
			states: []repState{{holds: true, inflight: 2}, {}}, work: 1000, holder: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ix := index.New(index.Options{TTL: time.Minute, BlockSize: 16})
			cs := &Configs{}
			mustSet(t, cs, CacheAwareName, &CacheAwareConfig{Lambda: lambda, Epsilon: tt.eps, MinMatchTokens: 256, BranchBalance: 1.25, BoundFloor: 2, TurnPrice: tt.price})
			pol, err := NewPolicy("cache_aware", Deps{Index: ix, Configs: cs})
			if err != nil {
				t.Fatal(err)
			}
			reps := stateFleet(t, ix, key, tt.states)
			if tt.work > 0 {
				ix.RouterWriter().AddWork(reps[0], int64(tt.work), time.Now())
			}
			// The next turn: the held prefix and 64 new tokens.
			turn := append(slices.Clone(key), seqKey(10, 64)...)
			if tt.repeat {
				turn = key
			}
			dec, _ := pol.(Explainer).Explain(&Request{Key: turn, Tokens: len(turn)}, reps)
			if got := dec.Replica == reps[0]; got != tt.holder {
				t.Errorf("went to %s (%s), want the holder: %v", dec.Replica.Name(), dec.Reason, tt.holder)
			}
			if !tt.holder && !strings.HasPrefix(dec.Reason, "overflow") {
				t.Errorf("reason %q, want an overflow", dec.Reason)
			}
		})
	}
}

// relaxBound keeps a candidate past the bound eligible only while its
// match, less the best match within the bound, pays for its excess at λ
// per request (per unit of weight); λ 0 leaves the bound as it is.
func TestRelaxBound(t *testing.T) {
	tests := []struct {
		name    string
		matched []int
		weight  []float64
		excess  []float64
		lambda  float64
		over    []bool // OverBound after
	}{
		{"nobody over", []int{4096, 0}, []float64{1, 1}, []float64{0, -3}, 1024, []bool{false, false}},
		{"pays exactly", []int{4096, 0}, []float64{1, 1}, []float64{4, -3}, 1024, []bool{false, false}},
		{"pays for less", []int{4096, 0}, []float64{1, 1}, []float64{5, -3}, 1024, []bool{true, false}},
		{"weight 2 pays twice", []int{4096, 0}, []float64{2, 1}, []float64{8, -3}, 1024, []bool{false, false}},
		{"only beyond the best within", []int{4096, 3072}, []float64{1, 1}, []float64{2, -3}, 1024, []bool{true, false}},
		{"a prefix all hold saves nothing", []int{4096, 4096}, []float64{1, 1}, []float64{1, 0}, 1024, []bool{true, false}},
		{"all over: the best within is none", []int{4096, 1024}, []float64{1, 1}, []float64{3, 2}, 1024, []bool{false, true}},
		{"λ 0: off", []int{1 << 20, 0}, []float64{1, 1}, []float64{1, -3}, 0, []bool{true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scores := make([]Score, len(tt.matched))
			for i := range scores {
				scores[i] = Score{Matched: tt.matched[i], Weight: tt.weight[i], OverBound: tt.excess[i] > 0, excess: tt.excess[i]}
			}
			relaxBound(scores, tt.lambda)
			for i, s := range scores {
				if s.OverBound != tt.over[i] {
					t.Errorf("candidate %d: over bound %v, want %v", i, s.OverBound, tt.over[i])
				}
			}
		})
	}
}
