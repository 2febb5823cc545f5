package backends

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Snapshot is one poll of a replica's /metrics, immutable once published.
//
// Where a replica exposes several series of one metric (several model_name
// labels, vLLM data-parallel engines, SGLang dp ranks), counts, counters and
// capacities are summed and usage is the maximum. A zero field means zero or
// unknown; the field comments say which.
type Snapshot struct {
	// At is when the response was received; zero from [ParseMetrics], set by
	// the poller.
	At time.Time

	// Waiting is the number of requests queued in the engine
	// (vllm:num_requests_waiting, sglang:num_queue_reqs).
	Waiting float64
	// Running is the number of requests in the engine's running batch
	// (vllm:num_requests_running, sglang:num_running_reqs).
	Running float64
	// KVUsage is the used fraction of the KV cache, 0..1
	// (vllm:kv_cache_usage_perc, or the older vllm:gpu_cache_usage_perc;
	// sglang:token_usage). Values outside 0..1 are clamped.
	KVUsage float64
	// KVCapacityTokens is the KV cache size in tokens: for vLLM the sum over
	// vllm:cache_config_info series of num_gpu_blocks×block_size; for SGLang
	// sglang:max_total_num_tokens. 0 when unknown.
	KVCapacityTokens int64
	// BlockSize is the engine's cache granularity in tokens (only whole blocks
	// hit): vLLM's block_size label of vllm:cache_config_info (the largest if
	// several); for SGLang always 1, its default page size, because SGLang does
	// not export its page size (a server run with --page-size N is
	// under-reported). 0 when unknown.
	BlockSize int
	// PrefixHits and PrefixQueries are the engine's cumulative prefix-cache
	// counters in tokens: vllm:prefix_cache_hits_total and
	// vllm:prefix_cache_queries_total (older vllm:gpu_prefix_cache_*_total);
	// for SGLang sglang:cached_tokens_total (all cache_source labels) and
	// sglang:prompt_tokens_total. Both 0 when the engine exposes no such pair
	// (older SGLang exposes only the sglang:cache_hit_rate gauge, which
	// cannot be turned into monotonic counters: see CacheHitRate). Hit ratio
	// over an interval is ΔPrefixHits/ΔPrefixQueries between two snapshots;
	// counters reset when the engine restarts.
	PrefixHits, PrefixQueries float64
	// CacheHitRate is the engine's own prefix-cache hit ratio, 0..1:
	// sglang:cache_hit_rate (recent batches; mean over series), or vLLM V0's
	// vllm:gpu_prefix_cache_hit_rate; otherwise PrefixHits/PrefixQueries over
	// the engine's lifetime. 0 when unknown.
	CacheHitRate float64

	// InFlightAtScrape is the fleet-wide in-flight count for this replica
	// ([Replica.Load]: this router's and its peers') just before the scrape
	// was sent.
	InFlightAtScrape int64
	// DispatchedAtScrape is the router's dispatched counter for this replica
	// ([Replica.Dispatched]) just before the scrape was sent;
	// Dispatched()-DispatchedAtScrape is the number of requests the snapshot
	// cannot have seen yet.
	DispatchedAtScrape uint64
}

// Metric names read by ParseMetrics.
const (
	vllmWaiting          = "vllm:num_requests_waiting"
	vllmRunning          = "vllm:num_requests_running"
	vllmKVUsage          = "vllm:kv_cache_usage_perc"
	vllmKVUsageOld       = "vllm:gpu_cache_usage_perc"
	vllmCacheConfig      = "vllm:cache_config_info"
	vllmPrefixHits       = "vllm:prefix_cache_hits_total"
	vllmPrefixQueries    = "vllm:prefix_cache_queries_total"
	vllmPrefixHitsOld    = "vllm:gpu_prefix_cache_hits_total"
	vllmPrefixQueriesOld = "vllm:gpu_prefix_cache_queries_total"
	vllmHitRateV0        = "vllm:gpu_prefix_cache_hit_rate"

	sglWaiting     = "sglang:num_queue_reqs"
	sglRunning     = "sglang:num_running_reqs"
	sglTokenUsage  = "sglang:token_usage"
	sglMaxTokens   = "sglang:max_total_num_tokens"
	sglHitRate     = "sglang:cache_hit_rate"
	sglCached      = "sglang:cached_tokens_total"
	sglPromptTotal = "sglang:prompt_tokens_total"
)

// maxTokens bounds a capacity so it fits an int64 with room to add.
const maxTokens = 1 << 53

// ErrNoEngineMetrics is returned (wrapped) by [ParseMetrics] when the input is
// valid exposition text but holds none of the engine's load metrics, e.g. a
// replica configured with the wrong engine.
var ErrNoEngineMetrics = errors.New("no engine load metrics found")

// ParseMetrics parses Prometheus text exposition (format 0.0.4, as served by
// vLLM and SGLang on /metrics) and extracts engine's load signals. Metric names
// may contain ':' (vLLM and SGLang use it). Samples that are NaN, infinite or
// negative are ignored. It returns an error for input that does not parse, for
// an unknown engine, and (wrapping [ErrNoEngineMetrics]) when none of the
// engine's waiting, running or KV-usage gauges is present. At and the
// *AtScrape fields are left zero. It never panics.
func ParseMetrics(r io.Reader, engine Engine) (snap Snapshot, err error) {
	return ParseRankMetrics(r, engine, -1)
}

// Labels that name an engine's data-parallel rank in its metrics.
const (
	vllmRankLabel = "engine"
	sglRankLabel  = "dp_rank"
)

// ParseRankMetrics is [ParseMetrics] over the series of one data-parallel
// rank of the engine, rank ≥ 0: those whose rank label (vLLM's engine,
// SGLang's dp_rank) is rank, and those without one, which describe the
// whole server. A negative rank reads every series, as ParseMetrics.
func ParseRankMetrics(r io.Reader, engine Engine, rank int) (snap Snapshot, err error) {
	defer func() {
		if p := recover(); p != nil {
			snap, err = Snapshot{}, fmt.Errorf("backends: metrics parser panicked: %v", p)
		}
	}()
	if !engine.Known() {
		return Snapshot{}, fmt.Errorf("backends: unknown engine %q", engine)
	}
	if r == nil {
		return Snapshot{}, errors.New("backends: nil metrics reader")
	}
	// UTF8Validation accepts every name the legacy scheme accepts (including
	// ':' in metric names) and never rejects a well-formed exposition over a
	// name we do not read anyway.
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Snapshot{}, fmt.Errorf("backends: parse metrics: %w", err)
	}
	if rank >= 0 {
		label := vllmRankLabel
		if engine == EngineSGLang {
			label = sglRankLabel
		}
		keepRank(fams, label, strconv.Itoa(rank))
	}
	switch engine {
	case EngineVLLM:
		snap, err = extractVLLM(fams)
	default:
		snap, err = extractSGLang(fams)
	}
	if err != nil {
		return Snapshot{}, err
	}
	return snap, nil
}

func extractVLLM(fams map[string]*dto.MetricFamily) (Snapshot, error) {
	var s Snapshot
	var okW, okR, okU bool
	var err error
	if s.Waiting, okW, err = sum(fams, vllmWaiting); err != nil {
		return s, err
	}
	if s.Running, okR, err = sum(fams, vllmRunning); err != nil {
		return s, err
	}
	if s.KVUsage, okU = maxOf(fams, vllmKVUsage); !okU {
		s.KVUsage, okU = maxOf(fams, vllmKVUsageOld)
	}
	if !okW && !okR && !okU {
		return Snapshot{}, fmt.Errorf("backends: vllm metrics: %w (%s, %s, %s)",
			ErrNoEngineMetrics, vllmWaiting, vllmRunning, vllmKVUsage)
	}
	s.KVUsage = clamp01(s.KVUsage)

	// Prefer the current counter names; fall back to the pre-0.10 pair. The
	// two generations are never mixed, so the ratio stays meaningful.
	var okP bool
	if s.PrefixHits, s.PrefixQueries, okP, err = counterPair(fams, vllmPrefixHits, vllmPrefixQueries); err != nil {
		return Snapshot{}, err
	}
	if !okP {
		if s.PrefixHits, s.PrefixQueries, _, err = counterPair(fams, vllmPrefixHitsOld, vllmPrefixQueriesOld); err != nil {
			return Snapshot{}, err
		}
	}
	if rate, ok := mean(fams, vllmHitRateV0); ok {
		s.CacheHitRate = clamp01(rate)
	} else if s.PrefixQueries > 0 {
		s.CacheHitRate = clamp01(s.PrefixHits / s.PrefixQueries)
	}

	if mf := fams[vllmCacheConfig]; mf != nil {
		for _, m := range mf.GetMetric() {
			var bs, blocks int64
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "block_size":
					bs = parsePositive(lp.GetValue())
				case "num_gpu_blocks":
					blocks = parsePositive(lp.GetValue())
				}
			}
			if bs > 0 && bs <= math.MaxInt32 && int(bs) > s.BlockSize {
				s.BlockSize = int(bs)
			}
			if bs > 0 && blocks > 0 && blocks <= maxTokens/bs {
				if c := s.KVCapacityTokens + bs*blocks; c <= maxTokens {
					s.KVCapacityTokens = c
				}
			}
		}
	}
	return s, nil
}

func extractSGLang(fams map[string]*dto.MetricFamily) (Snapshot, error) {
	var s Snapshot
	var okW, okR, okU bool
	var err error
	if s.Waiting, okW, err = sum(fams, sglWaiting); err != nil {
		return s, err
	}
	if s.Running, okR, err = sum(fams, sglRunning); err != nil {
		return s, err
	}
	s.KVUsage, okU = maxOf(fams, sglTokenUsage)
	if !okW && !okR && !okU {
		return Snapshot{}, fmt.Errorf("backends: sglang metrics: %w (%s, %s, %s)",
			ErrNoEngineMetrics, sglWaiting, sglRunning, sglTokenUsage)
	}
	s.KVUsage = clamp01(s.KVUsage)
	s.BlockSize = 1

	if tokens, ok, err := sum(fams, sglMaxTokens); err == nil && ok && tokens >= 1 && tokens <= maxTokens {
		s.KVCapacityTokens = int64(tokens)
	}
	if s.PrefixHits, s.PrefixQueries, _, err = counterPair(fams, sglCached, sglPromptTotal); err != nil {
		return Snapshot{}, err
	}
	if rate, ok := mean(fams, sglHitRate); ok {
		s.CacheHitRate = clamp01(rate)
	} else if s.PrefixQueries > 0 {
		s.CacheHitRate = clamp01(s.PrefixHits / s.PrefixQueries)
	}
	return s, nil
}

// counterPair returns the sums of a hits and a queries counter; ok (and the
// values) only when both are present.
// keepRank drops from fams the series whose label is set to another value
// than rank.
func keepRank(fams map[string]*dto.MetricFamily, label, rank string) {
	for _, f := range fams {
		f.Metric = slices.DeleteFunc(f.Metric, func(m *dto.Metric) bool {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					return l.GetValue() != rank
				}
			}
			return false
		})
	}
}

func counterPair(fams map[string]*dto.MetricFamily, hitsName, queriesName string) (hits, queries float64, ok bool, err error) {
	h, okH, err := sum(fams, hitsName)
	if err != nil {
		return 0, 0, false, err
	}
	q, okQ, err := sum(fams, queriesName)
	if err != nil {
		return 0, 0, false, err
	}
	if !okH || !okQ {
		return 0, 0, false, nil
	}
	return h, q, true, nil
}

// value returns the sample of a gauge, counter or untyped metric, and whether
// it is usable (finite and non-negative).
func value(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false
	}
	return v, true
}

// sum adds the usable samples of the named family. ok reports whether there
// was at least one; err is set if the sum overflows.
func sum(fams map[string]*dto.MetricFamily, name string) (total float64, ok bool, err error) {
	mf := fams[name]
	if mf == nil {
		return 0, false, nil
	}
	for _, m := range mf.GetMetric() {
		if v, good := value(m); good {
			total += v
			ok = true
		}
	}
	if math.IsInf(total, 0) {
		return 0, false, fmt.Errorf("backends: metric %s: sum overflows", name)
	}
	return total, ok, nil
}

// maxOf returns the largest usable sample of the named family.
func maxOf(fams map[string]*dto.MetricFamily, name string) (best float64, ok bool) {
	mf := fams[name]
	if mf == nil {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		if v, good := value(m); good && (!ok || v > best) {
			best, ok = v, true
		}
	}
	return best, ok
}

// mean returns the mean of the usable samples of the named family.
func mean(fams map[string]*dto.MetricFamily, name string) (float64, bool) {
	mf := fams[name]
	if mf == nil {
		return 0, false
	}
	var total float64
	var n int
	for _, m := range mf.GetMetric() {
		if v, good := value(m); good {
			total += v
			n++
		}
	}
	if n == 0 || math.IsInf(total, 0) {
		return 0, false
	}
	return total / float64(n), true
}

func clamp01(v float64) float64 {
	switch {
	case !(v > 0): // also NaN
		return 0
	case v > 1:
		return 1
	}
	return v
}

// parsePositive parses a decimal label value such as "16" or "27000"; 0 for
// anything else ("None", "", negative, overflowing).
func parsePositive(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
