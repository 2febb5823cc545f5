package router

import "math"

// cacheAwareModule registers cache_aware (cacheaware.go).
var cacheAwareModule = Module[CacheAwareConfig]{
	Name:    CacheAwareName,
	Summary: "score `s(r) = m_r − (λ·q_r + ν·P_r)/w_r − μ·k_r`: matched prefix tokens in whole engine blocks, less λ per queued request and ν per prompt token kvroute sent to `r` that is not yet prefilled (both per unit of `weight`), and μ × KV usage; with the guard rails below",
	Defaults: CacheAwareConfig{Lambda: 2048, Mu: 4096, Nu: 0.1, Epsilon: 0.25, BoundFloor: 8,
		MinMatchTokens: 256, BranchBalance: 1.25},
	New: func(d Deps, cfg *Live[CacheAwareConfig]) Policy {
		return newCacheAware(d.Index, cfg, d.Sessions, d.coord)
	},
}

// CacheAwareConfig is cache_aware's section, policies.cache_aware: the
// prices of its score s(r) = m_r − (λ·q_r + ν·P_r)/w_r − μ·k_r, in tokens
// of matched prefix, and its guard rails.
type CacheAwareConfig struct {
	// Lambda is the price (λ) of one queued request, in tokens of matched
	// prefix. Default 2048.
	Lambda float64 `mapstructure:"lambda"`
	// Mu is the price (μ) of full KV memory (usage 1.0), in tokens of
	// matched prefix. Default 4096.
	Mu float64 `mapstructure:"mu"`
	// Nu is the price (ν) of one prompt token sent to a replica and not yet
	// prefilled (no response byte yet), in tokens of matched prefix: the
	// prefill queued ahead of a request that matches a cached prefix.
	// Below 1 because a kept prefix is worth more than this request's
	// saving: the conversation's later turns hit it too. Cold requests
	// always count pending prefill at face value. Default 0.1.
	Nu float64 `mapstructure:"nu"`
	// Epsilon bounds load: no replica above (1+ε)·mean load is chosen unless
	// all are, or unless its matched prefix, beyond the best match among
	// those within, pays for the requests past the bound at lambda tokens
	// each. A conversation's next turn is moved by the work cap instead
	// (turn_price), while branch_balance is on. Default 0.25.
	Epsilon float64 `mapstructure:"epsilon"`
	// BoundFloor is how many requests in flight a replica (of weight 1;
	// a weight-w replica w times as many) may carry whatever the load
	// bound's proportion says, while its engine's last fresh metrics show
	// no request waiting. (1+ε)·mean is a proportion: with a few requests
	// in flight it would pass over a replica for a single one, while the
	// engine batches all it has. 0: the proportion alone. Default 8.
	BoundFloor int `mapstructure:"bound_floor"`
	// MinMatchTokens: a best match shorter than this many tokens, and
	// shorter than half the prompt, makes a cold request (a short prompt's
	// shared prefix is followed). Default 256.
	MinMatchTokens int `mapstructure:"min_match_tokens"`
	// BranchBalance: a request that starts a new branch of a shared prefix
	// (a new conversation after a common system prompt) stays with a
	// replica holding the prefix while that replica's recent prefill work
	// (halved every index.ttl; each request counted as the engine reported
	// it, prompt less cached tokens, once its usage came, else as
	// predicted), the request's included, is within this multiple of the
	// mean; else it goes to the replica with the least, which then holds
	// the prefix too. 0 turns the rule off. Default 1.25.
	BranchBalance float64 `mapstructure:"branch_balance"`
	// TurnPrice is the share of the load prices (λ, ν, μ) a
	// conversation's next turn pays against its cached prefix, from 0 to
	// 1. At 0 a next turn stays with the replica holding its longest
	// prefix unless that replica is busy (prefill of this router's
	// requests pending, or bound_floor requests in flight) and its recent
	// prefill work is above branch_balance of the mean (the work cap that
	// also places new branches); with the work cap on, the load bound
	// (epsilon) does not move a next turn, only a prompt sent again whole.
	// At 1 it is scored like any request, and leaves for a shorter queue
	// once the queue's price passes what it would compute again elsewhere.
	// Default 0.
	TurnPrice float64 `mapstructure:"turn_price"`
}

// Validate implements Validator.
func (c *CacheAwareConfig) Validate() error {
	var fe fieldErrors
	for _, p := range []struct {
		key string
		v   float64
	}{{"lambda", c.Lambda}, {"mu", c.Mu}, {"nu", c.Nu}, {"epsilon", c.Epsilon}} {
		nonNegative(&fe, p.key, p.v)
	}
	if c.BoundFloor < 0 {
		fe.add("bound_floor", "must not be negative, got %d", c.BoundFloor)
	}
	if c.MinMatchTokens < 0 {
		fe.add("min_match_tokens", "must not be negative, got %d", c.MinMatchTokens)
	}
	if !(c.TurnPrice >= 0 && c.TurnPrice <= 1) {
		fe.add("turn_price", "must be from 0 to 1, got %v", c.TurnPrice)
	}
	if c.BranchBalance != 0 && !(c.BranchBalance >= 1 && !math.IsInf(c.BranchBalance, 0)) {
		fe.add("branch_balance", "must be 0 (off) or at least 1, got %v", c.BranchBalance)
	}
	return fe.err()
}

// nonNegative adds an error for key unless v is zero or a positive finite
// number.
func nonNegative(fe *fieldErrors, key string, v float64) {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		fe.add(key, "must be zero or a positive number, got %v", v)
	}
}
