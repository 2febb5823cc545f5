// Package oracle computes, offline and in arrival order, what a perfectly
// informed router could have reused from prefix caches on a workload of
// bench/load: the ideal (one server with an unbounded cache, what
// load.IdealHitRate gives) and the finite-cache bound (each request on the
// replica holding its longest cached prefix among those whose prefill work
// stays within a cap over the mean, over replicas with LRU caches of a
// fleet's capacity). The bench reports every router's hits as a fraction of
// both. Replay counts, over the same caches, what a given placement (a
// router's own) would have reused.
//
// A request is a chain of blocks. A request with load.Request.Blocks (the
// Mooncake trace) is its block IDs, each load.MooncakeBlockTokens tokens;
// any other request is its prompt text (Options.Text, by default the
// canonical rendering of its messages) cut into whole blocks of
// Options.BlockTokens tokens with load.BlockKeys. A request hits the leading
// run of its blocks found in its replica's cache: min(run × block tokens,
// prompt tokens) tokens. The rest of its prompt is its prefill work.
//
// The model ignores time: there is no queueing, no concurrency and no
// pinning of blocks by running requests; a request's blocks enter its
// replica's cache as soon as it is placed. It is a bound on what placement
// alone can achieve, not a simulation.
package oracle

import (
	"github.com/kvroute/kvroute/bench/load"
)

// Unbounded as Options.CapacityTokens gives caches that never evict.
const Unbounded int64 = -1

// DefaultLoadCap is the load cap of the finite-cache bound: a replica takes
// a request only while its prefill work stays within 1.25 × the mean.
const DefaultLoadCap = 1.25

// Options configures Bound.
type Options struct {
	// Replicas is the number of replicas; at least 1 (0 means 1).
	Replicas int
	// BlockTokens is the block size, in tokens, of requests without Blocks;
	// 0 means load.DefaultHitBlockTokens.
	BlockTokens int
	// CapacityTokens is each replica's cache capacity in tokens: an LRU
	// cache evicts its least recently used blocks while it holds more. A
	// negative value (Unbounded) never evicts; 0 holds nothing.
	CapacityTokens int64
	// LoadCap is the load cap c: a request may go to replica r only if
	// work_r + u_r ≤ c × (Σ work + u_r) / Replicas, where work is the
	// prefill tokens (uncached prompt tokens) assigned so far and u_r the
	// request's uncached tokens on r. When no replica is within the cap, the
	// least loaded one takes it. 0 (or negative) means no cap: the longest
	// cached prefix always wins.
	LoadCap float64
	// Text returns the prompt text of request i of the workload; nil means
	// load.RenderChat(r.Messages). It is not called for requests with
	// Blocks. It lets a caller model what the replicas will really see, for
	// example the generated answers in place of the workload's own in later
	// turns.
	Text func(i int, r *load.Request) string
	// Tokens, when set, gives request i's prompt as the token ids an engine
	// sees (from its renderer; nil for a request it has none of, which is
	// then counted as Text would count it): its blocks are its whole blocks
	// of BlockTokens tokens, its prompt tokens the ids' number, and only
	// prompts are cached (PromptsOnly), the answers being inside the next
	// turn's tokens.
	Tokens func(i int, r *load.Request) []uint32
	// PromptsOnly caches the blocks of prompts only. By default, as in
	// vLLM and bench/sim, a replica also caches the blocks of the answers
	// it generates: a request with SendsAnswer finds the whole blocks of its
	// first Workload.AnswerBytes bytes (its previous turn's prompt and
	// answer) on the replica that served AnswerOf (touched there just
	// before the request is placed), as load.IdealHitRate counts them.
	PromptsOnly bool
}

// Result is what the oracle placement achieved.
type Result struct {
	// HitTokens is the prompt tokens found in cache; PromptTokens all
	// prompt tokens.
	HitTokens    int64 `json:"hit_tokens"`
	PromptTokens int64 `json:"prompt_tokens"`
	// Work is each replica's prefill work: the uncached prompt tokens of
	// the requests it took.
	Work []int64 `json:"prefill_tokens"`
	// Replica is the replica each request went to, in workload order.
	Replica []int `json:"-"`
}

// HitRate is HitTokens over PromptTokens (0 for no prompt tokens).
func (r *Result) HitRate() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return float64(r.HitTokens) / float64(r.PromptTokens)
}

// WorkMaxMean is the busiest replica's prefill work over the mean (1 is
// perfectly even, Replicas means one replica did all); 0 when there was no
// work.
func (r *Result) WorkMaxMean() float64 {
	var total, top int64
	for _, w := range r.Work {
		total += w
		top = max(top, w)
	}
	if total == 0 {
		return 0
	}
	return float64(top) * float64(len(r.Work)) / float64(total)
}

// Ideal is the placement on one server with an unbounded cache, the
// requests in slice order: its hit rate is load.IdealHitRate(w,
// blockTokens).
func Ideal(w *load.Workload, blockTokens int) *Result {
	return Bound(w, IdealOptions(Options{BlockTokens: blockTokens}))
}

// IdealOptions returns opt for the ideal: one replica, an unbounded cache,
// no load cap; the block size, Text and PromptsOnly stay.
func IdealOptions(opt Options) Options {
	opt.Replicas, opt.CapacityTokens, opt.LoadCap = 1, Unbounded, 0
	return opt
}

// Bound places the requests of w in slice (arrival) order over opt.Replicas
// replicas with perfect knowledge of their caches: each goes to the replica
// holding its longest cached prefix among those within the load cap, ties
// to the least loaded, then the lowest index; then its blocks are touched in
// that replica's cache, last block first (as bench/sim releases them), so
// that a prefix outlives its continuations.
func Bound(w *load.Workload, opt Options) *Result {
	return place(w, opt, func(_ int, hits, work []int64, prompt, total int64) int {
		return pick(hits, work, prompt, total, opt.LoadCap)
	})
}

// Replay places request i of w on replica assign[i], in slice order, over
// the caches Bound would use, and counts what those caches would have
// given it: the hits of a router's own placement with caches that nothing
// but placement fills (no pinning, no queueing). A request whose
// assign[i] is out of range (unknown, or not sent) is placed as Bound
// would place it; so is every request past the end of assign.
func Replay(w *load.Workload, assign []int, opt Options) *Result {
	n := max(opt.Replicas, 1)
	return place(w, opt, func(i int, hits, work []int64, prompt, total int64) int {
		if i < len(assign) && assign[i] >= 0 && assign[i] < n {
			return assign[i]
		}
		return pick(hits, work, prompt, total, opt.LoadCap)
	})
}

// chooser returns the replica for request i, which hits hits[k] tokens of
// its prompt on replica k, given each replica's work and their sum total.
type chooser func(i int, hits, work []int64, prompt, total int64) int

// place places the requests of w in slice order, each on the replica
// choose returns, over opt.Replicas LRU caches.
func place(w *load.Workload, opt Options, choose chooser) *Result {
	n := max(opt.Replicas, 1)
	bt := opt.BlockTokens
	if bt <= 0 {
		bt = load.DefaultHitBlockTokens
	}
	text := opt.Text
	if text == nil {
		text = func(_ int, r *load.Request) string { return load.RenderChat(r.Messages) }
	}
	caches := make([]*lru, n)
	for i := range caches {
		caches[i] = newLRU(opt.CapacityTokens)
	}
	res := &Result{Work: make([]int64, n), Replica: make([]int, len(w.Requests))}
	hits := make([]int64, n)
	var buf []uint64
	var total int64 // Σ Work
	for i := range w.Requests {
		r := &w.Requests[i]
		keys, blockTok, prompt := r.Blocks, int64(load.MooncakeBlockTokens), int64(r.PromptTokens)
		var toks []uint32
		if opt.Tokens != nil {
			toks = opt.Tokens(i, r)
		}
		if toks != nil {
			buf = tokenKeys(buf[:0], toks, bt)
			keys, blockTok, prompt = buf, int64(bt), int64(len(toks))
		} else if len(keys) == 0 {
			t := text(i, r)
			buf = load.BlockKeys(buf[:0], t, bt)
			keys, blockTok, prompt = buf, int64(bt), int64(load.TextTokens(t))
			if a := w.AnswerBytes(i); a > 0 && !opt.PromptsOnly {
				held := min(a/(bt*load.BytesPerToken), len(keys))
				caches[res.Replica[r.AnswerOf]].touch(keys[:held], blockTok)
			}
		}
		for k, c := range caches {
			hits[k] = min(int64(c.leading(keys))*blockTok, prompt)
		}
		best := choose(i, hits, res.Work, prompt, total)
		u := prompt - hits[best]
		res.Replica[i] = best
		res.HitTokens += hits[best]
		res.PromptTokens += prompt
		res.Work[best] += u
		total += u
		caches[best].touch(keys, blockTok)
	}
	return res
}

// pick returns the replica for a request of prompt tokens that hits hits[k]
// tokens on replica k, given each replica's work and their sum total.
func pick(hits, work []int64, prompt, total int64, loadCap float64) int {
	n := float64(len(work))
	best := -1
	for k := range work {
		u := prompt - hits[k]
		if loadCap > 0 && float64(work[k]+u)*n > loadCap*float64(total+u) {
			continue
		}
		if best < 0 || hits[k] > hits[best] || (hits[k] == hits[best] && work[k] < work[best]) {
			best = k
		}
	}
	if best >= 0 {
		return best
	}
	// Nobody within the cap: the least loaded, the longest hit among equals.
	best = 0
	for k := 1; k < len(work); k++ {
		if work[k] < work[best] || (work[k] == work[best] && hits[k] > hits[best]) {
			best = k
		}
	}
	return best
}

// tokenKeys appends to dst a chained key for each whole block of bt tokens
// of toks: two token sequences share their first k keys exactly when they
// share their first k blocks (but for 64-bit collisions).
func tokenKeys(dst []uint64, toks []uint32, bt int) []uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i+bt <= len(toks); i += bt {
		for _, t := range toks[i : i+bt] {
			h = (h ^ uint64(t)) * prime
		}
		dst = append(dst, h)
	}
	return dst
}
