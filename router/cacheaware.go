package router

import (
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
)

// CacheAwareOptions configures a cache_aware policy built on its own Index
// and configuration (NewCacheAware).
type CacheAwareOptions struct {
	CacheAwareConfig
	Index index.Options
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
// reads and writes the shared Index and reads its configuration in force
// (cacheaware_config.go) at every decision: its stages read the Index
// through one View per decision (scoreScratch.view) and Pick writes its
// choice through the Index's RouterWriter.
type CacheAware struct {
	ix       *index.Index
	w        index.RouterWriter
	coord    *coordSlot // the cluster leader (lead.go)
	cfg      *Live[CacheAwareConfig]
	sessions *Sessions
	now      func() time.Time
	scratch  sync.Pool
}

// NewCacheAware builds the policy on an Index and a configuration of its
// own, from opts. sessions may be nil.
func NewCacheAware(opts CacheAwareOptions, sessions *Sessions) *CacheAware {
	return newCacheAware(index.New(opts.Index), NewLive(opts.CacheAwareConfig), sessions, &coordSlot{})
}

func newCacheAware(ix *index.Index, cfg *Live[CacheAwareConfig], sessions *Sessions, coord *coordSlot) *CacheAware {
	p := &CacheAware{ix: ix, w: ix.RouterWriter(), coord: coord, cfg: cfg, sessions: sessions, now: time.Now}
	p.scratch.New = func() any { return &scoreScratch{} }
	return p
}

// Name implements Policy.
func (*CacheAware) Name() string { return CacheAwareName }

// UsesKey implements KeyUser: the policy routes by prompt tokens.
func (*CacheAware) UsesKey() bool { return true }

// Index implements IndexUser.
func (p *CacheAware) Index() *index.Index { return p.ix }

// promptTokens is req's prompt length in tokens, keyBlock tokens a key
// value.
func promptTokens(req *Request, keyBlock int) int {
	if req.Tokens > 0 {
		return req.Tokens
	}
	return len(req.Key) * keyBlock
}

// uncachedOn is how many of req's prompt tokens placing it where s was
// scored would compute: the prompt's length less s.Matched, both counted
// in the same tokens. prompt is promptTokens' (the approximate key's);
// where s matched on the exact key and the engine's count is known
// (ExactTokens), that count is taken instead: the engine's template
// tokens make the two differ.
func uncachedOn(req *Request, prompt int, s *Score) int {
	if s.Precise && req.ExactTokens > 0 {
		prompt = req.ExactTokens
	}
	return max(prompt-s.Matched, 0)
}

// Explain returns each candidate's score for req without recording anything.
func (p *CacheAware) Explain(req *Request, cands []*backends.Replica) (Decision, []Score) {
	now := p.now()
	sc := &scoreScratch{explain: true, view: p.ix.View(now)}
	t := p.cfg.Load()
	best := score(req, cands, sc, t, now)
	i, reason := p.choose(req, cands, sc, best, t, now)
	if sc.scores[i].Precise {
		reason += " precise"
	}
	fillEvicts(req, cands, sc) // shown whichever path chose
	for j := range sc.scores {
		sc.scores[j].Replica = cands[j].Name()
	}
	return Decision{Replica: cands[i], Reason: reason, Matched: sc.scores[i].Matched, Best: max(best, sc.scores[i].Matched)}, sc.scores
}

// Pick implements Policy: score, choose, and record the choice in the Index
// (and the session table), which the Decision's Undo takes back.
func (p *CacheAware) Pick(req *Request, cands []*backends.Replica) Decision {
	sc := p.scratch.Get().(*scoreScratch)
	defer p.scratch.Put(sc)
	sc.ticket = 0
	now := p.now()
	sc.view = p.ix.View(now)
	t := p.cfg.Load()
	best := score(req, cands, sc, t, now)
	i, reason := p.choose(req, cands, sc, best, t, now)
	rep := cands[i]
	precise := sc.scores[i].Precise
	if precise {
		reason += " precise"
	}
	dec := Decision{Replica: rep, Reason: reason, Matched: sc.scores[i].Matched, Best: max(best, sc.scores[i].Matched), Precise: precise}
	dec.rec.ticket = sc.ticket
	dec.rec.place = p.w.PlaceOwned(req.Key, req.keyBuf.owner(), false, rep, now)
	if precise {
		// In flight and in no event yet: the engine will hold the exact
		// key once it prefilled; its events then write it again.
		dec.rec.exact = p.w.PlaceOwned(req.Exact, req.exactBuf.owner(), true, rep, now)
	}
	if p.sessions != nil && req.Session != "" {
		dec.rec.session = p.sessions.Bind(req.Session, rep, now)
	}
	uncached := int64(uncachedOn(req, promptTokens(req, sc.view.KeyBlock()), &sc.scores[i]))
	dec.rec.pending = p.w.AddPending(rep, uncached)
	dec.rec.work = p.w.AddWork(rep, uncached, now)
	sc.view = index.View{} // keep nothing of the Index in the pool
	return dec
}

// choose composes the stages (score.go and scorers.go score; bound.go,
// workcap.go filter; picker.go picks) into the guard rails and returns the
// index of the chosen candidate and the reason: the load-bound filter,
// then the cold path, the branch rule (branch.go) or the rule of a cache
// hit and a conversation's next turn.
func (p *CacheAware) choose(req *Request, cands []*backends.Replica, sc *scoreScratch, best int, t *CacheAwareConfig, now time.Time) (int, string) {
	var allOver bool
	sc.eligible, allOver = boundFilter(sc.scores, t.Lambda, sc.eligible)
	if isCold(best, promptTokens(req, sc.view.KeyBlock()), t) {
		return p.cold(req, cands, sc, t, now)
	}
	if i, reason, ok := p.branch(req, cands, sc, t); ok {
		return i, reason
	}
	return hit(req, cands, sc, allOver, best, t)
}

// isCold reports whether a best match of best tokens, in a prompt of
// prompt tokens, is no prefix worth following: none, or shorter than both
// MinMatchTokens and half the prompt. A short prompt's shared prefix
// (a conversation's early turns, a short template) saves most of its
// prefill even when it is shorter than MinMatchTokens.
func isCold(best, prompt int, t *CacheAwareConfig) bool {
	return best == 0 || best < t.MinMatchTokens && 2*best < prompt
}

// cold places a request with no cached prefix worth following: at the
// session's replica if the load-bound filter leaves it, else by load and
// free cache among the candidates the work cap leaves (the fill across
// routers, then leastCost).
func (p *CacheAware) cold(req *Request, cands []*backends.Replica, sc *scoreScratch, t *CacheAwareConfig, now time.Time) (int, string) {
	if p.sessions != nil && req.Session != "" {
		if rep := p.sessions.Lookup(req.Session, now); rep != nil {
			for i, c := range cands {
				if c == rep && sc.eligible[i] {
					return i, SessionName
				}
			}
		}
	}
	fillEvicts(req, cands, sc)
	workCap(req, cands, sc, t, false)
	forced, pick := p.fill(req, cands, sc, sc.capped.has)
	if forced >= 0 {
		return forced, "cold least_load"
	}
	return leastCost(sc.scores, sc.capped.has, t, float64(promptTokens(req, sc.view.KeyBlock())), pick), "cold least_load"
}

// hit places a cache hit that starts no new branch (a conversation's next
// turn, a prompt sent again): the candidate of best rank by cmpTurn among
// those the filters leave (bestTurn).
//
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
func hit(req *Request, cands []*backends.Replica, sc *scoreScratch, allOver bool, best int, t *CacheAwareConfig) (int, string) {
	if t.BranchBalance > 0 && extends(req, sc) {
		allOver = false
		sc.eligible = sc.eligible.all(len(cands))
	}
	scores := sc.scores
	bi := bestTurn(scores, turnCap(req, cands, sc, t), t.TurnPrice)
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

// turnCap is the work cap on a next turn: of the candidates the load-bound
// filter leaves, it keeps in sc.capped those not busy and the busy ones the
// work cap (workCap, turn) leaves, and returns them. The work cap matters
// only to a busy candidate, and runs only when one is.
func turnCap(req *Request, cands []*backends.Replica, sc *scoreScratch, t *CacheAwareConfig) mask {
	floor := float64(t.BoundFloor)
	for i := range sc.scores {
		if sc.eligible[i] && busy(&sc.view, cands[i], sc.scores[i], floor) {
			workCap(req, cands, sc, t, true)
			for j, ok := range sc.eligible {
				sc.capped[j] = sc.capped[j] || ok && !busy(&sc.view, cands[j], sc.scores[j], floor)
			}
			return sc.capped
		}
	}
	return sc.eligible
}

// extends reports whether req's routing key goes on past the longest
// prefix any candidate holds (on the approximate key): a conversation's
// next turn adds its new messages to the history its replica holds,
// where a prompt sent again as it was is held whole.
func extends(req *Request, sc *scoreScratch) bool {
	return sc.heldMost/sc.view.KeyBlock() < len(req.Key)
}

// busy reports whether c, scored s, is busy for the work cap on next
// turns: prefill of this router's own requests pending there (a peer's is
// heard a batch late), or at least floor requests in flight per unit of
// weight.
func busy(v *index.View, c *backends.Replica, s Score, floor float64) bool {
	return v.OwnPending(c) > 0 || float64(s.Load) >= floor*s.Weight
}
