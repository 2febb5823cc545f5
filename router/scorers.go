package router

import "github.com/kvroute/kvroute/backends"

// The scorers: each prices one term of a candidate's score in tokens of
// prefill. A warm request's score is their sum (scoreOf),
//
//	s(r) = m − (λ·q + ν·P)/w − μ·k
//
// the match less the queue, pending-prefill and KV prices; a cold
// request's cost is coldCost, the same prices with pending prefill at face
// value and the cached tokens a placement would evict.

// matchTokens is the match scorer: the tokens held of the prompt counted
// in whole engine blocks of bs tokens (an engine hits whole blocks only).
func matchTokens(held, bs int) int {
	if held <= 0 {
		return 0
	}
	return held / bs * bs
}

// queuePrice is the queue scorer: q requests waiting ahead, at λ tokens
// each, per unit of weight (the queue drains in proportion to capacity).
func queuePrice(q, lambda float64) float64 { return lambda * q }

// pendingPrice is the pending-prefill scorer: pending prompt tokens sent and
// not yet prefilled, at price each, per unit of weight.
func pendingPrice(pending int64, price float64) float64 { return price * float64(pending) }

// kvPrice is the KV scorer: memory pressure k (0–1) at μ tokens.
func kvPrice(k, mu float64) float64 { return mu * k }

// evictCost prices the cached tokens a placement would push out of the
// replica's share of the Index (Score.Evicts).
func evictCost(evicts int64) float64 { return evictPrice * float64(evicts) }

// scoreOf is a warm request's score of s: the match less the queue and
// pending-prefill prices, both per unit of weight, and the KV price.
func scoreOf(s *Score, t *CacheAwareConfig) float64 {
	return warmScore(s.Matched, s.Queue, s.Pending, s.Weight, s.KVUsage, t)
}

// warmScore is scoreOf of a candidate's terms, for the scoring loop,
// which has them in registers.
func warmScore(matched int, queue float64, pending int64, weight, kv float64, t *CacheAwareConfig) float64 {
	return float64(matched) - (queuePrice(queue, t.Lambda)+pendingPrice(pending, t.Nu))/weight - kvPrice(kv, t.Mu)
}

// coldCost is what placing a request without a cached prefix at stake
// costs on a replica: its queue, memory pressure and pending prefill
// ((λ·q + pending)/w + μ·k), and the cached tokens it would push out of the
// replica's share of the Index (which later requests might have hit).
func coldCost(s Score, t *CacheAwareConfig) float64 {
	return (queuePrice(s.Queue, t.Lambda)+pendingPrice(s.Pending, coldPendingPrice))/s.Weight + kvPrice(s.KVUsage, t.Mu) + evictCost(s.Evicts)
}

// coldPendingPrice is the price of one pending prefill token for a cold
// request. With no cached prefix at stake, the prefill queued ahead is the
// request's whole expected wait, so it counts at face value; ν, which
// trades pending prefill against a cached prefix (whose value outlives the
// request: later turns hit it too), applies to warm requests only.
const coldPendingPrice = 1

// evictPrice is the price, in tokens of prefill, of one cached token a
// placement pushes out: what is evicted is the least recently used, which
// is less likely to be reused than not.
const evictPrice = 0.5

// matchByID fills dst (grown to maxID+1) with the tokens of key each
// replica holds in its exact share (exact) or its approximate one, by
// replica ID, counting entries used within the TTL (sc.view): the match
// scorer's input.
func matchByID(sc *scoreScratch, dst []int32, key []uint32, exact bool, maxID int) []int32 {
	sc.matches = sc.view.Match(sc.matches[:0], key, exact)
	if cap(dst) <= maxID {
		dst = make([]int32, maxID+1)
	}
	dst = dst[:maxID+1]
	clear(dst)
	for _, m := range sc.matches {
		if int(m.Replica) <= maxID {
			dst[m.Replica] = int32(m.Tokens)
		}
	}
	return dst
}

// fillEvicts sets each score's Evicts: the cached tokens placing req on the
// candidate would push out of its share of the Index (what it holds plus
// the prompt's uncached tokens, beyond its budget).
func fillEvicts(req *Request, cands []*backends.Replica, sc *scoreScratch) {
	sc.occ, sc.ids = sc.view.Occupancies(sc.occ, sc.ids, cands)
	prompt := promptTokens(req, sc.view.KeyBlock())
	for i := range sc.scores {
		s := &sc.scores[i]
		uncached := int64(uncachedOn(req, prompt, s))
		s.Evicts = max(sc.occ[i].Held+uncached-sc.occ[i].Budget, 0)
	}
}
