package cluster

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The counter's buckets and quantiles agree with sorting the lags.
func TestLagCounter(t *testing.T) {
	for _, tc := range []struct {
		name string
		lags []time.Duration
	}{
		{name: "one", lags: []time.Duration{300 * time.Microsecond}},
		{name: "on bounds", lags: []time.Duration{100 * time.Microsecond, time.Millisecond, time.Second}},
		{name: "negative and above the last bound", lags: []time.Duration{-time.Millisecond, 3 * time.Second, 2 * time.Second}},
		{name: "random", lags: randomLags(500)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c lagCounter
			var sum time.Duration
			for _, d := range tc.lags {
				c.record(d)
				sum += max(d, 0)
			}
			l := c.snapshot()
			if l.Count != uint64(len(tc.lags)) || l.Sum != sum || len(l.Buckets) != len(LagBounds)+1 {
				t.Fatalf("count %d sum %v buckets %d, want %d %v %d", l.Count, l.Sum, len(l.Buckets), len(tc.lags), sum, len(LagBounds)+1)
			}
			sorted := slices.Clone(tc.lags)
			slices.Sort(sorted)
			for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 1} {
				k := max(int(q*float64(len(sorted))), 1) - 1
				want := max(sorted[k], 0)
				got, ok := l.Quantile(q)
				last := LagBounds[len(LagBounds)-1]
				if want > last {
					if ok {
						t.Errorf("q%v: %v, want none (%v is above %v)", q, got, want, last)
					}
					continue
				}
				// The bucket's bound is the least bound at or above the lag.
				i, _ := slices.BinarySearch(LagBounds[:], want)
				if !ok || got != LagBounds[i] {
					t.Errorf("q%v: %v %v, want %v (lag %v)", q, got, ok, LagBounds[i], want)
				}
			}
		})
	}
	// Two counts added are the counts of their lags together.
	var a, b, both lagCounter
	for i, d := range randomLags(50) {
		both.record(d)
		if i%2 == 0 {
			a.record(d)
		} else {
			b.record(d)
		}
	}
	var sum Lag
	sum.Add(a.snapshot())
	sum.Add(b.snapshot())
	if want := both.snapshot(); !slices.Equal(sum.Buckets, want.Buckets) || sum.Count != want.Count || sum.Sum != want.Sum {
		t.Errorf("added %+v, want %+v", sum, want)
	}
	if _, ok := (Lag{}).Quantile(0.5); ok {
		t.Error("an empty Lag has a median")
	}
}

func randomLags(n int) []time.Duration {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(r.ExpFloat64() * float64(2*time.Millisecond))
	}
	return out
}
