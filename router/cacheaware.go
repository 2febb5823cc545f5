package router

import (
	"cmp"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/radix"
)

// CacheAwareOptions configures a cache_aware policy built on its own Index
// and Tuning (NewCacheAware): its tuning, and the options of its Index. See
// config.CacheAware for units and defaults.
type CacheAwareOptions struct {
	CacheAwareTuning
	Index IndexOptions
}

// CacheAware scores each candidate r by
//
//	s(r) = m_r − (λ·q_r + ν·p_r)/w_r − μ·k_r
//
// the prompt tokens r is believed to hold in whole engine blocks, less the
// price of its queue q, of the prompt tokens p sent to it and not yet
// prefilled (both scaled by its weight w) and of its KV memory pressure k,
// with guard rails around it: cold requests spread by load and free cache,
// a bound on load that a cache hit breaks only by what its match pays for
// (relaxBound), hot prefixes replicated to a second holder, entries aged
// out after a TTL, sessions as the fallback. It
// reads and writes the shared Index and reads its tuning from the shared
// Tunings at every decision.
type CacheAware struct {
	ix       *Index
	tuning   *Tunings
	sessions *Sessions
	now      func() time.Time
	scratch  sync.Pool
}

// NewCacheAware builds the policy on an Index and Tunings of its own, from
// opts. sessions may be nil.
func NewCacheAware(opts CacheAwareOptions, sessions *Sessions) *CacheAware {
	return newCacheAware(NewIndex(opts.Index), NewTunings(Tuning{CacheAware: opts.CacheAwareTuning}), sessions)
}

// newCacheAwarePolicy is cache_aware's registry constructor.
func newCacheAwarePolicy(d Deps) Policy { return newCacheAware(d.Index, d.Tuning, d.Sessions) }

func newCacheAware(ix *Index, t *Tunings, sessions *Sessions) *CacheAware {
	p := &CacheAware{ix: ix, tuning: t, sessions: sessions, now: time.Now}
	p.scratch.New = func() any { return &scoreScratch{} }
	return p
}

// Name implements Policy.
func (*CacheAware) Name() string { return CacheAwareName }

// UsesKey implements KeyUser: the policy routes by prompt tokens.
func (*CacheAware) UsesKey() bool { return true }

// Index implements IndexUser.
func (p *CacheAware) Index() *Index { return p.ix }

// Tree exposes the Index's prefix tree (statistics, tests).
func (p *CacheAware) Tree() *radix.Tree { return p.ix.Tree() }

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

// score fills sc.scores for cands and returns the best match length seen.
// A candidate whose Index entries follow its engine's events (Index.Precise)
// is matched on the request's exact key when it has one, the others on the
// approximate key.
func (p *CacheAware) score(req *Request, cands []*backends.Replica, sc *scoreScratch, t *CacheAwareTuning, now time.Time) int {
	var notBefore time.Time
	if t.TTL > 0 {
		notBefore = now.Add(-t.TTL)
	}
	maxID := 0
	for _, c := range cands {
		if c.ID() > maxID {
			maxID = c.ID()
		}
	}
	sc.byID = p.matchByID(sc, sc.byID, req.Key, false, notBefore, maxID)
	byID := sc.byID
	slots := p.ix.slotsTo(maxID)
	var exact []int32
	if req.Exact != nil {
		for _, c := range cands {
			if slots[c.ID()].precise.Load() {
				sc.exact = p.matchByID(sc, sc.exact, req.Exact, true, notBefore, maxID)
				exact = sc.exact
				break
			}
		}
	}
	bound := newLoadBound(cands, t.Epsilon, t.BoundFloor)
	sc.scores = sc.scores[:0]
	blockSize := t.BlockSize
	if blockSize <= 0 {
		blockSize = defaultBlockSize
	}
	best := 0
	sc.heldMost = 0
	for _, c := range cands {
		q, k, load, bs, batching := replicaState(c, now, blockSize)
		held, precise := int(byID[c.ID()]), false
		sc.heldMost = max(sc.heldMost, held)
		if exact != nil && slots[c.ID()].precise.Load() {
			held, precise = int(exact[c.ID()]), true
		}
		m := 0
		if held > 0 {
			m = held / bs * bs
		}
		pend := slots[c.ID()].pendingAll()
		w := c.Weight()
		// Replica names are filled in by Explain, the only reader; the
		// tokens a placement would evict by fillEvicts, for the paths
		// that price them. Queue and pending prefill drain in proportion
		// to the replica's capacity, so they cost 1/w; KV usage is a
		// fraction already.
		ex := bound.excess(load, w, batching)
		s := Score{Matched: m, Queue: q, KVUsage: k, Load: load, Weight: w, Pending: pend, OverBound: ex > 0, Precise: precise, excess: ex}
		s.Score = float64(m) - (t.Lambda*q+t.Nu*float64(pend))/w - t.Mu*k
		sc.scores = append(sc.scores, s)
		if m > best {
			best = m
		}
	}
	relaxBound(sc.scores, t.Lambda)
	return best
}

// matchByID fills dst (grown to maxID+1) with the tokens of key each
// replica holds in its exact share (exact) or its approximate one, by
// replica ID, counting entries used at or after notBefore.
func (p *CacheAware) matchByID(sc *scoreScratch, dst []int32, key []uint32, exact bool, notBefore time.Time, maxID int) []int32 {
	sc.matches = p.ix.Match(sc.matches[:0], key, exact, notBefore)
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
func (p *CacheAware) fillEvicts(req *Request, cands []*backends.Replica, sc *scoreScratch) {
	sc.occ, sc.ids = p.ix.Occupancies(sc.occ, sc.ids, cands)
	prompt := p.promptTokens(req)
	for i := range sc.scores {
		s := &sc.scores[i]
		uncached := int64(max(prompt-s.Matched, 0))
		s.Evicts = max(sc.occ[i].Held+uncached-sc.occ[i].Budget, 0)
	}
}

// defaultBlockSize is the engine block size assumed when neither the
// tuning nor the replica's metrics give one.
const defaultBlockSize = 16

// promptTokens is req's prompt length in tokens.
func (p *CacheAware) promptTokens(req *Request) int {
	if req.Tokens > 0 {
		return req.Tokens
	}
	return len(req.Key) * p.ix.KeyBlock()
}

// Explain returns each candidate's score for req without recording anything.
func (p *CacheAware) Explain(req *Request, cands []*backends.Replica) (Decision, []Score) {
	sc := &scoreScratch{explain: true}
	now := p.now()
	t := &p.tuning.Load().CacheAware
	best := p.score(req, cands, sc, t, now)
	i, reason := p.choose(req, cands, sc, best, t, now)
	if sc.scores[i].Precise {
		reason += " precise"
	}
	p.fillEvicts(req, cands, sc) // shown whichever path chose
	for j := range sc.scores {
		sc.scores[j].Replica = cands[j].Name()
	}
	return Decision{Replica: cands[i], Reason: reason, Matched: sc.scores[i].Matched}, sc.scores
}

// Pick implements Policy: score, choose, and record the choice in the Index
// (and the session table), which the Decision's Undo takes back.
func (p *CacheAware) Pick(req *Request, cands []*backends.Replica) Decision {
	sc := p.scratch.Get().(*scoreScratch)
	defer p.scratch.Put(sc)
	sc.ticket = 0
	now := p.now()
	t := &p.tuning.Load().CacheAware
	best := p.score(req, cands, sc, t, now)
	i, reason := p.choose(req, cands, sc, best, t, now)
	rep := cands[i]
	precise := sc.scores[i].Precise
	if precise {
		reason += " precise"
	}
	dec := Decision{Replica: rep, Reason: reason, Matched: sc.scores[i].Matched, Precise: precise}
	dec.rec.ticket = sc.ticket
	dec.rec.place = p.ix.place(SourceRouter, req.Key, false, req.keyBuf, rep, now)
	prompt := p.promptTokens(req)
	if precise {
		// In flight and in no event yet: the engine will hold the exact
		// key once it prefilled; its events then write it again.
		dec.rec.exact = p.ix.place(SourceRouter, req.Exact, true, req.exactBuf, rep, now)
		if req.ExactTokens > 0 {
			prompt = req.ExactTokens
		}
	}
	if p.sessions != nil && req.Session != "" {
		dec.rec.session = p.sessions.Bind(req.Session, rep, now)
	}
	uncached := int64(max(prompt-dec.Matched, 0))
	dec.rec.pending = p.ix.AddPending(rep, uncached)
	if uncached > 0 {
		p.ix.addWork(rep, uncached, now, t.TTL)
	}
	dec.rec.work = workRec{ix: p.ix, rep: rep, tokens: uncached, at: now, halfLife: t.TTL}
	return dec
}

// choose applies the guard rails to the scores and returns the index of the
// chosen candidate and the reason.
func (p *CacheAware) choose(req *Request, cands []*backends.Replica, sc *scoreScratch, best int, t *CacheAwareTuning, now time.Time) (int, string) {
	scores := sc.scores
	allOver := true
	for _, s := range scores {
		if !s.OverBound {
			allOver = false
			break
		}
	}
	eligible := func(i int) bool { return allOver || !scores[i].OverBound }

	if best < t.MinMatchTokens {
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
		p.fillEvicts(req, cands, sc)
		p.workCap(req, cands, sc, eligible, t, now, false)
		capped := func(i int) bool { return sc.capped[i] }
		forced, pick := p.fill(req, cands, sc, capped)
		if forced >= 0 {
			return forced, "cold least_load"
		}
		return leastCost(scores, capped, t, float64(p.promptTokens(req)), pick), "cold least_load"
	}

	if i, reason, ok := p.branch(req, cands, sc, eligible, t, now); ok {
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
	if t.BranchBalance > 0 && p.extends(req, sc) {
		allOver = false
		eligible = func(int) bool { return true }
	}
	floor := float64(t.BoundFloor)
	capping := false
	for i := range scores {
		if eligible(i) && p.busy(cands[i], scores[i], floor) {
			// The work cap matters only to a busy candidate.
			p.workCap(req, cands, sc, eligible, t, now, true)
			capping = true
			break
		}
	}
	var r ranked
	for i := range scores {
		if !eligible(i) || capping && !sc.capped[i] && p.busy(cands[i], scores[i], floor) {
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

// extends reports whether req's routing key goes on past the longest
// prefix any candidate holds (on the approximate key): a conversation's
// next turn adds its new messages to the history its replica holds,
// where a prompt sent again as it was is held whole.
func (p *CacheAware) extends(req *Request, sc *scoreScratch) bool {
	return sc.heldMost/p.ix.KeyBlock() < len(req.Key)
}

// coldPendingPrice is the price of one pending prefill token for a cold
// request. With no cached prefix at stake, the prefill queued ahead is the
// request's whole expected wait, so it counts at face value; ν, which
// trades pending prefill against a cached prefix (whose value outlives the
// request: later turns hit it too), applies to warm requests only.
const coldPendingPrice = 1

// cmpWarm ranks a before b (-1) when its score is higher, then when its
// load per unit of weight is lower.
func cmpWarm(a, b Score) int {
	if c := cmp.Compare(b.Score, a.Score); c != 0 {
		return c
	}
	return cmpLoad(a, b)
}

// busy reports whether c, scored s, is busy for the work cap on next
// turns: prefill of this router's own requests pending there (a peer's is
// heard a batch late), or at least floor requests in flight per unit of
// weight.
func (p *CacheAware) busy(c *backends.Replica, s Score, floor float64) bool {
	return p.ix.slot(c.ID()).pending.Load() > 0 || float64(s.Load) >= floor*s.Weight
}

// cmpTurn is cmpWarm for a conversation's next turn, paying price (0–1) of
// the load prices in each score.
func cmpTurn(a, b Score, price float64) int {
	if price >= 1 {
		return cmpWarm(a, b)
	}
	// Score is m − cost; m − price·cost is m·(1−price) + price·Score.
	ta := float64(a.Matched)*(1-price) + price*a.Score
	tb := float64(b.Matched)*(1-price) + price*b.Score
	if c := cmp.Compare(tb, ta); c != 0 {
		return c
	}
	return cmpLoad(a, b)
}

// coldCost is what placing a request without a cached prefix at stake
// costs on a replica: its queue, memory pressure and pending prefill
// ((λ·q + pending)/w + μ·k), and the cached tokens it would push out of the
// replica's share of the Index (which later requests might have hit).
func coldCost(s Score, t *CacheAwareTuning) float64 {
	return (t.Lambda*s.Queue+coldPendingPrice*float64(s.Pending))/s.Weight + t.Mu*s.KVUsage + evictPrice*float64(s.Evicts)
}

// evictPrice is the price, in tokens of prefill, of one cached token a
// placement pushes out: what is evicted is the least recently used, which
// is less likely to be reused than not.
const evictPrice = 0.5

// leastCost returns the eligible index with the lowest coldCost, then the
// lowest load per unit of weight, then the lowest KV usage (the most free
// cache), then at random; with pick > 0, place pick (0 first) of those one
// router would give a request of tokens tokens from each router (see
// CacheAware.fill): each place taken adds one to that replica's queue and the
// prompt to its pending prefill.
func leastCost(scores []Score, eligible func(int) bool, t *CacheAwareTuning, tokens float64, pick int) int {
	if pick == 0 {
		return cheapest(scores, eligible, t, nil)
	}
	var stack [64]float64 // the costs of up to 64 candidates, not allocated
	costs := stack[:0]
	for _, s := range scores {
		costs = append(costs, coldCost(s, t))
	}
	for k := 0; ; k++ {
		i := cheapest(scores, eligible, t, costs)
		if k == pick {
			return i
		}
		costs[i] += (t.Lambda + coldPendingPrice*tokens) / scores[i].Weight
	}
}

// cheapest returns the eligible index with the lowest cost (coldCost, or
// costs[i] when costs is given), then the lowest load per unit of weight,
// then the lowest KV usage, then at random.
func cheapest(scores []Score, eligible func(int) bool, t *CacheAwareTuning, costs []float64) int {
	var r ranked
	var bestCost float64
	for i, s := range scores {
		if !eligible(i) {
			continue
		}
		var c float64
		if costs != nil {
			c = costs[i]
		} else {
			c = coldCost(s, t)
		}
		order := 0
		if r.ties > 0 {
			b := scores[r.best]
			if order = cmp.Compare(c, bestCost); order == 0 {
				if order = cmpLoad(s, b); order == 0 {
					order = cmp.Compare(s.KVUsage, b.KVUsage)
				}
			}
		}
		r.offer(i, order)
		if r.best == i {
			bestCost = c
		}
	}
	return r.best
}
