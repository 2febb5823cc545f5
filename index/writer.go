package index

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/backends"
)

// The Index is written by its sources, each through a writer bound to its
// Source: a RouterWriter for this router's policies, a PeerWriter for the
// cluster (other routers' placements and load), an EngineWriter for the
// engines' KV events (precise mode). Each has the writes its source makes;
// its zero value writes nothing.

// writer is what every source's writer shares: its Index and Source.
type writer struct {
	ix  *Index
	src Source
}

// Place records that rep holds key's prefix as of now (for this router: it
// will, once the request is prefilled), in its exact share (exact: key is
// an exact key, precise mode) or its approximate one, counted to the
// writer's Source. It returns the placement, which Retract undoes. key
// must stay unchanged until the placement is retracted or no longer
// needed.
func (w writer) Place(key []uint32, exact bool, rep *backends.Replica, now time.Time) Placement {
	return w.ix.place(w.src, key, nil, exact, rep, now)
}

// RouterWriter writes this router's own decisions (SourceRouter).
type RouterWriter struct{ writer }

// PeerWriter writes what the other routers of a cluster placed and carry
// (SourcePeer).
type PeerWriter struct{ writer }

// EngineWriter writes what the engines' KV events report (SourceEngine).
type EngineWriter struct{ writer }

// RouterWriter returns the writer of this router's decisions.
func (ix *Index) RouterWriter() RouterWriter { return RouterWriter{writer{ix, SourceRouter}} }

// PeerWriter returns the writer of the cluster's peers.
func (ix *Index) PeerWriter() PeerWriter { return PeerWriter{writer{ix, SourcePeer}} }

// EngineWriter returns the writer of the engines' KV events.
func (ix *Index) EngineWriter() EngineWriter { return EngineWriter{writer{ix, SourceEngine}} }

// PlaceOwned is Place for a key in a buffer that is reused: owner counts
// the buffer's generations (its owner adds one each time it takes the
// buffer back), and the placement leaves the Index alone (Retract, Trim,
// Touch) once owner has moved past the generation it had at placement.
func (w RouterWriter) PlaceOwned(key []uint32, owner *atomic.Uint64, exact bool, rep *backends.Replica, now time.Time) Placement {
	return w.ix.place(w.src, key, owner, exact, rep, now)
}

// AddPending counts tokens of prompt sent to rep and not yet prefilled,
// until Prefilled is called on the result.
func (w RouterWriter) AddPending(rep *backends.Replica, tokens int64) PendingPrefill {
	if w.ix == nil || tokens <= 0 {
		return PendingPrefill{}
	}
	c := &w.ix.slot(rep.ID()).pending
	c.Add(tokens)
	return PendingPrefill{c: c, n: tokens}
}

// AddWork counts tokens of prefill work placed on rep at now, halving every
// TTL (as of now), until the result settles it to the engine's count or
// takes it back.
func (w RouterWriter) AddWork(rep *backends.Replica, tokens int64, now time.Time) Work {
	if w.ix == nil {
		return Work{}
	}
	s, halfLife := w.ix.slot(rep.ID()), w.ix.TTL()
	if tokens != 0 {
		s.addWork(tokens, now, halfLife)
	}
	return Work{s: s, tokens: tokens, at: now, halfLife: halfLife}
}

// AddWork counts tokens (negative: takes them back) of prefill work that a
// peer placed on rep at at, as the work cap and the branch rule weigh it:
// a placement's predicted work, then the difference its engine's report
// made.
func (w PeerWriter) AddWork(rep *backends.Replica, tokens int64, at time.Time) {
	if w.ix != nil && tokens != 0 {
		w.ix.slot(rep.ID()).addWork(tokens, at, w.ix.TTL())
	}
}

// SetPeerPending records the prompt tokens the peers sent to rep and not
// yet saw prefilled, as they last reported them.
func (w PeerWriter) SetPeerPending(rep *backends.Replica, tokens int64) {
	if w.ix != nil {
		w.ix.slot(rep.ID()).peerPending.Store(max(tokens, 0))
	}
}

// SetPeers records how many other routers share the fleet and this Index's
// placements (peers heard from); 0 without a cluster.
func (w PeerWriter) SetPeers(n int) {
	if w.ix != nil {
		w.ix.peers.Store(int64(max(n, 0)))
	}
}

// EvictExact records that rep no longer holds the exact key past its
// first keep values (its engine reported those blocks removed); what it
// holds of key up to there, and of other keys, stays.
func (w EngineWriter) EvictExact(key []uint32, rep *backends.Replica, keep int) {
	if w.ix == nil || len(key) == 0 || keep >= len(key) {
		return
	}
	w.ix.tree.Undo(key, treeID(rep.ID(), true), max(keep, 0))
	w.ix.writes[w.src].Add(1)
}

// SetPrecise says whether rep's entries follow its engine's KV events
// (precise mode): a precise replica is scored on the requests' exact keys.
func (w EngineWriter) SetPrecise(rep *backends.Replica, on bool) {
	if w.ix == nil {
		return
	}
	if s := w.ix.slot(rep.ID()); s.precise.Load() != on {
		s.precise.Store(on)
	}
}

// PendingPrefill is prompt tokens counted as pending on a replica
// (RouterWriter.AddPending).
type PendingPrefill struct {
	c *atomic.Int64
	n int64
}

// Tokens is the number of tokens counted (Prefilled or not).
func (p *PendingPrefill) Tokens() int64 { return p.n }

// Prefilled stops counting the tokens. Safe on a zero PendingPrefill and
// more than once.
func (p *PendingPrefill) Prefilled() {
	if p.c != nil {
		p.c.Add(-p.n)
		p.c = nil
	}
}

// Work is the prefill work a decision counted on a replica at its time
// (RouterWriter.AddWork), kept until it is settled or taken back, once.
type Work struct {
	s        *replicaSlot
	tokens   int64
	at       time.Time
	halfLife time.Duration
}

// set replaces the work counted with tokens, as of the decision's time.
// Once; a no-op on a zero Work.
func (w *Work) set(tokens int64) {
	if w.s == nil {
		return
	}
	if d := tokens - w.tokens; d != 0 {
		w.s.addWork(d, w.at, w.halfLife)
	}
	w.s = nil
}

// Undo takes the work back: the attempt failed, its replica computed
// nothing for it. A no-op once settled or undone.
func (w *Work) Undo() { w.set(0) }

// Settle sets the work to what the engine computed: its prompt tokens less
// those it found cached. It returns them, and whether they differ from the
// work counted. A no-op (false) without the engine's prompt count, or once
// settled or undone.
func (w *Work) Settle(prompt, cached int) (int64, bool) {
	if prompt <= 0 || w.s == nil {
		return 0, false
	}
	tokens := int64(max(prompt-cached, 0))
	changed := tokens != w.tokens
	w.set(tokens)
	return tokens, changed
}

// addWork counts tokens of prefill placed on the slot's replica at now.
func (s *replicaSlot) addWork(tokens int64, now time.Time, halfLife time.Duration) {
	s.workMu.Lock()
	if at := now.UnixNano(); at < s.workAt {
		// Placed before the last update (a peer's placement heard of a
		// batch later): counted as decayed to then, so the time of the
		// work already counted does not move back.
		s.work += decayed(float64(tokens), at, time.Unix(0, s.workAt), halfLife)
	} else {
		s.work = decayed(s.work, s.workAt, now, halfLife) + float64(tokens)
		s.workAt = at
	}
	s.work = max(s.work, 0) // a settled decision may take back more than is left
	s.workMu.Unlock()
}

// recentWork is the prefill tokens placed on the slot's replica, each
// counting half as much every halfLife since (0: never less), at now.
func (s *replicaSlot) recentWork(now time.Time, halfLife time.Duration) float64 {
	s.workMu.Lock()
	defer s.workMu.Unlock()
	return decayed(s.work, s.workAt, now, halfLife)
}

// decayed is w as of at (unix nanoseconds), halved every halfLife, at now.
func decayed(w float64, at int64, now time.Time, halfLife time.Duration) float64 {
	if w == 0 || halfLife <= 0 {
		return w
	}
	if dt := now.UnixNano() - at; dt > 0 {
		w *= math.Exp2(-float64(dt) / float64(halfLife))
	}
	return w
}
