package index

import (
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/radix"
)

// Placement is one recorded entry of the Index, which Retract takes back.
// Its zero value retracts nothing.
type Placement struct {
	ix    *Index
	key   []uint32
	owner *atomic.Uint64 // key's owner's generation; the key is valid while it is gen
	gen   uint64
	id    radix.ReplicaID
	held  int
}

// place records that rep holds key's prefix as of now, written by src, in
// its exact share (exact) or its approximate one; owner, when not nil,
// counts the generations of key's buffer (see PlaceOwned).
func (ix *Index) place(src Source, key []uint32, owner *atomic.Uint64, exact bool, rep *backends.Replica, now time.Time) Placement {
	if ix == nil || len(key) == 0 || src >= numSources {
		return Placement{}
	}
	ix.applyBudget(rep)
	id := treeID(rep.ID(), exact)
	ix.writes[src].Add(1)
	p := Placement{ix: ix, key: key, owner: owner, id: id, held: ix.tree.Insert(key, id, now)}
	if owner != nil {
		p.gen = owner.Load()
	}
	return p
}

// Key is the key the placement recorded; nil for a zero Placement.
func (p *Placement) Key() []uint32 { return p.key }

// Retract undoes the placement: the replica no longer counts as holding
// what the placement added (the prefix it held before is kept). A placement
// whose key's owner moved on (PlaceOwned) is not retracted: its key may
// hold another request's values by then; the entry ages out instead. Safe
// on a zero Placement and more than once.
func (p *Placement) Retract() {
	if p.live() {
		p.ix.tree.Undo(p.key, p.id, p.held)
	}
	*p = Placement{}
}

// live reports whether the placement recorded something and its key is
// still its own (a key buffer its owner reused may hold another request's
// values by then).
func (p *Placement) live() bool {
	return p.ix != nil && (p.owner == nil || p.owner.Load() == p.gen)
}

// Trim follows an engine's report that it found only cachedTokens of the
// placement's prompt in its cache, fewer than the Index predicted: the
// engine evicted what lay beyond, unseen by the router. The replica stops
// counting as holder of anything past that point that shares the prompt
// (other conversations branching from it beyond there), while the
// placement's own prompt, which the engine has just prefilled again, stays
// recorded as used now. It reports whether the Index changed; a placement
// whose key's owner moved on is left alone, as for Retract.
//
// An exact key's entries are not trimmed, only touched: its engine's
// events have reported by then the blocks it evicted and those it stored
// again, which a trim would take out.
func (p *Placement) Trim(cachedTokens int, now time.Time) bool {
	if !p.live() {
		return false
	}
	if _, exact := replicaOf(p.id); exact {
		p.record(now)
		return false
	}
	keep := max(cachedTokens, 0) / p.ix.keyBlock
	if keep >= len(p.key) {
		return false
	}
	p.ix.tree.Undo(p.key, p.id, keep)
	p.record(now)
	p.held = min(p.held, keep)
	p.ix.trims.Add(1)
	return true
}

// Touch records the placement's prompt as used at now: the engine has
// just released the blocks its request held since admission, which makes
// them its most recently used (vLLM's free queue, bench/sim's LRU). It
// reports whether the Index was written; a placement whose key's owner
// moved on is left alone, as for Retract.
func (p *Placement) Touch(now time.Time) bool {
	if !p.live() {
		return false
	}
	p.record(now)
	return true
}

// record writes the placement's prompt as used at now. An approximate key
// is inserted whole. An exact key's entries follow the engine's events:
// only what the Index still holds of it is touched, so that blocks the
// engine reported removed since the request was placed stay removed.
func (p *Placement) record(now time.Time) {
	if _, exact := replicaOf(p.id); exact {
		p.ix.tree.Touch(p.key, p.id, now)
		return
	}
	p.ix.tree.Insert(p.key, p.id, now)
}
