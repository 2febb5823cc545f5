package router

import (
	"sync/atomic"
	"time"
)

// Tuning is every policy's tuning: what a reload changes in place, keeping
// the Index. See config.CacheAware and config.Session for units and
// defaults.
type Tuning struct {
	CacheAware CacheAwareTuning
	Session    SessionTuning
}

// CacheAwareTuning tunes the cache_aware policy.
type CacheAwareTuning struct {
	Lambda         float64       // tokens one queued request costs
	Mu             float64       // tokens a full KV cache costs
	Nu             float64       // tokens one token of prefill pending ahead costs
	Epsilon        float64       // load bound (1+ε)·mean
	BoundFloor     int           // requests in flight per unit of weight the load bound always allows
	MinMatchTokens int           // below this best match, a request is cold
	TTL            time.Duration // tree entries unused this long stop counting
	BlockSize      int           // engine block size when metrics don't say
	BranchBalance  float64       // a new branch stays with a holder within this multiple of the mean recent prefill work; 0: off (branch.go)
	TurnPrice      float64       // the share of the load prices a next turn pays, 0–1 (CacheAware.choose)
}

// SessionTuning tunes the session policy.
type SessionTuning struct {
	Epsilon float64 // load bound (1+ε)·mean
}

// Tunings holds the Tuning in force behind an atomic pointer: policies load
// it once per decision, a reload stores a new one. The zero value holds the
// zero Tuning.
type Tunings struct{ p atomic.Pointer[Tuning] }

// NewTunings returns Tunings holding t.
func NewTunings(t Tuning) *Tunings {
	ts := &Tunings{}
	ts.Store(t)
	return ts
}

// Load returns the Tuning in force; it must not be modified.
func (ts *Tunings) Load() *Tuning {
	if t := ts.p.Load(); t != nil {
		return t
	}
	return &zeroTuning
}

// Store puts t in force for the decisions that follow.
func (ts *Tunings) Store(t Tuning) { ts.p.Store(&t) }

var zeroTuning Tuning
