package router

import (
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/radix"
)

// Score is one candidate's breakdown, for /debug/route and tests.
type Score struct {
	Replica   string  `json:"replica"`
	Matched   int     `json:"matched_tokens"`  // whole blocks the replica is believed to hold
	Queue     float64 `json:"queue"`           // waiting requests plus unseen in-flight
	KVUsage   float64 `json:"kv_usage"`        // 0–1
	Load      int64   `json:"load"`            // requests in flight through this router
	Weight    float64 `json:"weight"`          // relative capacity w (backends[].weight)
	Pending   int64   `json:"pending_prefill"` // prompt tokens sent and not yet prefilled
	OverBound bool    `json:"over_bound"`      // load above its weight's share of (1+ε)·total, its match not paying for it (loadBound, relaxBound)
	Evicts    int64   `json:"evicts_tokens"`   // cached tokens this placement would push out of the replica's share of the Index
	Score     float64 `json:"score"`           // m − (λ·q + ν·pending)/w − μ·k
	Precise   bool    `json:"precise"`         // matched on the exact key (the replica's engine events)

	excess float64 // requests past the load bound (loadBound.excess; 0 or less: within)
}

type scoreScratch struct {
	// view is the Index as this decision reads it: every stage reads
	// through it.
	view     index.View
	matches  []radix.Match
	byID     []int32   // raw match in tokens by replica ID
	heldMost int       // the longest of them over the candidates
	exact    []int32   // the same on the exact key, for precise replicas
	branches []int32   // branch counts by replica ID (branch.go)
	work     []float64 // recent prefill work by candidate, per unit of weight (branch.go)
	adds     []float64 // what the request would add to it
	eligible mask      // the candidates the load-bound filter leaves (boundFilter)
	capped   mask      // the candidates the work cap leaves (workCap)
	occ      []radix.Occupancy
	ids      []radix.ReplicaID
	scores   []Score
	// explain: the scores are only shown (Explain), no leader is asked.
	explain bool
	// ticket is the cluster leader's ticket for the choice it made, 0
	// when it made none (CacheAware.fill).
	ticket uint64
}

// replicaState reads r's queue, KV usage and in-flight count, and the block
// size its cache hits in, from one load of its snapshot. The in-flight
// count is fleet-wide (boundLoad: this router's and its peers', less one
// of theirs that may have ended unheard).
// The queue is the waiting requests of its last fresh scrape plus the
// in-flight requests sent since that scrape; when metrics are stale or
// missing, the in-flight count stands in, and KV usage counts as 0. The
// block size is the last scrape's, else the configured one. batching
// reports a fresh scrape with no request waiting: the engine was running
// all it had (the load bound's floor applies).
func replicaState(r *backends.Replica, now time.Time, blockSize int) (queue, kv float64, inflight int64, block int, batching bool) {
	snap, fresh := r.SnapshotAt(now)
	inflight = boundLoad(r)
	queue, block = float64(inflight), blockSize
	if snap != nil && snap.BlockSize > 0 {
		block = snap.BlockSize
	}
	if fresh {
		queue = snap.Waiting + float64(max(inflight-snap.InFlightAtScrape, 0))
		kv = snap.KVUsage
		batching = snap.Waiting == 0
	}
	return queue, kv, inflight, block, batching
}

// score fills sc.scores for cands (the scorers' sum, scorers.go, and each
// candidate's excess over the load bound, which choose's boundFilter
// judges) and returns the best match length seen.
// A candidate whose Index entries follow its engine's events
// (index.View.Precise) is matched on the request's exact key when it has
// one, the others on the approximate key.
func score(req *Request, cands []*backends.Replica, sc *scoreScratch, t *CacheAwareConfig, now time.Time) int {
	v := &sc.view
	maxID := 0
	for _, c := range cands {
		if c.ID() > maxID {
			maxID = c.ID()
		}
	}
	sc.byID = matchByID(sc, sc.byID, req.Key, false, maxID)
	byID := sc.byID
	var exact []int32
	if req.Exact != nil {
		for _, c := range cands {
			if v.Precise(c) {
				sc.exact = matchByID(sc, sc.exact, req.Exact, true, maxID)
				exact = sc.exact
				break
			}
		}
	}
	bound := newLoadBound(cands, t.Epsilon, t.BoundFloor)
	sc.scores = sc.scores[:0]
	blockSize := v.BlockSize()
	best := 0
	sc.heldMost = 0
	for _, c := range cands {
		q, k, load, bs, batching := replicaState(c, now, blockSize)
		held, precise := int(byID[c.ID()]), false
		sc.heldMost = max(sc.heldMost, held)
		if exact != nil && v.Precise(c) {
			held, precise = int(exact[c.ID()]), true
		}
		m := matchTokens(held, bs)
		pend := v.Pending(c)
		w := c.Weight()
		// Replica names are filled in by Explain, the only reader; the
		// tokens a placement would evict by fillEvicts, for the paths
		// that price them. Queue and pending prefill drain in proportion
		// to the replica's capacity, so they cost 1/w; KV usage is a
		// fraction already.
		ex := bound.excess(load, w, batching)
		sc.scores = append(sc.scores, Score{Matched: m, Queue: q, KVUsage: k, Load: load, Weight: w, Pending: pend,
			OverBound: ex > 0, Precise: precise, excess: ex, Score: warmScore(m, q, pend, w, k, t)})
		if m > best {
			best = m
		}
	}
	return best
}
