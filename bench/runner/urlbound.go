package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/oracle"
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/precise"
)

// URLBound describes the fleet behind RunURL's endpoint, for the bounds of
// what it could reuse: without it RunURL computes none (its fleet is not
// simulated here). Every prompt is counted in the engine's own tokens, as
// its renderer gives them, over the messages each request was really sent
// with (the answers its conversation received included).
type URLBound struct {
	// RenderURL is a replica (or render process) of the fleet serving POST
	// /v1/chat/completions/render, else /tokenize; "" computes no bound.
	RenderURL string
	// BlockTokens is the engines' KV block size in tokens.
	BlockTokens int
	// Replicas is the number of replicas (data-parallel ranks counted
	// apart), CacheBlocks each one's KV cache in blocks.
	Replicas, CacheBlocks int
	// AdminURL, when the endpoint is kvroute, is its admin listener: the
	// report then gives kvroute's split of the run's prompt tokens
	// (kvroute_reuse_tokens_total, counted over the run). "" for none.
	AdminURL string
}

// reuseSince returns kvroute's reuse split at b.AdminURL less before (nil
// without an AdminURL or when /metrics cannot be read).
func (b URLBound) reuseSince(before map[string]int64) map[string]int64 {
	if b.AdminURL == "" {
		return nil
	}
	mfs, err := (&kvrouteInstance{admin: b.AdminURL}).gather()
	if err != nil {
		return nil
	}
	now := counterByLabel(mfs, "kvroute_reuse_tokens_total", "kind")
	for k, n := range before {
		now[k] -= n
	}
	return now
}

// check reports what is missing from a URLBound that asks for a bound.
func (b URLBound) check() error {
	if b.RenderURL == "" {
		return nil
	}
	if b.BlockTokens <= 0 || b.Replicas <= 0 || b.CacheBlocks <= 0 {
		return errors.New("a bound of the fleet behind --url needs its block size, replicas and cache blocks (--bound-block-tokens, --bound-replicas, --bound-cache-blocks) beside --bound-render-url")
	}
	return nil
}

// renderWorkers is how many renders of a bound run at once.
const renderWorkers = 8

// renderSent renders, through b.RenderURL, the messages each request of sent
// was sent with (nil entries stay nil: requests not sent).
func (b URLBound) renderSent(ctx context.Context, model string, sent [][]load.Message) ([][]uint32, error) {
	r, err := precise.NewRenderer(precise.RenderOptions{URL: b.RenderURL, Timeout: 30 * time.Second, CacheBytes: -1, PrefixAfter: -1, MaxConns: renderWorkers})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	out := make([][]uint32, len(sent))
	errs := make([]error, renderWorkers)
	next := make(chan int)
	var wg sync.WaitGroup
	for w := range renderWorkers {
		wg.Go(func() {
			for i := range next {
				if errs[w] != nil {
					continue
				}
				body, err := json.Marshal(struct {
					Model    string         `json:"model"`
					Messages []load.Message `json:"messages"`
				}{model, sent[i]})
				if err == nil {
					out[i], err = r.Render(ctx, oai.KindChat, body, nil)
				}
				if err != nil {
					errs[w] = fmt.Errorf("rendering request %d: %w", i, err)
				}
			}
		})
	}
	for i := range sent {
		if sent[i] != nil {
			next <- i
		}
	}
	close(next)
	wg.Wait()
	return out, errors.Join(errs...)
}

// oracleOf computes the ideal, the finite-cache bound and the pooled bound
// of w's requests as the engines saw them (toks, by request).
func (b URLBound) oracleOf(w *load.Workload, toks [][]uint32) *Oracle {
	capacity := int64(b.CacheBlocks) * int64(b.BlockTokens)
	tokens := func(i int, _ *load.Request) []uint32 {
		if toks[i] == nil {
			return []uint32{} // not sent: no prompt
		}
		return toks[i]
	}
	opt := oracle.Options{Replicas: b.Replicas, BlockTokens: b.BlockTokens, CapacityTokens: capacity, LoadCap: oracle.DefaultLoadCap, Tokens: tokens}
	pooled := opt
	pooled.Replicas, pooled.CapacityTokens, pooled.LoadCap = 1, capacity*int64(b.Replicas), 0
	p := figureOf(oracle.Bound(w, pooled))
	return &Oracle{
		Ideal:          figureOf(oracle.Bound(w, oracle.IdealOptions(opt))),
		Bound:          figureOf(oracle.Bound(w, opt)),
		Pooled:         &p,
		CapacityTokens: capacity,
		LoadCap:        oracle.DefaultLoadCap,
		EngineTokens:   true,
	}
}

// reportedHits sums the cached prompt tokens the endpoint reported.
func reportedHits(out *load.Result) int64 {
	var n int64
	for i := range out.Samples {
		if s := &out.Samples[i]; s.CachedReported {
			n += int64(s.CachedTokens)
		}
	}
	return n
}
