package load

import (
	"math"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestSummarize(t *testing.T) {
	r := &Result{Wall: 5 * time.Second}
	// TTFT 1..10 s, latency 2× TTFT, 10 tokens each; plus two failures and
	// one request never sent.
	for i := 1; i <= 10; i++ {
		r.Samples = append(r.Samples, Sample{
			TTFT: time.Duration(i) * time.Second, Latency: time.Duration(2*i) * time.Second,
			OutputTokens: 10, PromptTokens: 100, CachedTokens: 25, CachedReported: i <= 4,
			Status: 200, Sent: true,
		})
	}
	r.Samples = append(r.Samples,
		Sample{Status: 503, ErrKind: "http_503", Sent: true, TTFT: 100 * time.Second},
		Sample{Status: 0, ErrKind: ErrTransport, Sent: true},
		Sample{ErrKind: ErrNotSent},
	)
	s := r.Summarize(4*time.Second, 1)
	if s.Requests != 12 || s.OK != 10 || s.Errors != 2 || s.NotSent != 1 ||
		s.ErrorsByKind["http_503"] != 1 || s.ErrorsByKind[ErrTransport] != 1 {
		t.Fatalf("counts %+v", s)
	}
	// numpy.percentile([1..10], [50, 90, 99]) = 5.5, 9.1, 9.91.
	want := Percentiles{P50: 5.5, P90: 9.1, P99: 9.91, Mean: 5.5}
	if !near(s.TTFT.P50, want.P50) || !near(s.TTFT.P90, want.P90) || !near(s.TTFT.P99, want.P99) || !near(s.TTFT.Mean, want.Mean) {
		t.Fatalf("TTFT %+v, want %+v", s.TTFT, want)
	}
	if !near(s.Latency.P50, 11) || !near(s.Latency.P99, 19.82) || !near(s.Latency.Mean, 11) {
		t.Fatalf("latency %+v", s.Latency)
	}
	if !near(s.Wall, 5) || !near(s.Throughput, 2) || !near(s.TokensPerSec, 20) || !near(s.Goodput, 0.8) {
		t.Fatalf("rates %+v", s)
	}
	if s.CachedReported != 4 || !near(s.ReportedHitRate, 0.25) {
		t.Fatalf("hit rate %v over %d", s.ReportedHitRate, s.CachedReported)
	}

	// Time scale 0.5: the run was twice as fast as the trace, so reported
	// times double and rates halve; the goodput target is unscaled.
	s2 := r.Summarize(4*time.Second, 0.5)
	if !near(s2.TTFT.P50, 11) || !near(s2.Wall, 10) || !near(s2.Throughput, 1) || !near(s2.Goodput, 0.2) {
		t.Fatalf("scaled %+v", s2)
	}

	cdf := r.TTFTCDF(5, 1)
	wantCDF := [][2]float64{{2, 0.2}, {4, 0.4}, {6, 0.6}, {8, 0.8}, {10, 1}}
	if len(cdf) != 5 {
		t.Fatalf("cdf %v", cdf)
	}
	for i := range cdf {
		if !near(cdf[i][0], wantCDF[i][0]) || !near(cdf[i][1], wantCDF[i][1]) {
			t.Fatalf("cdf %v, want %v", cdf, wantCDF)
		}
	}
	if c := r.TTFTCDF(3, 0.5); !near(c[2][0], 20) || !near(c[0][0], 8) {
		t.Fatalf("scaled cdf %v", c)
	}
	if (&Result{}).TTFTCDF(10, 1) != nil {
		t.Fatal("cdf of nothing")
	}
	if z := (&Result{}).Summarize(0, 0); z.Requests != 0 || z.Throughput != 0 {
		t.Fatalf("empty %+v", z)
	}
}
