package router

import (
	"cmp"
	"strconv"

	"github.com/kvroute/kvroute/backends"
)

// branch places a request that starts a new branch of a shared prefix: its
// best match ends where other conversations already continue (the end of a
// system prompt, a shared document, a few-shot preamble), so the prefix is
// all it will reuse. Such a request stays with a replica holding the prefix
// (the best scored) while that replica's recent prefill work, this
// request's uncached tokens included, is within BranchBalance times the
// mean over the candidates; when no holder is, it goes to the replica with
// the least recent work, this request's uncached tokens included there
// (`spread`): the prefix gains a holder. Even one request at a time,
// conversations sharing a system prompt spread over the replicas, and a
// prefix gains holders as its traffic grows; each conversation then keeps
// its replica, since its next turn matches its own branch, past the shared
// point, and is placed by score. Holders shed the prefix as its entries age
// out (the TTL) or are evicted.
//
// The candidates are those the load-bound filter and then the work cap
// (workCap) leave. It reports false when the
// request does not start a branch, or the rule is off (BranchBalance 0);
// choose then scores as usual.
func (p *CacheAware) branch(req *Request, cands []*backends.Replica, sc *scoreScratch, t *CacheAwareConfig) (int, string, bool) {
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
	workCap(req, cands, sc, t, false)
	scores := sc.scores
	var i int
	var spread bool
	if forced, pick := p.fill(req, cands, sc, sc.capped.has); forced >= 0 {
		i, spread = forced, raw(forced) < bestRaw
	} else {
		i, spread = branchFill(scores, sc.work, sc.adds, sc.capped.has, raw, bestRaw, t, pick)
	}
	if spread {
		return i, "spread matched=" + strconv.Itoa(scores[i].Matched), true
	}
	return i, "cache_hit matched=" + strconv.Itoa(scores[i].Matched), true
}

// branchFill returns place pick (0 first) of those branchPlace gives a
// request like this one, and then each next one, from each router
// (CacheAware.fill): each place taken adds the request's uncached
// tokens to that replica's work (adds, per unit of weight) and one more
// request to its queue. work and adds are left as they were.
func branchFill(scores []Score, work, adds []float64, eligible func(int) bool, raw func(int) int, bestRaw int, t *CacheAwareConfig, pick int) (i int, spread bool) {
	var total float64
	eligibleN := 0
	for i := range scores {
		if eligible(i) {
			total += work[i]
			eligibleN++
		}
	}
	within := func(i int) bool {
		return work[i]+adds[i] <= t.BranchBalance*(total+adds[i])/float64(eligibleN)
	}
	vs := scores
	var stack [64]Score       // up to 64 candidates, not allocated
	var workStack [64]float64 // the same
	if pick > 0 {
		vs = append(stack[:0], scores...)
		work = append(workStack[:0], work...)
	}
	for k := 0; ; k++ {
		i, spread = branchPlace(vs, work, adds, eligible, within, raw, bestRaw, total/float64(eligibleN), t)
		if k == pick {
			return i, spread
		}
		total += adds[i]
		work[i] += adds[i]
		vs[i].Score -= t.Lambda/vs[i].Weight + t.Nu*adds[i]
		vs[i].Load++
	}
}

// underusedShare is the share of the mean recent prefill work at or below
// which a replica counts as underused: a new branch goes there, its
// prefix computed again, rather than to a holder that would then carry
// more work. One request at a time, the balance rule alone lets a few
// holders within BranchBalance of the mean share every new conversation
// while a replica that holds nothing stays idle, and each conversation
// they keep brings its later turns. Under load the same holds for a
// burst of new conversations: a tenant whose system prompt two replicas
// hold gives each twice the share of one that four hold, and each stays
// within the balance while a replica at half the mean takes none
// (docs/sweep.md).
const underusedShare = 0.75

// branchPlace is branch's choice over scores and the candidates' work and
// adds, mean being the eligible candidates' mean work: the best holder
// within balance, unless an underused replica would have less work after
// this request, else the one with the least work after this request
// (spread when it holds less than bestRaw). Of the holders, the best is
// the best scored (of equal scores, the one of least work after this
// request), but for a conversation whose own tokens are fewer than the
// prefix it shares: the one of least work after it (of equal work, the
// best scored). Such conversations are alike (sessions of one system
// prompt), and each brings its later turns wherever it goes, so the work
// a holder has taken weighs more than what waits there this instant (the
// score's queue and pending prefill), which is gone in a moment; where
// conversations differ by orders of magnitude, that instant is what a
// new one's first token waits for (docs/sweep.md).
func branchPlace(scores []Score, work, adds []float64, eligible, within func(int) bool, raw func(int) int, bestRaw int, mean float64, t *CacheAwareConfig) (i int, spread bool) {
	// ownShort: the conversation's own tokens (what it adds) are fewer
	// than the prefix it shares there.
	ownShort := func(i int) bool { return adds[i]*scores[i].Weight < float64(raw(i)) }
	var holders, all ranked
	for i := range scores {
		if !eligible(i) {
			continue
		}
		if raw(i) >= bestRaw && within(i) {
			h := holders.best
			byWork := cmp.Compare(work[i]+adds[i], work[h]+adds[h])
			c := cmpWarm(scores[i], scores[h])
			if c == 0 || (byWork != 0 && ownShort(i) && ownShort(h)) {
				c = byWork
			}
			holders.offer(i, c)
		}
		b := all.best
		c := cmp.Compare(work[i]+adds[i], work[b]+adds[b])
		if c == 0 {
			c = cmp.Compare(coldCost(scores[i], t), coldCost(scores[b], t))
		}
		all.offer(i, c)
	}
	h, l := holders.best, all.best
	if holders.ties > 0 && (work[l] > underusedShare*mean || work[l]+adds[l] >= work[h]+adds[h]) {
		return h, false
	}
	return l, raw(l) < bestRaw
}
