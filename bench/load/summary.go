package load

import (
	"math"
	"slices"
	"time"
)

// Percentiles summarizes a distribution, in seconds.
type Percentiles struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
}

// Summary aggregates a Result. Times are in unscaled (trace) seconds.
type Summary struct {
	// Requests is the number of requests sent.
	Requests int `json:"requests"`
	// OK is the number of successful requests; Errors the others.
	OK     int `json:"ok"`
	Errors int `json:"errors"`
	// ErrorsByKind counts the failed requests by Sample.ErrKind.
	ErrorsByKind map[string]int `json:"errors_by_kind,omitempty"`
	// NotSent counts the requests never sent (the run was canceled).
	NotSent int `json:"not_sent,omitempty"`
	// Wall is the run's duration in seconds.
	Wall float64 `json:"wall_s"`
	// Throughput is successful requests per second.
	Throughput float64 `json:"throughput_rps"`
	// TokensPerSec is output tokens of successful requests per second.
	TokensPerSec float64 `json:"tokens_per_s"`
	// TTFT and Latency are over successful requests.
	TTFT    Percentiles `json:"ttft_s"`
	Latency Percentiles `json:"latency_s"`
	// TPOT is the time per output token after the first, (latency −
	// TTFT) / (output tokens − 1), over successful requests of more than
	// one output token.
	TPOT Percentiles `json:"tpot_s"`
	// Goodput is successful requests per second whose TTFT is at most
	// GoodputTarget (all successful ones when the target is 0).
	Goodput       float64       `json:"goodput_rps"`
	GoodputTarget time.Duration `json:"goodput_target_ns"`
	// ReportedHitRate is the sum of cached prompt tokens over the sum of
	// prompt tokens, from usage, over the successful requests whose usage
	// reported cached_tokens (CachedReported of them; 0 when none did).
	ReportedHitRate float64 `json:"reported_hit_rate"`
	CachedReported  int     `json:"cached_reported"`
}

// Summarize aggregates the samples. Measured durations are divided by
// timeScale (the factor arrivals were multiplied by; 0 means 1) so that the
// summary is in unscaled time: a trace replayed at TimeScale 0.1 against
// replicas also sped up tenfold reports the figures of the original pace.
// ttftTarget is the goodput TTFT bound, in unscaled time.
func (r *Result) Summarize(ttftTarget time.Duration, timeScale float64) Summary {
	if timeScale <= 0 {
		timeScale = 1
	}
	sum := Summary{GoodputTarget: ttftTarget}
	var ttft, lat, tpot []float64
	var tokens, good int
	var cached, prompt int64
	for i := range r.Samples {
		s := &r.Samples[i]
		if !s.Sent {
			sum.NotSent++
			continue
		}
		sum.Requests++
		if !s.OK() {
			sum.Errors++
			if sum.ErrorsByKind == nil {
				sum.ErrorsByKind = make(map[string]int)
			}
			kind := s.ErrKind
			if kind == "" {
				kind = "unknown"
			}
			sum.ErrorsByKind[kind]++
			continue
		}
		sum.OK++
		t := s.TTFT.Seconds() / timeScale
		ttft = append(ttft, t)
		lat = append(lat, s.Latency.Seconds()/timeScale)
		if s.OutputTokens > 1 {
			tpot = append(tpot, (s.Latency-s.TTFT).Seconds()/timeScale/float64(s.OutputTokens-1))
		}
		tokens += s.OutputTokens
		if ttftTarget <= 0 || t <= ttftTarget.Seconds() {
			good++
		}
		if s.CachedReported {
			sum.CachedReported++
			cached += int64(s.CachedTokens)
			prompt += int64(s.PromptTokens)
		}
	}
	sum.Wall = r.Wall.Seconds() / timeScale
	if sum.Wall > 0 {
		sum.Throughput = float64(sum.OK) / sum.Wall
		sum.TokensPerSec = float64(tokens) / sum.Wall
		sum.Goodput = float64(good) / sum.Wall
	}
	sum.TTFT = percentiles(ttft)
	sum.Latency = percentiles(lat)
	sum.TPOT = percentiles(tpot)
	if prompt > 0 {
		sum.ReportedHitRate = float64(cached) / float64(prompt)
	}
	return sum
}

// percentiles sorts xs and summarizes it.
func percentiles(xs []float64) Percentiles {
	if len(xs) == 0 {
		return Percentiles{}
	}
	slices.Sort(xs)
	var total float64
	for _, x := range xs {
		total += x
	}
	return Percentiles{
		P50:  quantile(xs, 0.50),
		P90:  quantile(xs, 0.90),
		P99:  quantile(xs, 0.99),
		Mean: total / float64(len(xs)),
	}
}

// quantile returns the q-quantile of sorted xs, interpolating linearly
// between the closest ranks (rank q*(n-1), numpy's default).
func quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	pos := q * float64(n-1)
	lo := int(math.Floor(pos))
	if lo >= n-1 {
		return sorted[n-1]
	}
	frac := pos - float64(lo)
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// TTFTCDF returns the empirical CDF of the successful requests' TTFT, in
// unscaled seconds (divided by timeScale; 0 means 1), as points pairs
// {ttft, fraction} at fractions q = 1/points, 2/points, ..., 1: ttft is the
// smallest measured TTFT such that at least a fraction q of the requests
// had a TTFT at most that (nearest rank). It returns nil when no request
// succeeded.
func (r *Result) TTFTCDF(points int, timeScale float64) [][2]float64 {
	if timeScale <= 0 {
		timeScale = 1
	}
	if points <= 0 {
		points = 100
	}
	var xs []float64
	for i := range r.Samples {
		if s := &r.Samples[i]; s.OK() {
			xs = append(xs, s.TTFT.Seconds()/timeScale)
		}
	}
	if len(xs) == 0 {
		return nil
	}
	slices.Sort(xs)
	out := make([][2]float64, points)
	for k := range out {
		q := float64(k+1) / float64(points)
		rank := ((k+1)*len(xs)+points-1)/points - 1 // ceil(q*n) - 1, exactly
		out[k] = [2]float64{xs[rank], q}
	}
	return out
}

// Filter returns a Result of the samples keep accepts (given each
// sample's index in r and the sample), in order, with r's Wall: to
// summarize a part of a run, one tenant's requests for instance.
func (r *Result) Filter(keep func(i int, s *Sample) bool) *Result {
	out := &Result{Wall: r.Wall}
	for i := range r.Samples {
		if keep(i, &r.Samples[i]) {
			out.Samples = append(out.Samples, r.Samples[i])
		}
	}
	return out
}
