package router

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/index"
)

// A replica whose Index entries follow its engine's events is scored on
// the request's exact key; the others on the approximate key. The choice
// records the exact key too (what is in flight is in no event yet), and
// undoing it takes both back.
func TestPreciseReplicasScoreOnTheExactKey(t *testing.T) {
	reps := testFleet(t, 4)
	p := testPolicy()
	ix := p.Index()
	approx, exact := seqKey(1, 1000), seqKey(9, 1000)
	// r2's engine reported the whole exact key; r1 holds half the
	// approximate one.
	ix.EngineWriter().Place(exact, true, reps[2], time.Now())
	ix.RouterWriter().Place(approx[:500], false, reps[1], time.Now())
	req := &Request{Key: approx, Exact: exact}

	d := p.Pick(req, reps)
	if d.Replica != reps[1] || strings.Contains(d.Reason, "precise") {
		t.Fatalf("no replica precise yet: picked %s (%s), want r1 on the approximate key", d.Replica.Name(), d.Reason)
	}
	d.Undo()

	ix.EngineWriter().SetPrecise(reps[2], true)
	d = p.Pick(req, reps)
	if d.Replica != reps[2] || !strings.HasSuffix(d.Reason, " precise") || d.Matched != 992 {
		t.Fatalf("picked %s (%s, matched %d), want r2 on the exact key", d.Replica.Name(), d.Reason, d.Matched)
	}
	// r1, not precise, still matches on the approximate key; r2 holds the
	// exact key from the events, and the placement wrote it once more.
	// Router writes: r1's approximate key, the first pick's, then the
	// second pick's approximate and exact keys.
	if ix.Writes(index.SourceRouter) != 4 {
		t.Errorf("%d router writes, want 4", ix.Writes(index.SourceRouter))
	}
	if got := matches(ix, approx, false, time.Time{}); len(got) != 2 {
		t.Errorf("the approximate key has %d holders, want r1 and r2", len(got))
	}
	d.Undo()
	for _, m := range matches(ix, exact, true, time.Time{}) {
		if int(m.Replica) != reps[2].ID() {
			t.Errorf("exact key held by replica %d after the undo", m.Replica)
		}
	}
	_, scores := p.Explain(req, reps)
	for _, s := range scores {
		if want := s.Replica == "r2"; s.Precise != want {
			t.Errorf("%s precise %v, want %v", s.Replica, s.Precise, want)
		}
	}
	// With no exact key (the render failed) every replica is scored on the
	// approximate key.
	d2 := p.Pick(&Request{Key: approx}, reps)
	if strings.Contains(d2.Reason, "precise") {
		t.Errorf("a request without an exact key was scored precisely: %s", d2.Reason)
	}
}

// While other routers share the fleet, a cold request goes to any replica
// within one request's prefill of the cheapest, at random, so that
// requests arriving together at several routers do not all land on the
// one each believes least loaded; alone, a router takes the cheapest.
func TestColdSpreadWithPeers(t *testing.T) {
	reps := testFleet(t, 4)
	p := testPolicy()
	ix := p.Index()
	// r0 has a little pending prefill, r3 a lot: r0, r1, r2 are within a
	// request's prefill (1000 tokens) of the cheapest, r3 is not.
	ix.RouterWriter().AddPending(reps[0], 300)
	ix.RouterWriter().AddPending(reps[3], 5000)
	pick := func() map[string]int {
		got := map[string]int{}
		for i := 0; i < 200; i++ {
			d := p.Pick(&Request{Key: seqKey(uint32(100+i), 1000)}, reps)
			got[d.Replica.Name()]++
			d.Undo()
		}
		return got
	}
	if got := pick(); got["r0"]+got["r3"] != 0 {
		t.Errorf("alone: cold picks %v, want only r1 and r2, the cheapest", got)
	}
	ix.PeerWriter().SetPeers(2)
	got := pick()
	if got["r0"] == 0 || got["r1"] == 0 || got["r2"] == 0 || got["r3"] != 0 {
		t.Errorf("with peers: cold picks %v, want r0, r1 and r2, never r3", got)
	}
}

// The engine's events decide what a precise replica holds of an exact
// key: the feedback on a precise decision neither trims the exact entries
// nor writes back what the engine reported removed since; it only marks
// what is still held as used.
func TestFeedbackLeavesExactEntriesToTheEvents(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cached int // the engine's report
	}{
		{"below the prediction", 0},
		{"as predicted", 992},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reps := testFleet(t, 2)
			p := testPolicy()
			ix := p.Index()
			exact := seqKey(9, 1000)
			ix.EngineWriter().Place(exact, true, reps[1], time.Now())
			ix.EngineWriter().SetPrecise(reps[1], true)
			d := p.Pick(&Request{Key: seqKey(1, 1000), Exact: exact}, reps)
			if d.Replica != reps[1] || !d.Precise {
				t.Fatalf("picked %s (%s), want r1 precise", d.Replica.Name(), d.Reason)
			}
			// The engine evicted the key's second half meanwhile.
			ix.EngineWriter().EvictExact(exact, reps[1], 500)
			before := time.Now()
			// A count below the prediction trims the approximate entry
			// only.
			if trimmed := d.Feedback(1000, tc.cached); trimmed != (tc.cached == 0) {
				t.Errorf("Feedback reported trimmed %v", trimmed)
			}
			if got := ix.Stats().HeldExact[reps[1].ID()]; got != 500 {
				t.Errorf("after the feedback r1's exact share holds %d tokens, want the 500 its engine still holds", got)
			}
			// What is still held counts as used at the feedback.
			if m := matches(ix, exact, true, before); len(m) != 1 || m[0].Tokens != 500 {
				t.Errorf("exact matches used since the feedback: %v, want r1's 500", m)
			}
		})
	}
}

// uncachedOn counts a candidate's uncached tokens in the tokens it was
// matched in: the engine's count where it matched on the exact key and
// that count is known, else the approximate key's.
func TestUncachedOnCountsInTheMatchesTokens(t *testing.T) {
	for _, tc := range []struct {
		name    string
		exact   int // Request.ExactTokens
		precise bool
		matched int
		want    int
	}{
		{"approximate match", 1200, false, 900, 100}, // the approximate prompt: 1000
		{"exact match, engine count known", 1200, true, 900, 300},
		{"exact match, a prefix only (count unknown)", 0, true, 900, 100},
		{"matched past the prompt", 0, false, 1100, 0},
	} {
		req := &Request{ExactTokens: tc.exact}
		if got := uncachedOn(req, 1000, &Score{Precise: tc.precise, Matched: tc.matched}); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
