package cluster

import (
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/lru"
)

// peer is what this instance knows of another: where its sequence stands,
// its load by replica name, and its placements still in their lifecycle.
type peer struct {
	id      string
	epoch   uint64 // of its start: another is a restart
	seq     uint64
	seen    time.Time
	syncing bool
	// owed: the batches missed while a resync was under way (or that a
	// lost resync asked for); once that resync ends, another asks for them.
	owed []seqRange
	gone bool // silent too long: its load does not count until it speaks

	// inflight and pending are the peer's requests in flight and pending
	// prefill tokens by replica: its last load record's values, moved by
	// the lifecycle records since.
	inflight map[string]int64
	pending  map[string]int64
	// places holds the placements by id, oldest out first past
	// cluster.max_peer_placement_bytes (each costs placeCost); placeOpts
	// are its bounds, kept for dropLoad.
	places    lru.Cache[uint64, *peerPlace]
	placeOpts lru.Options[*peerPlace]
}

// peerPlace is one of a peer's placements in its lifecycle.
type peerPlace struct {
	name      string
	place     index.Placement
	exact     index.Placement // its exact key's (precise mode)
	uncached  int64           // the prefill work it counted, until settled
	placed    time.Time       // the placement's own time, which its work keeps
	at        time.Time       // when it was received
	prefilled bool
	finished  bool
	worked    bool // its work was counted (it had a key)
	settled   bool
	cost      int64 // placeCost of its keys
}

// How long a peer's placement is kept for a failure to retract it: a
// finished one briefly (failures follow the end at once), an unfinished one
// as long as a request may run.
const (
	keepFinished   = 30 * time.Second
	keepUnfinished = 30 * time.Minute
)

func (n *Node) newPeer(id string) *peer {
	p := &peer{id: id, inflight: map[string]int64{}, pending: map[string]int64{}}
	p.placeOpts = n.placeOptions(id)
	p.places.Init(p.placeOpts)
	return p
}

// receive applies one message from a peer: a live batch or a resync chunk.
// It reports whether the message was the last chunk of a resync.
func (n *Node) receive(data []byte) (lastChunk bool) {
	n.stats.recvMsgs.Add(1)
	n.stats.recvBytes.Add(uint64(len(data)))
	body, err := n.seal.open(data, wireMagic1, wireVersion)
	var h header
	if err == nil {
		h, body, err = decodeHeader(body)
	}
	if err != nil {
		n.reject(err, "batch")
		return false
	}
	if h.sender == n.id {
		return false
	}
	replay := h.flags&flagResync != 0
	now := time.Now()

	n.inMu.Lock()
	p := n.peers[h.sender]
	if p == nil && !n.admitLocked(now) {
		n.inMu.Unlock()
		n.rejected(rejectMaxPeers)
		n.warn.Warn(RejectReasons[rejectMaxPeers], "cluster: a new peer past cluster.max_peers ignored", zap.String("peer", h.sender),
			zap.Int("max_peers", n.opts.Config.MaxPeers))
		return false
	}
	if !replay && p != nil && h.epoch == p.epoch && h.seq <= p.seq {
		n.inMu.Unlock()
		n.rejected(rejectReplayed)
		n.warn.Warn(RejectReasons[rejectReplayed], "cluster: a batch replayed (its sequence seen already) dropped", zap.String("peer", h.sender))
		return false
	}
	reps := n.replicaMapLocked()
	// A resync asks for the batches before this one that were missed:
	// those from this one on arrive live.
	needSync, missed := false, seqRange{until: h.seq}
	if !replay {
		switch {
		case p == nil:
			p = n.newPeer(h.sender)
			n.peers[h.sender] = p
			n.log.Info("cluster: peer joined", zap.String("peer", h.sender))
			needSync = true
		case h.epoch != p.epoch:
			// The peer restarted under the same id. What it had in
			// flight is gone.
			n.stats.gaps.Add(1)
			n.warn.Warn("peer_restarted", "cluster: peer restarted; its load dropped, resyncing", zap.String("peer", h.sender))
			for name := range p.inflight {
				n.touched[name] = struct{}{}
			}
			for name := range p.pending {
				n.touched[name] = struct{}{}
			}
			p.dropLoad()
			needSync = true
		case h.seq != p.seq+1:
			n.stats.gaps.Add(1)
			n.warn.Warn("gap", "cluster: messages from a peer were missed; resyncing", zap.String("peer", h.sender),
				zap.Uint64("missed", h.seq-p.seq-1))
			needSync, missed.from = true, p.seq+1
		}
		if p.gone {
			p.gone = false
			n.log.Info("cluster: peer speaks again", zap.String("peer", h.sender))
		}
		p.epoch, p.seq, p.seen = h.epoch, h.seq, now
		n.notePeersLocked()
		if needSync {
			if p.syncing {
				p.owe(missed)
				needSync = false
			} else {
				p.syncing = true
			}
		}
	}
	err = decodeRecords(body, h.base, func(rec *record) {
		if p == nil {
			// A resync chunk from a peer not yet heard live: its records
			// still describe the fleet.
			p = n.newPeer(h.sender)
			p.epoch, p.seen = h.epoch, now
			n.peers[h.sender] = p
		}
		n.applyLocked(p, rec, reps, replay, now)
	})
	for name := range n.touched {
		if rep := reps[name]; rep != nil {
			n.totalLocked(name, rep)
		}
	}
	clear(n.touched)
	n.inMu.Unlock()
	if err != nil {
		n.reject(err, "batch records")
	}
	if needSync {
		n.askResync(h.sender, []seqRange{missed})
	}
	return replay && h.flags&flagLast != 0
}

// endSync ends the resync of peer id that asked for the batches asked.
// Another resync follows at once when a gap was seen meanwhile, or with
// retry (its request or its chunks were lost) while the peer speaks;
// otherwise the next gap asks again.
func (n *Node) endSync(id string, asked []seqRange, retry bool) {
	n.inMu.Lock()
	p := n.peers[id]
	if p == nil {
		n.inMu.Unlock()
		return
	}
	if retry && time.Since(p.seen) < n.silence() {
		for _, r := range asked {
			p.owe(r)
		}
	}
	next := p.owed
	p.owed = nil
	again := len(next) > 0
	p.syncing = again
	n.inMu.Unlock()
	if again {
		n.askResync(id, next)
	}
}

// askResync is resync, its failure warned of (rate-limited).
func (n *Node) askResync(id string, ranges []seqRange) {
	if err := n.resync(id, ranges); err != nil {
		n.warn.Warn("resync_failed", "cluster: resync request failed", zap.String("peer", id), zap.Error(err))
	}
}

// applyLocked applies one record of peer p. A replayed placement enters
// the Index only: its request is long done.
func (n *Node) applyLocked(p *peer, rec *record, reps map[string]*backends.Replica, replay bool, now time.Time) {
	switch rec.kind {
	case recPlace:
		if rec.ticket != 0 && !replay {
			n.releaseLocked(rec.ticket, reps) // the placement replaces it
		}
		rep := reps[rec.replica]
		if rep == nil {
			n.stats.unknow.Add(1)
			return
		}
		uncached := int64(min(rec.uncached, 1<<40))
		at := time.UnixMicro(rec.at)
		ix := n.index()
		var pl, ex index.Placement
		if len(rec.key) > 0 {
			pl = ix.Place(rec.key, false, rep, at)
			ix.AddWork(rep, uncached, at)
		}
		if len(rec.exact) > 0 {
			ex = ix.Place(rec.exact, true, rep, at)
		}
		if replay {
			return
		}
		n.stats.lag.record(now.Sub(at))
		p.inflight[rec.replica]++
		p.pending[rec.replica] += uncached
		n.touched[rec.replica] = struct{}{}
		n.notePlacedLocked(rec.replica, rep)
		n.holdLocked(p, rec.id, &peerPlace{name: rec.replica, place: pl, exact: ex, uncached: uncached, placed: at, at: now,
			worked: len(rec.key) > 0, cost: placeCost(rec.key, rec.exact)})
	case recCancel:
		n.cancelLocked(rec.ticket, reps, now)
	case recPrefill:
		if pp := p.place(rec.id); pp != nil && !pp.prefilled {
			pp.prefilled = true
			p.pending[pp.name] -= pp.uncached
			n.touched[pp.name] = struct{}{}
		}
	case recFinish:
		if pp := p.place(rec.id); pp != nil && !pp.finished {
			if !pp.prefilled {
				pp.prefilled = true
				p.pending[pp.name] -= pp.uncached
			}
			pp.finished = true
			p.inflight[pp.name]--
			n.touched[pp.name] = struct{}{}
		}
	case recTrim:
		if pp := p.place(rec.id); pp != nil {
			cached := int(min(rec.cached, 1<<40))
			pp.place.Trim(cached, now)
			pp.exact.Trim(cached, now)
		}
	case recSettle:
		// The work its placement counted becomes what the engine
		// computed. A placement without a key counted none, nor does its
		// settling.
		if pp := p.place(rec.id); pp != nil && !pp.settled && pp.worked {
			pp.settled = true
			if rep := reps[pp.name]; rep != nil {
				work := int64(min(rec.work, 1<<40))
				n.index().AddWork(rep, work-pp.uncached, pp.placed)
			}
		}
	case recFail:
		if pp := p.place(rec.id); pp != nil {
			pp.place.Retract()
			pp.exact.Retract()
			if pp.worked && !pp.settled {
				// The attempt failed: its replica computed nothing for it.
				if rep := reps[pp.name]; rep != nil {
					n.index().AddWork(rep, -pp.uncached, pp.placed)
				}
			}
			if !pp.prefilled {
				p.pending[pp.name] -= pp.uncached
			}
			if !pp.finished {
				p.inflight[pp.name]--
			}
			n.touched[pp.name] = struct{}{}
			p.drop(rec.id)
		}
	case recLoad:
		p.inflight[rec.replica] = int64(min(rec.inflight, 1<<40))
		p.pending[rec.replica] = int64(min(rec.pending, 1<<40))
		n.touched[rec.replica] = struct{}{}
	case recSession:
		if rep := reps[rec.replica]; rep != nil {
			n.opts.Router.PeerBound(rec.digest, rep, time.UnixMicro(rec.at))
		} else {
			n.stats.unknow.Add(1)
		}
	case recStored:
		if rep := reps[rec.replica]; rep != nil {
			n.opts.Router.PeerStored(rec.digest, rep)
		} else {
			n.stats.unknow.Add(1)
		}
	}
}

// replicaMapLocked returns the fleet's replicas by name, rebuilt when the
// fleet's list changed.
func (n *Node) replicaMapLocked() map[string]*backends.Replica {
	reps := n.opts.Fleet.Replicas()
	if n.byName != nil && len(reps) == len(n.reps) && (len(reps) == 0 || &reps[0] == &n.reps[0]) {
		return n.byName
	}
	m := make(map[string]*backends.Replica, len(reps))
	for _, r := range reps {
		m[r.Name()] = r
	}
	n.byName, n.reps = m, reps
	return m
}

// totalsLocked sets every replica's peers' in-flight count and pending
// prefill (totalLocked).
func (n *Node) totalsLocked(reps map[string]*backends.Replica) {
	for name, rep := range reps {
		n.totalLocked(name, rep)
	}
}

// totalLocked sets the peers' in-flight count and pending prefill of rep,
// named name: the sums over the peers heard from. A batch sets them for the
// replicas its records touched (Node.touched), maintain for all.
//
// What the peers claim is held to the replica's load bound
// (loadBoundLocked), their pending prefill cut in the same proportion
// (pending work comes with requests in flight); without fresh metrics each
// peer's in flight is held to one instance's pool on the replica.
func (n *Node) totalLocked(name string, rep *backends.Replica) {
	var inflight, pending int64
	pool := int64(n.opts.MaxConnsPerReplica)
	for _, p := range n.peers {
		in := max(p.inflight[name], 0)
		if pool > 0 {
			in = min(in, pool)
		}
		inflight += in
		pending += max(p.pending[name], 0)
	}
	if bound, ok := n.loadBoundLocked(name, rep, time.Now()); ok && inflight > bound {
		pending = int64(float64(pending) * float64(bound) / float64(inflight))
		n.rejected(rejectLoad)
		n.warn.Warn(RejectReasons[rejectLoad], "cluster: the peers' claimed load on a replica cut to what its engine reports",
			zap.String("replica", name), zap.Int64("claimed", inflight), zap.Int64("bound", bound))
		inflight = bound
	}
	inflight += n.reservedOn[name]
	rep.SetPeerInFlight(inflight)
	n.index().SetPeerPending(rep, pending)
}

// dropLoad forgets what the peer has in flight.
func (p *peer) dropLoad() {
	p.inflight, p.pending = map[string]int64{}, map[string]int64{}
	p.places.Init(p.placeOpts)
}

// livePeersLocked counts the peers not gone.
func (n *Node) livePeersLocked() int64 {
	var c int64
	for _, p := range n.peers {
		if !p.gone {
			c++
		}
	}
	return c
}

// notePeersLocked publishes the number of live peers to the stats and to
// the Index (placement spreads cold requests while others decide too).
func (n *Node) notePeersLocked() {
	live := n.livePeersLocked()
	n.stats.peers.Store(live)
	n.noteLeaderLocked()
	n.index().SetPeers(int(live))
}

// forgetGone is how long a gone peer's sequence is remembered, so that
// one that speaks again in sequence needs no resync.
const forgetGone = 10 * time.Minute

// maintain marks peers silent for longer than silence as gone (their load
// no longer counts; what they placed stays in the Index, as the engines
// still hold it), forgets those gone long ago, and drops placements past
// their keeping time.
func (n *Node) maintain(now time.Time, silence time.Duration) {
	n.inMu.Lock()
	defer n.inMu.Unlock()
	for id, p := range n.peers {
		quiet := now.Sub(p.seen)
		if quiet > forgetGone {
			delete(n.peers, id)
			continue
		}
		if quiet > silence && !p.gone && !p.syncing {
			p.gone = true
			p.dropLoad()
			n.warn.Warn("peer_silent", "cluster: peer silent; its load no longer counts", zap.String("peer", id))
			continue
		}
		p.places.RemoveFunc(func(e *lru.Entry[uint64, *peerPlace]) bool {
			pp := e.Value
			age := now.Sub(pp.at)
			return pp.finished && age > keepFinished || age > keepUnfinished
		})
	}
	reps := n.replicaMapLocked()
	n.lapseLocked(now, reps)
	n.notePeersLocked()
	n.totalsLocked(reps)
}
