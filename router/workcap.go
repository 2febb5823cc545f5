package router

import (
	"math"

	"github.com/kvroute/kvroute/backends"
)

// capSlack is the share of a request's prompt by which a replica's recent
// prefill work may pass either of workCap's limits: without it, replicas
// of nearly equal work would be passed over for differences smaller than
// the request itself (docs/sweep.md).
const capSlack = 0.1

// workCap is the work-cap filter: it narrows the candidates the load-bound
// filter leaves (sc.eligible) to those where req's uncached tokens
// leave the recent prefill work within BranchBalance times the mean over
// the eligible candidates, or no more than the least any candidate would
// then have (moving elsewhere would not lower the busiest replica's work),
// each with capSlack of the prompt to spare (the eligible candidate of least
// work after the request always qualifies). Cold requests and new branches
// are placed among them: neither piles onto a replica that took far more
// work than the others. The branch rule then takes its mean over the
// candidates left, so a heavy holder no longer lifts the mean that lets
// another holder keep a new conversation while a replica is idle. It fills
// sc.work with each candidate's recent prefill work and sc.adds with the
// uncached tokens req would add to it, both per unit of weight, and sets
// sc.capped[i] for the candidates left (capWork); off with BranchBalance
// 0 (sc.capped is sc.eligible then).
//
// With turn (req is a conversation's next turn), each candidate is judged
// by its work less the prefill still pending there (Score.Pending, own and
// peers'), against the mean of all the work counted: a replica's
// conversations answer together and send their next turns together, and
// while such a wave arrives its turns wait for their prefill. Counted at
// once, the wave would lift the replica past the cap before the other
// replicas' waves arrived, and every turn of it after that point would be
// moved, taking its conversation (and its later turns) along for good
// (docs/sweep.md).
func workCap(req *Request, cands []*backends.Replica, sc *scoreScratch, t *CacheAwareConfig, turn bool) {
	prompt := promptTokens(req, sc.view.KeyBlock())
	if t.BranchBalance > 0 {
		sc.work, sc.adds = sc.work[:0], sc.adds[:0]
		for i, c := range cands {
			w := sc.scores[i].Weight
			sc.work = append(sc.work, sc.view.RecentWork(c)/w)
			sc.adds = append(sc.adds, float64(uncachedOn(req, prompt, &sc.scores[i]))/w)
		}
	}
	sc.capped = capWork(sc.capped, sc.eligible, sc.scores, sc.work, sc.adds, prompt, t.BranchBalance, turn)
}

// capWork is workCap's rule: it returns in dst (resized) the candidates
// keep leaves whose work after the request (work[i]+adds[i], per unit of
// weight; with turn, work less the scores' pending prefill) is within
// balance times the mean work over keep, or no more than the least any
// kept candidate would then have, each with capSlack of prompt to spare.
// With balance 0, or fewer than two kept, it keeps what keep does (work
// and adds are then not read).
func capWork(dst, keep mask, scores []Score, work, adds []float64, prompt int, balance float64, turn bool) mask {
	dst = append(dst[:0], keep...)
	if balance <= 0 {
		return dst
	}
	var total float64
	least := math.Inf(1)
	n := 0
	for i, ok := range dst {
		if ok {
			total += work[i]
			least = min(least, work[i]+adds[i])
			n++
		}
	}
	if n < 2 {
		return dst
	}
	slack := capSlack * float64(prompt)
	for i, ok := range dst {
		after, spare := work[i]+adds[i], slack/scores[i].Weight
		if turn {
			after = max(work[i]-float64(scores[i].Pending)/scores[i].Weight, 0) + adds[i]
		}
		dst[i] = ok && (after <= balance*(total+adds[i])/float64(n)+spare || after <= least+spare)
	}
	return dst
}
