package runner

import (
	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/oracle"
	"github.com/kvroute/kvroute/bench/sim"
)

// Oracle is what perfect placement could reuse on a run's workload, in its
// arrival order, over its fleet (bench/oracle).
type Oracle struct {
	// Ideal is one server with an unbounded cache; its hit rate is
	// Report.IdealHitRate.
	Ideal OracleFigure `json:"ideal"`
	// Bound is the finite-cache bound: each request on the replica holding
	// its longest cached prefix among those within LoadCap × the mean
	// prefill work, over Replicas LRU caches of CapacityTokens each.
	Bound OracleFigure `json:"bound"`
	// CapacityTokens is each replica's cache in tokens: its GPU blocks and
	// its host tier's, if any (the replicas reuse prefixes from both).
	CapacityTokens int64   `json:"capacity_tokens"`
	LoadCap        float64 `json:"load_cap"`
	// Pooled is one LRU cache of the whole fleet's capacity, no load cap:
	// what a fleet reuses at most if it shared one cache (RunURL only).
	Pooled *OracleFigure `json:"pooled,omitempty"`
	// EngineTokens says the figures count the engines' own tokens, from
	// their renderer (RunURL with a URLBound), rather than the workload's.
	EngineTokens bool `json:"engine_tokens,omitempty"`
}

// OracleFigure is one oracle placement's outcome.
type OracleFigure struct {
	HitTokens    int64   `json:"hit_tokens"`
	PromptTokens int64   `json:"prompt_tokens"`
	HitRate      float64 `json:"hit_rate"`
	// PrefillImbalance is the busiest replica's prefill work over the mean.
	PrefillImbalance float64 `json:"prefill_max_mean"`
}

// computeOracle places w over replicas replicas configured as cfg.
func computeOracle(w *load.Workload, replicas int, cfg sim.Config) *Oracle {
	capacity := int64(cfg.NumGPUBlocks+cfg.HostBlocks) * int64(cfg.BlockSize)
	return &Oracle{
		Ideal:          figureOf(oracle.Ideal(w, cfg.BlockSize)),
		Bound:          boundOf(w, replicas, cfg.BlockSize, capacity),
		CapacityTokens: capacity,
		LoadCap:        oracle.DefaultLoadCap,
	}
}

func figureOf(r *oracle.Result) OracleFigure {
	return OracleFigure{HitTokens: r.HitTokens, PromptTokens: r.PromptTokens, HitRate: r.HitRate(), PrefillImbalance: r.WorkMaxMean()}
}

// boundOptions are the options of the finite-cache bound of replicas
// caches of capacity tokens.
func boundOptions(replicas, blockTokens int, capacity int64) oracle.Options {
	return oracle.Options{Replicas: replicas, BlockTokens: blockTokens, CapacityTokens: capacity, LoadCap: oracle.DefaultLoadCap}
}

// boundOf is the finite-cache bound of w over replicas caches of capacity
// tokens.
func boundOf(w *load.Workload, replicas, blockTokens int, capacity int64) OracleFigure {
	return figureOf(oracle.Bound(w, boundOptions(replicas, blockTokens, capacity)))
}

// scorePinned sets res's PinnedBound, the bound with each replica's GPU
// cache less the share of it that res's run kept pinned, and res's hits
// as a fraction of it; nothing without an oracle or pinned blocks.
func (res *RouterResult) scorePinned(o *Oracle, w *load.Workload, replicas int, cfg sim.Config) {
	if o == nil || res.PinnedShare <= 0 {
		return
	}
	gpu := float64(int64(cfg.NumGPUBlocks) * int64(cfg.BlockSize))
	b := boundOf(w, replicas, cfg.BlockSize, o.CapacityTokens-int64(res.PinnedShare*gpu))
	res.PinnedBound = &b
	res.OfPinnedBound = ratio(res.HitTokens, b.HitTokens)
}

// scoreAgainst sets res's hits as fractions of the oracle's.
func (res *RouterResult) scoreAgainst(o *Oracle) {
	if o == nil {
		return
	}
	res.OfBound = ratio(res.HitTokens, o.Bound.HitTokens)
	res.OfIdeal = ratio(res.HitTokens, o.Ideal.HitTokens)
	if o.Pooled != nil {
		res.OfPooled = ratio(res.HitTokens, o.Pooled.HitTokens)
	}
}

// scorePlacement sets res's OwnPlacement: res's own placement (the replica
// each request was answered by) replayed over the bound's caches, and its
// hits as a fraction of the bound's. It tells a router's choices apart
// from what the replicas' caches did with them: running requests that pin
// blocks, queueing, answers cached beside the prompts. Nothing without an
// oracle or when no answer named its replica (routers other than kvroute).
func (res *RouterResult) scorePlacement(o *Oracle, w *load.Workload, replicas int, cfg sim.Config) {
	if o == nil || res.placed == 0 {
		return
	}
	p := figureOf(oracle.Replay(w, res.placement, boundOptions(replicas, cfg.BlockSize, o.CapacityTokens)))
	res.OwnPlacement = &p
	res.OwnPlacementOfBound = ratio(p.HitTokens, o.Bound.HitTokens)
}

// recordPlacement keeps the replica that answered each of samples, as an
// index into names (-1 where no answer named one of them).
func (res *RouterResult) recordPlacement(samples []load.Sample, names []string) {
	index := make(map[string]int, len(names))
	for i, n := range names {
		index[n] = i
	}
	res.placement = make([]int, len(samples))
	for i := range samples {
		k, ok := index[samples[i].Replica]
		if !ok || !samples[i].Sent {
			k = -1
		} else {
			res.placed++
		}
		res.placement[i] = k
	}
}
