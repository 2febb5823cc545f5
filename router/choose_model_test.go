package router

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/backends"
)

// The naive model: CacheAware.choose, its branch rule and its work cap as
// one imperative function each, as they were before choose was composed of
// stages (bound.go, workcap.go, picker.go). score applied relaxBound then;
// the model's caller does. The helpers both share (fill, leastCost,
// branchFill, cmpTurn, busy, extends, fillEvicts) have their own tests.

func refChoose(p *CacheAware, req *Request, cands []*backends.Replica, sc *scoreScratch, best int, t *CacheAwareConfig, now time.Time) (int, string) {
	scores := sc.scores
	allOver := true
	for _, s := range scores {
		if !s.OverBound {
			allOver = false
			break
		}
	}
	eligible := func(i int) bool { return allOver || !scores[i].OverBound }

	if best == 0 || best < t.MinMatchTokens && 2*best < promptTokens(req, sc.view.KeyBlock()) {
		// Cold: the session's replica if it has one within bound, else the
		// least loaded replica with the most free cache.
		if p.sessions != nil && req.Session != "" {
			if rep := p.sessions.Lookup(req.Session, now); rep != nil {
				for i, c := range cands {
					if c == rep && eligible(i) {
						return i, SessionName
					}
				}
			}
		}
		fillEvicts(req, cands, sc)
		refWorkCap(req, cands, sc, eligible, t, false)
		capped := func(i int) bool { return sc.capped[i] }
		forced, pick := p.fill(req, cands, sc, capped)
		if forced >= 0 {
			return forced, "cold least_load"
		}
		return leastCost(scores, capped, t, float64(promptTokens(req, sc.view.KeyBlock())), pick), "cold least_load"
	}

	if i, reason, ok := refBranch(p, req, cands, sc, eligible, t); ok {
		return i, reason
	}
	// A conversation's next turn has no twin at another router, so the
	// best replica takes it (no fill), ranked by its match less TurnPrice
	// of the load prices, among those the work cap leaves of the busy ones.
	// Under load a turn moved to a shorter queue computes its history
	// again, work the whole fleet then waits behind; with TurnPrice 0 it
	// moves only when its holder, busy, carries far more recent prefill
	// work than the mean, not counting the turns still waiting for their
	// prefill there (workCap), which is how the finite-cache bound places
	// it too. The load bound does not move it: a replica's requests in flight
	// swing with its conversations' turns arriving together, and a turn
	// sent off for one request past the bound computes its history
	// elsewhere, where the next turns of the same wave then find that
	// replica past the bound in turn (docs/sweep.md). A request whose
	// whole key is held (a prompt sent again as it was) is no next turn:
	// the bound stands for it, so a prompt many clients repeat is
	// replicated once its holder is past the bound by more than its
	// match pays for (relaxBound). With the work cap off (BranchBalance
	// 0) the bound stands for every request: nothing else would move a
	// turn, nor tell a new branch from one. An idle holder keeps the turn
	// whatever its work: at light load its cached history beats any
	// balance.
	//
	// Busy (CacheAware.busy): prefill of this router's requests pending,
	// or BoundFloor requests in flight per unit of weight.
	if t.BranchBalance > 0 && extends(req, sc) {
		allOver = false
		eligible = func(int) bool { return true }
	}
	floor := float64(t.BoundFloor)
	capping := false
	for i := range scores {
		if eligible(i) && busy(&sc.view, cands[i], scores[i], floor) {
			// The work cap matters only to a busy candidate.
			refWorkCap(req, cands, sc, eligible, t, true)
			capping = true
			break
		}
	}
	var r ranked
	for i := range scores {
		if !eligible(i) || capping && !sc.capped[i] && busy(&sc.view, cands[i], scores[i], floor) {
			continue
		}
		r.offer(i, cmpTurn(scores[i], scores[r.best], t.TurnPrice))
	}
	bi := r.best
	// Was the best holder passed over because of its load? Then this is an
	// overflow: the prefix gains a second holder.
	if !allOver && scores[bi].Matched < best {
		return bi, "overflow matched=" + strconv.Itoa(scores[bi].Matched)
	}
	if scores[bi].Matched == 0 {
		return bi, "least_cost matched=0"
	}
	return bi, "cache_hit matched=" + strconv.Itoa(scores[bi].Matched)
}

func refBranch(p *CacheAware, req *Request, cands []*backends.Replica, sc *scoreScratch, eligible func(int) bool, t *CacheAwareConfig) (int, string, bool) {
	if t.BranchBalance <= 0 {
		return 0, "", false
	}
	raw := func(i int) int { return int(sc.byID[cands[i].ID()]) }
	bestRaw := sc.heldMost
	depth := bestRaw / sc.view.KeyBlock()
	if depth == 0 || depth >= len(req.Key) {
		return 0, "", false // nothing held, or nothing past it: no new branch
	}
	var n int
	sc.branches, n = sc.view.Branches(sc.branches[:0], req.Key, depth)
	if n == 0 {
		return 0, "", false // no other continuation: a conversation going on
	}
	fillEvicts(req, cands, sc)
	refWorkCap(req, cands, sc, eligible, t, false)
	capped := func(i int) bool { return sc.capped[i] }
	scores := sc.scores
	var i int
	var spread bool
	if forced, pick := p.fill(req, cands, sc, capped); forced >= 0 {
		i, spread = forced, raw(forced) < bestRaw
	} else {
		i, spread = branchFill(scores, sc.work, sc.adds, capped, raw, bestRaw, t, pick)
	}
	if spread {
		return i, "spread matched=" + strconv.Itoa(scores[i].Matched), true
	}
	return i, "cache_hit matched=" + strconv.Itoa(scores[i].Matched), true
}
func refWorkCap(req *Request, cands []*backends.Replica, sc *scoreScratch, eligible func(int) bool, t *CacheAwareConfig, turn bool) {
	sc.capped = sc.capped[:0]
	for i := range cands {
		sc.capped = append(sc.capped, eligible(i))
	}
	if t.BranchBalance <= 0 {
		return
	}
	scores, prompt := sc.scores, promptTokens(req, sc.view.KeyBlock())
	sc.work, sc.adds = sc.work[:0], sc.adds[:0]
	for i, c := range cands {
		w := scores[i].Weight
		sc.work = append(sc.work, sc.view.RecentWork(c)/w)
		sc.adds = append(sc.adds, float64(max(prompt-scores[i].Matched, 0))/w)
	}
	work, adds := sc.work, sc.adds
	var total float64
	least := math.Inf(1)
	n := 0
	for i, ok := range sc.capped {
		if ok {
			total += work[i]
			least = min(least, work[i]+adds[i])
			n++
		}
	}
	if n < 2 {
		return
	}
	slack := capSlack * float64(prompt)
	for i, ok := range sc.capped {
		after, spare := work[i]+adds[i], slack/scores[i].Weight
		if turn {
			after = max(work[i]-float64(scores[i].Pending)/scores[i].Weight, 0) + adds[i]
		}
		sc.capped[i] = ok && (after <= t.BranchBalance*(total+adds[i])/float64(n)+spare || after <= least+spare)
	}
}

// TestChooseMatchesModel: over many random score sets, Index states and
// tunings, the composed choose gives the same replica and reason as the
// naive model, and leaves the same OverBound flags. Ties are broken the
// same way for both (tieDraw made deterministic: the last tie, then the
// first).
func TestChooseMatchesModel(t *testing.T) {
	draws := map[string]func(int) int{
		"last tie wins":  func(int) int { return 0 },
		"first tie wins": func(n int) int { return n - 1 },
	}
	t.Cleanup(func() { tieDraw = rand.IntN })
	reasons := map[string]int{}
	for name, draw := range draws {
		tieDraw = draw
		rng := rand.New(rand.NewPCG(1, uint64(len(name))))
		for c := range 3000 {
			got, want := chooseBoth(t, rng)
			if got != want {
				t.Fatalf("%s, case %d: composed choose %s, model %s", name, c, got, want)
			}
			reasons[reasonKind(want)]++
		}
	}
	// The cases reach every path.
	for _, kind := range []string{"cold", SessionName, "spread", "cache_hit", "overflow", "least_cost"} {
		if reasons[kind] == 0 {
			t.Errorf("no case took the %s path: %v", kind, reasons)
		}
	}
}

// reasonKind is the first word of a choice's reason ("3 spread
// matched=0 [...]": spread).
func reasonKind(choice string) string { return strings.Fields(choice)[1] }

// chooseBoth builds one random case and returns the composed choose's and
// the model's choice, each as "index reason over-bound flags".
func chooseBoth(t *testing.T, rng *rand.Rand) (got, want string) {
	t.Helper()
	pick := func(vs ...float64) float64 { return vs[rng.IntN(len(vs))] }
	tun := CacheAwareConfig{
		Lambda: pick(0, 100, 2048), Mu: pick(0, 4096), Nu: pick(0, 0.1, 0.5), Epsilon: 0.25,
		MinMatchTokens: int(pick(0, 256, 4096)),
		BranchBalance:  pick(0, 1.25, 1.25), BoundFloor: int(pick(0, 2, 8)), TurnPrice: pick(0, 0, 0.5, 1),
	}
	opts := testOptions()
	opts.CacheAwareConfig = tun
	p := NewCacheAware(opts, NewSessions(time.Minute))
	now := time.Now()
	p.now = func() time.Time { return now }
	reps := testFleet(t, 2+rng.IntN(7))
	kb := p.ix.KeyBlock()

	// A shared prefix, continued by some replicas' own conversations; the
	// request continues it with its own blocks, or repeats it.
	prefix := seqKey(uint32(1+rng.IntN(1000)), (4+rng.IntN(60))*kb)
	key := prefix
	if rng.IntN(4) > 0 {
		key = append(slices.Clone(prefix), seqKey(uint32(5000+rng.IntN(1000)), (1+rng.IntN(40))*kb)...)
	}
	req := &Request{Key: key}
	if rng.IntN(2) == 0 {
		req.Tokens = len(key)*kb + rng.IntN(kb)
	}
	for i, r := range reps {
		switch rng.IntN(3) {
		case 0:
			p.ix.RouterWriter().Place(append(slices.Clone(prefix), seqKey(uint32(9000+i), 8)...), false, r, now)
		case 1:
			p.ix.RouterWriter().Place(key, false, r, now)
		}
		if rng.IntN(2) == 0 {
			p.ix.RouterWriter().AddWork(r, int64(rng.IntN(40000)), now)
		}
		if rng.IntN(3) == 0 {
			p.ix.RouterWriter().AddPending(r, int64(1+rng.IntN(8000)))
		}
	}
	if rng.IntN(3) == 0 {
		req.Session = "s"
		p.sessions.Bind("s", reps[rng.IntN(len(reps))], now)
	}

	// The scores, at random around what the Index holds.
	maxID := 0
	for _, r := range reps {
		maxID = max(maxID, r.ID())
	}
	base := &scoreScratch{byID: make([]int32, maxID+1)}
	best := 0
	for _, r := range reps {
		var held int
		switch rng.IntN(4) {
		case 0:
		case 1:
			held = len(prefix) * kb
		case 2:
			held = len(key) * kb
		default:
			held = rng.IntN(len(key)*kb + 1)
		}
		base.byID[r.ID()] = int32(held)
		base.heldMost = max(base.heldMost, held)
		excess := float64(rng.IntN(7) - 3)
		s := Score{Matched: matchTokens(held, 16), Queue: float64(rng.IntN(6)), KVUsage: pick(0, 0, 0.5, rng.Float64()),
			Load: int64(rng.IntN(10)), Weight: pick(1, 1, 2, 0.5), Pending: int64(pick(0, 0, float64(rng.IntN(6000)))),
			OverBound: excess > 0, excess: excess}
		s.Score = scoreOf(&s, &tun)
		base.scores = append(base.scores, s)
		best = max(best, s.Matched)
	}

	run := func(choose func(sc *scoreScratch) (int, string)) string {
		sc := &scoreScratch{view: p.ix.View(now), byID: slices.Clone(base.byID), heldMost: base.heldMost, scores: slices.Clone(base.scores)}
		i, reason := choose(sc)
		over := make([]bool, len(sc.scores))
		for j, s := range sc.scores {
			over[j] = s.OverBound
		}
		return strconv.Itoa(i) + " " + reason + " " + fmt.Sprint(over)
	}
	want = run(func(sc *scoreScratch) (int, string) {
		relaxBound(sc.scores, tun.Lambda)
		return refChoose(p, req, reps, sc, best, &tun, now)
	})
	got = run(func(sc *scoreScratch) (int, string) { return p.choose(req, reps, sc, best, &tun, now) })
	return got, want
}
