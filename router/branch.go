package router

import (
	"strconv"
	"time"

	"github.com/kvroute/kvroute/backends"
)

// branch places a request that starts a new branch of a shared prefix: its
// best match ends where other conversations already continue (the end of a
// system prompt, a shared document, a few-shot preamble), so the prefix is
// all it will reuse. Such requests spread over the replicas, each
// conversation keeping its replica afterwards (its next turn matches its own
// branch, past the shared point, and is placed by score):
//
//   - among the replicas that hold the prefix, the one with the fewest
//     branches of it per unit of weight gets the request;
//   - when every holder has at least SpreadBranches more branches than some
//     replica that lacks the prefix, that replica gets it instead and the
//     prefix gains a holder: a prefix many conversations branch from is
//     replicated to more replicas as its branches grow, and the margin is
//     the hysteresis that keeps it from moving back and forth. Holders
//     shed it as its branches age out (the TTL) or are evicted.
//
// It reports false when the request does not start a branch, or the rule
// is off (SpreadBranches 0); choose then scores as usual.
func (p *CacheAware) branch(req *Request, cands []*backends.Replica, sc *scoreScratch, eligible func(int) bool, t *CacheAwareTuning, now time.Time) (int, string, bool) {
	if t.SpreadBranches <= 0 {
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
	count := func(i int) float64 {
		c := 0
		if id := cands[i].ID(); id < len(sc.branches) {
			c = int(sc.branches[id])
		}
		return float64(c) / scores[i].Weight
	}
	// The fewest branches among the holders and among all.
	var holders, all ranked
	for i := range cands {
		if !eligible(i) {
			continue
		}
		if raw(i) >= bestRaw {
			holders.offer(i, branchCmp(count(i), count(holders.best), scores[i], scores[holders.best], t))
		}
		all.offer(i, branchCmp(count(i), count(all.best), scores[i], scores[all.best], t))
	}
	if holders.ties == 0 {
		return 0, "", false
	}
	if count(holders.best)-count(all.best) >= float64(t.SpreadBranches) {
		i := all.best
		return i, "spread matched=" + strconv.Itoa(scores[i].Matched), true
	}
	i := holders.best
	return i, "cache_hit matched=" + strconv.Itoa(scores[i].Matched), true
}

// branchCmp ranks a candidate before another (-1) when it has fewer
// branches per unit of weight, then when placing there costs less
// (coldCost, less the matched tokens it saves), then when its load per
// unit of weight is lower.
func branchCmp(ca, cb float64, a, b Score, t *CacheAwareTuning) int {
	if c := compareFloat(ca, cb); c != 0 {
		return c
	}
	if c := compareFloat(coldCost(a, t)-float64(a.Matched), coldCost(b, t)-float64(b.Matched)); c != 0 {
		return c
	}
	return cmpLoad(a, b)
}
