package index

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/radix"
)

// testReplicas builds one never-started replica per cache capacity in
// tokens (0: unknown).
func testReplicas(t *testing.T, cacheTokens ...int64) []*backends.Replica {
	t.Helper()
	specs := make([]backends.Spec, 0, len(cacheTokens))
	for i, c := range cacheTokens {
		specs = append(specs, backends.Spec{Name: fmt.Sprintf("r%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 20100+i),
			Engine: backends.EngineVLLM, CacheTokens: c})
	}
	f, err := backends.NewFleet(specs, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return f.Replicas()
}

// seqKey is n key values starting from prefix, distinct from other
// prefixes'.
func seqKey(prefix uint32, n int) []uint32 {
	k := make([]uint32, n)
	for i := range k {
		k[i] = prefix<<20 | uint32(i) //nolint:gosec // small test sizes
	}
	return k
}

// held is what rep holds of key in its approximate share, read through a
// View at now.
func held(ix *Index, key []uint32, rep *backends.Replica, now time.Time) int {
	v := ix.View(now)
	for _, m := range v.Match(nil, key, false) {
		if int(m.Replica) == rep.ID() {
			return m.Tokens
		}
	}
	return 0
}

// A replica's exact share (what its engine reports) and its approximate
// share (the router's own keys) have their own budgets: however many
// approximate entries the router writes, the blocks the engine reported
// stay, and Occupancies weighs a precise replica's exact share against
// its capacity.
func TestExactShareKeepsItsOwnBudget(t *testing.T) {
	rep := testReplicas(t, 20_000)[0]
	ix := New(Options{KeyBlock: 1})
	ix.EngineWriter().SetPrecise(rep, true)
	now := time.Now()
	for i := range 10 {
		ix.EngineWriter().Place(seqKey(uint32(100+i), 1_900), true, rep, now.Add(time.Duration(i)*time.Millisecond))
	}
	for i := range 40 {
		ix.RouterWriter().Place(seqKey(uint32(200+i), 2_000), false, rep, now.Add(time.Second+time.Duration(i)*time.Millisecond))
	}
	st := ix.Stats()
	share := shareOf(20_000)
	if got := st.HeldExact[rep.ID()]; got != 19_000 {
		t.Errorf("exact share holds %d tokens after the router's approximate writes, want all 19000 the engine reported", got)
	}
	if got := st.Held[rep.ID()]; got > share || got < share*9/10 {
		t.Errorf("approximate share holds %d tokens, want %d–%d", got, share*9/10, share)
	}
	v := ix.View(now)
	occ, _ := v.Occupancies(nil, nil, []*backends.Replica{rep})
	if occ[0] != (radix.Occupancy{Held: 19_000, Budget: share}) {
		t.Errorf("precise replica's occupancy %+v, want the exact share's 19000 against %d", occ[0], share)
	}
	// The exact share is bounded too, at exactRoom times the capacity's
	// share, for events that report blocks stored and never removed.
	for i := range 40 {
		ix.EngineWriter().Place(seqKey(uint32(300+i), 2_000), true, rep, now.Add(2*time.Second+time.Duration(i)*time.Millisecond))
	}
	if got := ix.Stats().HeldExact[rep.ID()]; got > exactRoom*share || got < exactRoom*share*9/10 {
		t.Errorf("exact share holds %d tokens past its bound, want %d–%d", got, exactRoom*share*9/10, exactRoom*share)
	}
	ix.Forget(rep)
	if st := ix.Stats(); len(st.Held)+len(st.HeldExact) != 0 {
		t.Errorf("Forget left %v and %v", st.Held, st.HeldExact)
	}
}

// Work placed before the last update (a peer's, heard of late) counts as
// decayed to then; it does not move the time of the work counted back,
// which would decay that work twice.
func TestLateWorkDecays(t *testing.T) {
	rep := testReplicas(t, 0)[0]
	const half = time.Second
	ix := New(Options{TTL: half})
	t0 := time.Unix(1000, 0)
	w := ix.PeerWriter()
	w.AddWork(rep, 1000, t0)
	w.AddWork(rep, 1000, t0.Add(-half)) // one half-life late
	for _, tc := range []struct {
		at   time.Time
		want float64
	}{{t0, 1500}, {t0.Add(half), 750}} {
		v := ix.View(tc.at)
		if got := v.RecentWork(rep); math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("at %v: %v, want %v", tc.at.Sub(t0), got, tc.want)
		}
	}
}

// A decision's work is settled once, to its engine's count, or taken back;
// its pending prefill counts until prefilled.
func TestWorkAndPendingSettle(t *testing.T) {
	rep := testReplicas(t, 0)[0]
	ix := New(Options{TTL: time.Hour})
	w := ix.RouterWriter()
	now := time.Now()
	work := func() float64 { v := ix.View(now); return v.RecentWork(rep) }
	a, b := w.AddWork(rep, 1000, now), w.AddWork(rep, 500, now)
	if got := work(); math.Abs(got-1500) > 1e-6 {
		t.Fatalf("work %v, want 1500", got)
	}
	if tokens, changed := a.Settle(1200, 400); tokens != 800 || !changed {
		t.Errorf("Settle = %d, %v; want 800, true", tokens, changed)
	}
	a.Undo() // settled already
	b.Undo()
	if tokens, changed := b.Settle(1200, 0); tokens != 0 || changed {
		t.Errorf("Settle after Undo = %d, %v; want nothing", tokens, changed)
	}
	if got := work(); math.Abs(got-800) > 1e-6 {
		t.Errorf("work %v, want the settled 800", got)
	}
	p := w.AddPending(rep, 300)
	ix.PeerWriter().SetPeerPending(rep, 200)
	v := ix.View(now)
	if v.Pending(rep) != 500 || v.OwnPending(rep) != 300 || p.Tokens() != 300 {
		t.Errorf("pending %d, own %d, counted %d; want 500, 300, 300", v.Pending(rep), v.OwnPending(rep), p.Tokens())
	}
	p.Prefilled()
	p.Prefilled()
	if v.Pending(rep) != 200 || v.OwnPending(rep) != 0 {
		t.Errorf("prefilled: pending %d, own %d; want 200, 0", v.Pending(rep), v.OwnPending(rep))
	}
}

// A placement of a key whose owner moved on (its buffer reused) leaves the
// Index alone: no retract, trim or touch of what the buffer holds now.
func TestOwnedPlacementLeftOnceTheOwnerMovesOn(t *testing.T) {
	rep := testReplicas(t, 0)[0]
	ix := New(Options{KeyBlock: 16, TTL: time.Hour})
	var gen atomic.Uint64
	now := time.Now()
	key := seqKey(1, 64)
	p := ix.RouterWriter().PlaceOwned(key, &gen, false, rep, now)
	if got := held(ix, key, rep, now); got != 64*16 {
		t.Fatalf("held %d tokens, want %d", got, 64*16)
	}
	gen.Add(1)
	if p.Trim(0, now) || p.Touch(now) {
		t.Error("a placement whose owner moved on wrote the Index")
	}
	p.Retract()
	if got := held(ix, key, rep, now); got != 64*16 {
		t.Errorf("held %d tokens after the retract, want %d (kept)", got, 64*16)
	}
	q := ix.RouterWriter().PlaceOwned(seqKey(2, 8), &gen, false, rep, now)
	q.Retract()
	if got := held(ix, seqKey(2, 8), rep, now); got != 0 {
		t.Errorf("held %d tokens after retracting a live placement, want 0", got)
	}
	if w := ix.Writes(SourceRouter); w != 2 {
		t.Errorf("router writes %d, want 2", w)
	}
}

// A View counts only the entries used within the TTL as of its time, and
// the zero writer of every source writes nothing.
func TestViewCountsWithinTheTTL(t *testing.T) {
	rep := testReplicas(t, 0)[0]
	ix := New(Options{KeyBlock: 1, TTL: time.Minute})
	t0 := time.Unix(1000, 0)
	ix.PeerWriter().Place(seqKey(1, 10), false, rep, t0)
	if got := held(ix, seqKey(1, 10), rep, t0.Add(time.Minute)); got != 10 {
		t.Errorf("held %d a TTL later, want 10", got)
	}
	if got := held(ix, seqKey(1, 10), rep, t0.Add(time.Minute+time.Second)); got != 0 {
		t.Errorf("held %d past the TTL, want 0", got)
	}
	var (
		rw RouterWriter
		pw PeerWriter
		ew EngineWriter
	)
	if p := rw.Place(seqKey(2, 4), false, rep, t0); p.Key() != nil {
		t.Error("a zero RouterWriter placed")
	}
	pw.SetPeers(3)
	ew.EvictExact(seqKey(2, 4), rep, 0)
	if ix.Peers() != 0 || ix.Writes(SourcePeer) != 1 || ix.Writes(SourceEngine) != 0 {
		t.Errorf("peers %d, writes %v after the zero writers", ix.Peers(), ix.WritesBySource())
	}
}
