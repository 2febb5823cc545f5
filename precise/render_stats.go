package precise

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// RenderStats is a snapshot of a Renderer's counters. Every Render call is
// counted once in Latency and in exactly one of CacheHits, PassThrough,
// Prefix, Rendered, Tokenized or the Fallback counters; the background
// render of a Prefix call, and the render a call left at its deadline
// (FallbackTimeout) or did not wait for (FallbackBehind) to finish for the
// next turn, are counted in Rendered
// or Tokenized too, or in VerifyFailed; a Prefix call that found the
// background renders all running made none, and is counted in Unverified.
type RenderStats struct {
	// Rendered counts calls answered by a render endpoint, Tokenized those
	// answered by /tokenize (render not served).
	Rendered, Tokenized uint64
	// CacheHits counts calls answered from the cache (the same body
	// rendered before), PassThrough completions whose prompt is token ids.
	CacheHits, PassThrough uint64
	// Prefix counts RenderPrefix calls answered with their previous turn's
	// tokens. Late counts renders that answered after their call's
	// deadline and were cached for the conversation's next turn.
	// VerifyFailed counts the background renders (of Prefix calls, and
	// those left at a deadline) that failed; Unverified the Prefix calls
	// that made none, the renderer being that far behind.
	Prefix, Late, VerifyFailed, Unverified uint64
	// Fallbacks by reason: the deadline passed, neither render nor
	// tokenize is served, the request's blocks are keyed by more than its
	// tokens (ErrRenderUnkeyed), the renderer is behind and the call did
	// not wait (ErrRenderBehind), or any other error (a status other than
	// 200, a bad answer, a request that cannot be rendered, a connection
	// error).
	FallbackTimeout, FallbackNotServed, FallbackUnkeyed, FallbackBehind, FallbackError uint64
	// RenderNotServed counts the times the render endpoint answered as not
	// served (switching to /tokenize); RenderProbes the later tries of it.
	RenderNotServed, RenderProbes uint64
	// Stable and Unstable count the chat renders whose conversation's
	// previous turn was in the cache: Stable when that turn's tokens, but
	// for at most their last one, are a prefix of the new render's.
	// DivergedTokens sums, over the Unstable ones, the previous turn's
	// tokens past the common prefix.
	Stable, Unstable, DivergedTokens uint64
	// CacheEntries and CacheBytes are what the cache holds now;
	// CacheEvictions counts entries dropped to stay within its bound.
	CacheEntries, CacheBytes, CacheEvictions uint64
	// Latency is the distribution of the time Render calls took, from
	// entry to return, whatever their outcome.
	Latency RenderLatency
	// LastSuccess and LastFallback are when a call last returned tokens
	// (or a render that missed its call's deadline answered, as Late) and
	// last returned an error other than ErrRenderUnkeyed (zero: never):
	// whether renders succeed now (Failing), for the replicas' precise
	// mode.
	LastSuccess, LastFallback time.Time
	// TokenizeOnly says that the render endpoint answered as not served
	// and /tokenize is used until a probe finds it again.
	TokenizeOnly bool
}

// FailingAfter is how long renders must fail without one success before
// Failing says so: one timeout in a burst does not make every replica
// approximate.
const FailingAfter = time.Second

// Failing reports whether renders fail at now: a call failed since the
// last success, which is FailingAfter old or more (or never was).
func (s RenderStats) Failing(now time.Time) bool {
	return s.LastFallback.After(s.LastSuccess) && now.Sub(s.LastSuccess) >= FailingAfter
}

// Fallbacks is the number of Render calls that returned an error.
func (s RenderStats) Fallbacks() uint64 {
	return s.FallbackTimeout + s.FallbackNotServed + s.FallbackUnkeyed + s.FallbackBehind + s.FallbackError
}

// RenderLatency summarizes a latency distribution. Quantiles are upper
// bounds of the histogram bucket they fall in (at most 1/8 above the true
// value).
type RenderLatency struct {
	Count         uint64
	Sum           time.Duration
	P50, P90, P99 time.Duration
	Max           time.Duration
}

// renderCounters are a Renderer's atomic counters.
type renderCounters struct {
	rendered, tokenized, hits, pass            atomic.Uint64
	prefix, verifyFailed, late, unverified     atomic.Uint64
	fbTimeout, fbNotServed, fbUnkeyed, fbError atomic.Uint64
	fbBehind                                   atomic.Uint64
	notServed, probes                          atomic.Uint64
	stable, unstable, diverged                 atomic.Uint64
	lastSuccess, lastFallback                  atomic.Int64 // unix nanoseconds
	latency                                    rdHistogram
}

// rdSubBits is the number of bits of a duration below its leading one that
// pick its bucket: 8 buckets per power of two.
const rdSubBits = 3

// rdHistogram is a lock-free log-linear histogram of durations in
// nanoseconds: bucket (e, s) holds durations whose leading one is bit e and
// whose next rdSubBits bits are s.
type rdHistogram struct {
	buckets [64 << rdSubBits]atomic.Uint64
	count   atomic.Uint64
	sum     atomic.Int64
	max     atomic.Int64
}

func rdBucket(ns uint64) int {
	if ns < 1<<rdSubBits {
		return int(ns)
	}
	e := bits.Len64(ns) - 1
	s := (ns >> (e - rdSubBits)) & (1<<rdSubBits - 1)
	return (e-rdSubBits+1)<<rdSubBits | int(s)
}

// rdBucketTop is the largest duration of bucket i.
func rdBucketTop(i int) uint64 {
	if i < 1<<rdSubBits {
		return uint64(i) //nolint:gosec // a bucket index, not negative
	}
	e := i>>rdSubBits + rdSubBits - 1
	s := uint64(i & (1<<rdSubBits - 1))
	lo := (1<<rdSubBits | s) << (e - rdSubBits)
	return lo + 1<<(e-rdSubBits) - 1
}

func (h *rdHistogram) record(d time.Duration) {
	ns := max(int64(d), 0)
	h.buckets[rdBucket(uint64(ns))].Add(1)
	h.count.Add(1)
	h.sum.Add(ns)
	for {
		m := h.max.Load()
		if ns <= m || h.max.CompareAndSwap(m, ns) {
			return
		}
	}
}

func (h *rdHistogram) summary() RenderLatency {
	var counts [len(h.buckets)]uint64
	var n uint64
	for i := range h.buckets {
		counts[i] = h.buckets[i].Load()
		n += counts[i]
	}
	s := RenderLatency{Count: n, Sum: time.Duration(h.sum.Load()), Max: time.Duration(h.max.Load())}
	quantile := func(q float64) time.Duration {
		if n == 0 {
			return 0
		}
		rank := uint64(q*float64(n)-1e-9) + 1 // 1-based rank of the quantile
		var seen uint64
		for i, c := range counts {
			if seen += c; seen >= rank {
				return min(time.Duration(rdBucketTop(i)), s.Max) //nolint:gosec // bucket tops fit a duration
			}
		}
		return s.Max
	}
	s.P50, s.P90, s.P99 = quantile(0.50), quantile(0.90), quantile(0.99)
	return s
}
