package cluster

import (
	"sync/atomic"
	"time"
)

// LagBounds are the upper bounds of the buckets Stats.PlacementLag counts
// in; a last bucket takes the lags above the last bound.
var LagBounds = [...]time.Duration{
	100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, time.Second,
}

// Lag is a distribution of how long peers' placements took to reach this
// instance's Index: from the peer's decision (the record's time, by the
// peer's clock) to their applying here.
type Lag struct {
	// Buckets[i] counts the lags at most LagBounds[i] (not cumulative);
	// Buckets[len(LagBounds)] those above the last bound.
	Buckets []uint64
	// Count and Sum are the lags counted and their sum.
	Count uint64
	Sum   time.Duration
}

// Quantile returns the upper bound of the bucket holding the q-quantile
// (0 < q ≤ 1) of the lags, and false when none was counted or it lies
// above the last bound.
func (l Lag) Quantile(q float64) (time.Duration, bool) {
	if l.Count == 0 {
		return 0, false
	}
	want := uint64(q * float64(l.Count))
	want = max(want, 1)
	var seen uint64
	for i, c := range l.Buckets {
		seen += c
		if seen >= want {
			if i < len(LagBounds) {
				return LagBounds[i], true
			}
			return 0, false
		}
	}
	return 0, false
}

// Add adds o's counts to l's (lags of several instances, say).
func (l *Lag) Add(o Lag) {
	if len(l.Buckets) < len(o.Buckets) {
		l.Buckets = append(l.Buckets, make([]uint64, len(o.Buckets)-len(l.Buckets))...)
	}
	for i, c := range o.Buckets {
		l.Buckets[i] += c
	}
	l.Count += o.Count
	l.Sum += o.Sum
}

// lagCounter counts lags into LagBounds' buckets without locks.
type lagCounter struct {
	buckets [len(LagBounds) + 1]atomic.Uint64
	count   atomic.Uint64
	sumNS   atomic.Int64
}

// record counts one lag; a negative one (the peer's clock ahead of
// this one's) counts as 0.
func (c *lagCounter) record(d time.Duration) {
	d = max(d, 0)
	i := len(LagBounds)
	for j, b := range LagBounds {
		if d <= b {
			i = j
			break
		}
	}
	c.buckets[i].Add(1)
	c.count.Add(1)
	c.sumNS.Add(int64(d))
}

// snapshot returns what c counted.
func (c *lagCounter) snapshot() Lag {
	l := Lag{Buckets: make([]uint64, len(c.buckets)), Count: c.count.Load(), Sum: time.Duration(c.sumNS.Load())}
	for i := range c.buckets {
		l.Buckets[i] = c.buckets[i].Load()
	}
	return l
}
