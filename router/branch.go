package router

import (
	"cmp"
	"strconv"
	"time"

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
// It reports false when the request does not start a branch, or the rule
// is off (BranchBalance 0); choose then scores as usual.
func (p *CacheAware) branch(req *Request, cands []*backends.Replica, sc *scoreScratch, eligible func(int) bool, t *CacheAwareTuning, now time.Time) (int, string, bool) {
	if t.BranchBalance <= 0 {
		return 0, "", false
	}
	raw := func(i int) int { return int(sc.byID[cands[i].ID()]) }
	bestRaw := 0
	for i := range cands {
		bestRaw = max(bestRaw, raw(i))
	}
	depth := bestRaw / p.ix.KeyBlock()
	if depth == 0 || depth >= len(req.Key) {
		return 0, "", false // nothing held, or nothing past it: no new branch
	}
	var notBefore time.Time
	if t.TTL > 0 {
		notBefore = now.Add(-t.TTL)
	}
	var n int
	sc.branches, n = p.ix.tree.Branches(sc.branches[:0], req.Key, depth, notBefore)
	if n == 0 {
		return 0, "", false // no other continuation: a conversation going on
	}
	p.fillEvicts(req, cands, sc)
	scores := sc.scores
	// Recent prefill work per unit of weight, and what this request would
	// add on each candidate.
	prompt := p.promptTokens(req)
	sc.work, sc.adds = sc.work[:0], sc.adds[:0]
	var total float64
	eligibleN := 0
	for i, c := range cands {
		w := scores[i].Weight
		sc.work = append(sc.work, p.ix.recentWork(c, now, t.TTL)/w)
		sc.adds = append(sc.adds, float64(max(prompt-scores[i].Matched, 0))/w)
		if eligible(i) {
			total += sc.work[i]
			eligibleN++
		}
	}
	within := func(i int) bool {
		return sc.work[i]+sc.adds[i] <= t.BranchBalance*(total+sc.adds[i])/float64(eligibleN)
	}
	var holders, all ranked
	for i := range cands {
		if !eligible(i) {
			continue
		}
		if raw(i) >= bestRaw && within(i) {
			holders.offer(i, cmpWarm(scores[i], scores[holders.best]))
		}
		b := all.best
		c := cmp.Compare(sc.work[i]+sc.adds[i], sc.work[b]+sc.adds[b])
		if c == 0 {
			c = cmp.Compare(coldCost(scores[i], t), coldCost(scores[b], t))
		}
		all.offer(i, c)
	}
	if holders.ties > 0 {
		i := holders.best
		return i, "cache_hit matched=" + strconv.Itoa(scores[i].Matched), true
	}
	i := all.best
	if raw(i) >= bestRaw {
		return i, "cache_hit matched=" + strconv.Itoa(scores[i].Matched), true
	}
	return i, "spread matched=" + strconv.Itoa(scores[i].Matched), true
}
