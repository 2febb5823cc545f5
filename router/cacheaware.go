package router

import (
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/radix"
)

// CacheAwareOptions tunes the cache_aware policy. See config.CacheAware for
// units and defaults.
type CacheAwareOptions struct {
	Lambda         float64       // tokens one queued request costs
	Mu             float64       // tokens a full KV cache costs
	Nu             float64       // tokens one token of prefill pending ahead costs
	Epsilon        float64       // load bound (1+ε)·mean
	MinMatchTokens int           // below this best match, a request is cold
	TTL            time.Duration // tree entries unused this long stop counting
	BlockSize      int           // engine block size when metrics don't say
	KeyBlock       int           // tokens per routing key value; 0 means 1
	DefaultBudget  int64         // tree tokens per replica when capacity is unknown
	TreeMaxBytes   int64         // bound on the whole tree
}

// CacheAware scores each candidate r by s(r) = m_r − λ·q_r − μ·k_r: the
// prompt tokens r is believed to hold in whole engine blocks, less the price
// of its queue and of its KV memory pressure, with guard rails around it:
// cold requests spread by load and free cache, a
// bound on load that no cache hit may break, hot prefixes replicated to a
// second holder, entries aged out after a TTL, sessions as the fallback.
type CacheAware struct {
	opts     CacheAwareOptions
	tree     *radix.Tree
	sessions *Sessions
	now      func() time.Time
	budgets  sync.Map // radix.ReplicaID → int64 budget last applied
	// pending holds, by replica ID, the prompt tokens sent and not yet
	// prefilled. It only grows (IDs are small and dense), copy on write
	// under pendingMu, so the hot path reads it with one atomic load.
	pending   atomic.Pointer[[]*atomic.Int64]
	pendingMu sync.Mutex
	scratch   sync.Pool
}

// pendingOf returns the counter of prompt tokens sent to replica id whose
// prefill has not finished (no response byte yet).
func (p *CacheAware) pendingOf(id int) *atomic.Int64 {
	if s := p.pending.Load(); s != nil && id < len(*s) {
		return (*s)[id]
	}
	p.pendingMu.Lock()
	defer p.pendingMu.Unlock()
	var cur []*atomic.Int64
	if s := p.pending.Load(); s != nil {
		cur = *s
	}
	if id < len(cur) {
		return cur[id]
	}
	grown := make([]*atomic.Int64, max(id+1, 2*len(cur)))
	copy(grown, cur)
	for i := len(cur); i < len(grown); i++ {
		grown[i] = new(atomic.Int64)
	}
	p.pending.Store(&grown)
	return grown[id]
}

var _ Policy = (*CacheAware)(nil)

// NewCacheAware builds the policy with its own tree. sessions may be nil.
func NewCacheAware(opts CacheAwareOptions, sessions *Sessions) *CacheAware {
	if opts.BlockSize <= 0 {
		opts.BlockSize = 16
	}
	p := &CacheAware{
		opts:     opts,
		tree:     radix.New(radix.Options{MaxBytes: opts.TreeMaxBytes, DefaultBudget: opts.DefaultBudget, Unit: opts.KeyBlock}),
		sessions: sessions,
		now:      time.Now,
	}
	p.scratch.New = func() any { return &scoreScratch{} }
	return p
}

// Name implements Policy.
func (*CacheAware) Name() string { return "cache_aware" }

// UsesKey implements KeyUser: the policy routes by prompt tokens.
func (*CacheAware) UsesKey() bool { return true }

// Tree exposes the prefix tree (statistics, tests, replica removal).
func (p *CacheAware) Tree() *radix.Tree { return p.tree }

// Forget drops everything the policy knows of a replica that left the fleet.
func (p *CacheAware) Forget(rep *backends.Replica) {
	p.tree.RemoveReplica(radix.ReplicaID(rep.ID()))
	p.budgets.Delete(radix.ReplicaID(rep.ID()))
	if p.sessions != nil {
		p.sessions.Forget(rep)
	}
}

// Score is one candidate's breakdown, for /debug/route and tests.
type Score struct {
	Replica   string  `json:"replica"`
	Matched   int     `json:"matched_tokens"`  // whole blocks the replica is believed to hold
	Queue     float64 `json:"queue"`           // waiting requests plus unseen in-flight
	KVUsage   float64 `json:"kv_usage"`        // 0–1
	Load      int64   `json:"load"`            // requests in flight through this router
	Weight    float64 `json:"weight"`          // relative capacity w (backends[].weight)
	Pending   int64   `json:"pending_prefill"` // prompt tokens sent and not yet prefilled
	OverBound bool    `json:"over_bound"`      // load above its weight's share of (1+ε)·total (see loadBound)
	Score     float64 `json:"score"`           // m − (λ·q + ν·pending)/w − μ·k
}

type scoreScratch struct {
	matches []radix.Match
	byID    []int32
	scores  []Score
}

// replicaState reads r's queue, KV usage and in-flight count, and the block
// size its cache hits in, from one load of its snapshot. The queue is the
// waiting requests of its last fresh scrape plus the router's in-flight
// requests sent since that scrape; when metrics are stale or missing, the
// router's own in-flight count stands in, and KV usage counts as 0. The
// block size is the last scrape's, else the configured one.
func (p *CacheAware) replicaState(r *backends.Replica, now time.Time) (queue, kv float64, inflight int64, block int) {
	snap, fresh := r.SnapshotAt(now)
	inflight = r.InFlight()
	queue, block = float64(inflight), p.opts.BlockSize
	if snap != nil && snap.BlockSize > 0 {
		block = snap.BlockSize
	}
	if fresh {
		queue = snap.Waiting + float64(max(inflight-snap.InFlightAtScrape, 0))
		kv = snap.KVUsage
	}
	return queue, kv, inflight, block
}

// loadBound is the bound on load that no cache hit or session may break:
// a replica of weight w may carry at most ceil(w·(1+ε)·(total+1)/W) requests
// in flight, the request being placed included, where total is the
// candidates' in-flight requests and W their total weight. With equal
// weights that is ceil((1+ε)·(total+1)/n); a weight-2 replica may carry
// twice what a weight-1 replica may.
type loadBound float64

// newLoadBound computes the bound over cands with slack eps.
func newLoadBound(cands []*backends.Replica, eps float64) loadBound {
	var total int64
	var weight float64
	for _, c := range cands {
		total += c.InFlight()
		weight += c.Weight()
	}
	return loadBound((1 + eps) * float64(total+1) / weight)
}

// within reports whether one more request on a replica carrying load
// requests, of weight w, stays within the bound.
func (b loadBound) within(load int64, w float64) bool {
	return float64(load+1) <= math.Ceil(float64(b)*w)
}

// score fills sc.scores for cands and returns the best match length seen.
func (p *CacheAware) score(req *Request, cands []*backends.Replica, sc *scoreScratch, now time.Time) int {
	var notBefore time.Time
	if p.opts.TTL > 0 {
		notBefore = now.Add(-p.opts.TTL)
	}
	sc.matches = p.tree.MatchInto(sc.matches[:0], req.Key, notBefore)
	maxID := 0
	for _, c := range cands {
		if c.ID() > maxID {
			maxID = c.ID()
		}
	}
	if cap(sc.byID) <= maxID {
		sc.byID = make([]int32, maxID+1)
	}
	byID := sc.byID[:maxID+1]
	for i := range byID {
		byID[i] = 0
	}
	for _, m := range sc.matches {
		if int(m.Replica) <= maxID {
			byID[m.Replica] = int32(m.Tokens)
		}
	}
	bound := newLoadBound(cands, p.opts.Epsilon)
	sc.scores = sc.scores[:0]
	best := 0
	for _, c := range cands {
		q, k, load, bs := p.replicaState(c, now)
		m := 0
		if held := int(byID[c.ID()]); held > 0 {
			m = held / bs * bs
		}
		pend := p.pendingOf(c.ID()).Load()
		w := c.Weight()
		// Replica names are filled in by Explain, the only reader. Queue
		// and pending prefill drain in proportion to the replica's
		// capacity, so they cost 1/w; KV usage is a fraction already.
		s := Score{Matched: m, Queue: q, KVUsage: k, Load: load, Weight: w, Pending: pend, OverBound: !bound.within(load, w)}
		s.Score = float64(m) - (p.opts.Lambda*q+p.opts.Nu*float64(pend))/w - p.opts.Mu*k
		sc.scores = append(sc.scores, s)
		if m > best {
			best = m
		}
	}
	return best
}

// promptTokens is req's prompt length in tokens.
func (p *CacheAware) promptTokens(req *Request) int {
	if req.Tokens > 0 {
		return req.Tokens
	}
	return len(req.Key) * max(p.opts.KeyBlock, 1)
}

// Explain returns each candidate's score for req without recording anything.
func (p *CacheAware) Explain(req *Request, cands []*backends.Replica) (Decision, []Score) {
	sc := &scoreScratch{}
	now := p.now()
	best := p.score(req, cands, sc, now)
	i, reason := p.choose(req, cands, sc.scores, best, now)
	for j := range sc.scores {
		sc.scores[j].Replica = cands[j].Name()
	}
	return Decision{Replica: cands[i], Reason: reason, Matched: sc.scores[i].Matched}, sc.scores
}

// Pick implements Policy: score, choose, and record the choice in the tree
// (and the session table), returning an undo for a failed attempt.
func (p *CacheAware) Pick(req *Request, cands []*backends.Replica) Decision {
	sc := p.scratch.Get().(*scoreScratch)
	defer p.scratch.Put(sc)
	now := p.now()
	best := p.score(req, cands, sc, now)
	i, reason := p.choose(req, cands, sc.scores, best, now)
	rep := cands[i]
	dec := Decision{Replica: rep, Reason: reason, Matched: sc.scores[i].Matched}
	p.applyBudget(rep)
	// What is recorded is kept in the Decision's fields, not in closures:
	// no allocation per decision.
	if len(req.Key) > 0 {
		dec.tree, dec.key, dec.id = p.tree, req.Key, radix.ReplicaID(rep.ID())
		dec.held = p.tree.Insert(req.Key, dec.id, now)
	}
	if p.sessions != nil && req.Session != "" {
		dec.sessionUndo = p.sessions.Bind(req.Session, rep, now)
	}
	if uncached := int64(p.promptTokens(req) - dec.Matched); uncached > 0 {
		dec.pending, dec.prefill = p.pendingOf(rep.ID()), uncached
		dec.pending.Add(uncached)
	}
	return dec
}

// choose applies the guard rails to the scores and returns the index of the
// chosen candidate and the reason.
func (p *CacheAware) choose(req *Request, cands []*backends.Replica, scores []Score, best int, now time.Time) (int, string) {
	allOver := true
	for _, s := range scores {
		if !s.OverBound {
			allOver = false
			break
		}
	}
	eligible := func(i int) bool { return allOver || !scores[i].OverBound }

	if best < p.opts.MinMatchTokens {
		// Cold: the session's replica if it has one within bound, else the
		// least loaded replica with the most free cache.
		if p.sessions != nil && req.Session != "" {
			if rep := p.sessions.Lookup(req.Session, now); rep != nil {
				for i, c := range cands {
					if c == rep && eligible(i) {
						return i, "session"
					}
				}
			}
		}
		return p.leastLoaded(scores, eligible), "cold least_load"
	}

	bi := -1
	ties := 0
	for i := range scores {
		if !eligible(i) {
			continue
		}
		switch {
		case bi < 0 || scores[i].Score > scores[bi].Score:
			bi, ties = i, 1
		case scores[i].Score == scores[bi].Score:
			switch c := cmpLoad(scores[i], scores[bi]); {
			case c < 0:
				bi, ties = i, 1
			case c == 0:
				ties++
				if rand.IntN(ties) == 0 {
					bi = i
				}
			}
		}
	}
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

// coldPendingPrice is the price of one pending prefill token for a cold
// request. With no cached prefix at stake, the prefill queued ahead is the
// request's whole expected wait, so it counts at face value; ν, which
// trades pending prefill against a cached prefix (whose value outlives the
// request: later turns hit it too), applies to warm requests only.
const coldPendingPrice = 1

// cmpLoad compares the load per unit of weight of a and b (-1, 0 or 1).
func cmpLoad(a, b Score) int {
	x, y := float64(a.Load)*b.Weight, float64(b.Load)*a.Weight
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// leastLoaded returns the eligible index with the lowest cost of queue,
// memory and pending prefill ((λ·q + pending)/w + μ·k), then the lowest
// load per unit of weight, then the lowest KV usage (the most free cache),
// then at random.
func (p *CacheAware) leastLoaded(scores []Score, eligible func(int) bool) int {
	cost := func(s Score) float64 {
		return (p.opts.Lambda*s.Queue+coldPendingPrice*float64(s.Pending))/s.Weight + p.opts.Mu*s.KVUsage
	}
	bi, ties := -1, 0
	for i := range scores {
		if !eligible(i) {
			continue
		}
		if bi < 0 {
			bi, ties = i, 1
			continue
		}
		a, b := scores[i], scores[bi]
		ca, cb := cost(a), cost(b)
		cl := cmpLoad(a, b)
		switch {
		case ca < cb || ca == cb && (cl < 0 || cl == 0 && a.KVUsage < b.KVUsage):
			bi, ties = i, 1
		case ca == cb && cl == 0 && a.KVUsage == b.KVUsage:
			ties++
			if rand.IntN(ties) == 0 {
				bi = i
			}
		}
	}
	return bi
}

// applyBudget sizes r's share of the tree from its prefix-cache capacity
// when it is known (configured cache_tokens, else its metrics).
func (p *CacheAware) applyBudget(r *backends.Replica) {
	tokens := r.CacheTokens()
	if tokens <= 0 {
		return
	}
	id := radix.ReplicaID(r.ID())
	if v, ok := p.budgets.Load(id); ok && v.(int64) == tokens {
		return
	}
	p.budgets.Store(id, tokens)
	p.tree.SetBudget(id, tokens)
}
