package cluster

import (
	"errors"
	"math"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/lru"
)

// What bounds a member's word. A message reaches the Node only through
// NATS, which admits only members (route token or mutual TLS, embed.go);
// a member's message is sealed with the key all members derive (auth.go).
// Within that, what one member may make this instance hold or believe is
// bounded here: how many peers it keeps (cluster.max_peers), the bytes of
// one peer's placements (cluster.max_peer_placement_bytes), the load the
// peers may claim on a replica (loadBoundLocked), and the resyncs answered
// (one at a time per asker). What is refused or cut is counted by reason,
// and warned of at most once per reason per 10 s (lograte).

// Reasons of Stats.Rejected.
const (
	rejectUnauthenticated = iota // a message whose MAC does not check (a non-member's)
	rejectMalformed              // a sealed message that does not decode
	rejectMaxPeers               // a new sender past cluster.max_peers
	rejectReplayed               // a live batch at or below the sequence seen in its epoch
	rejectPlacements             // a peer's placement dropped for cluster.max_peer_placement_bytes
	rejectLoad                   // the peers' claimed load on a replica cut to its bound
	rejectResyncBusy             // a resync request while that asker's (or too many) are answered
	rejectResyncSize             // a resync reply cut past twice cluster.journal_bytes
	numRejects
)

// RejectReasons names the reasons of Stats.Rejected.
var RejectReasons = [numRejects]string{"unauthenticated", "malformed", "max_peers", "replayed", "placements", "load", "resync_busy", "resync_size"}

// The defaults of cluster.max_peers and cluster.max_peer_placement_bytes,
// for a Config without them.
const (
	defaultMaxPeers              = 16
	defaultMaxPeerPlacementBytes = 8 << 20
)

// placeOverhead is what one held peer placement costs beside its keys'
// values, in bytes: its slot in the peer's map, its lru entry, its record
// (two index.Placements, times, counts), with their allocation classes:
// about 330 bytes, rounded up.
const placeOverhead = 400

// evictGone is how long a peer must have been gone before a new one may
// take its place past cluster.max_peers.
const evictGone = time.Minute

// rejected counts one refusal for reason.
func (n *Node) rejected(reason int) { n.stats.rejected[reason].Add(1) }

// rejectedCounts returns the refusals by reason name.
func (n *Node) rejectedCounts() map[string]uint64 {
	m := make(map[string]uint64, numRejects)
	for i, name := range RejectReasons {
		m[name] = n.stats.rejected[i].Load()
	}
	return m
}

// reject counts a message that did not open or decode (what names it in
// the warning) and warns of it, rate-limited.
func (n *Node) reject(err error, what string) {
	if err == nil {
		// A decoded answer for another ticket.
		err = errors.New("answer to another ask")
	}
	reason := rejectMalformed
	if errors.Is(err, errAuth) {
		reason = rejectUnauthenticated
	} else {
		n.stats.malformed.Add(1)
	}
	n.rejected(reason)
	n.warn.Warn(RejectReasons[reason], "cluster: message dropped", zap.String("message", what), zap.Error(err))
}

// maxReplays bounds the resyncs answered at once: each holds a copy of
// what it replays, up to cluster.journal_bytes.
const maxReplays = 2

// syncAsked answers a resync request sealed by a member, one at a time per
// asker and at most maxReplays at once; a refused asker asks again once
// its resync went unanswered.
func (n *Node) syncAsked(m *nats.Msg) {
	body, err := n.seal.open(m.Data, syncMagic1, syncVersion)
	var asker string
	var ranges []seqRange
	if err == nil {
		asker, ranges, err = decodeSync(body)
	}
	if err != nil {
		n.reject(err, "resync request")
		return
	}
	if m.Reply == "" {
		return
	}
	n.inMu.Lock()
	busy := n.replaying[asker] || len(n.replaying) >= maxReplays
	if !busy {
		n.replaying[asker] = true
	}
	n.inMu.Unlock()
	if busy {
		n.rejected(rejectResyncBusy)
		n.warn.Warn(RejectReasons[rejectResyncBusy], "cluster: resync request refused while one of the same asker is answered", zap.String("peer", asker))
		return
	}
	go func() {
		defer func() {
			n.inMu.Lock()
			delete(n.replaying, asker)
			n.inMu.Unlock()
		}()
		n.replay(m.Reply, ranges)
	}()
}

// admitLocked reports whether a new sender may become a peer: there is
// room under max_peers, or a peer gone for evictGone makes room (the one
// silent longest).
func (n *Node) admitLocked(now time.Time) bool {
	if len(n.peers) < n.opts.Config.MaxPeers {
		return true
	}
	var oldest *peer
	for _, p := range n.peers {
		if p.gone && now.Sub(p.seen) >= evictGone && (oldest == nil || p.seen.Before(oldest.seen)) {
			oldest = p
		}
	}
	if oldest == nil {
		return false
	}
	delete(n.peers, oldest.id)
	return true
}

// placeCost is what holding a placement of these keys costs, in bytes.
func placeCost(key, exact []uint32) int64 {
	return placeOverhead + 4*int64(cap(key)+cap(exact))
}

// placeOptions bounds the placements held of peer id: past
// cluster.max_peer_placement_bytes, its oldest go, each counted and warned
// of.
func (n *Node) placeOptions(id string) lru.Options[*peerPlace] {
	return lru.Options[*peerPlace]{
		MaxCost: n.opts.Config.MaxPeerPlacementBytes,
		Cost:    func(pp *peerPlace) int64 { return pp.cost },
		Evicted: func(**peerPlace) { n.placeDropped(id) },
	}
}

// placeDropped counts and warns of a placement of peer id dropped for
// cluster.max_peer_placement_bytes.
func (n *Node) placeDropped(id string) {
	n.rejected(rejectPlacements)
	n.warn.Warn(RejectReasons[rejectPlacements], "cluster: a peer's placements past cluster.max_peer_placement_bytes; its oldest dropped",
		zap.String("peer", id), zap.Int64("max_peer_placement_bytes", n.opts.Config.MaxPeerPlacementBytes))
}

// holdLocked holds placement id of peer p, dropping p's oldest past
// cluster.max_peer_placement_bytes (one costing more alone is not held).
func (n *Node) holdLocked(p *peer, id uint64, pp *peerPlace) {
	if p.places.Put(id, pp) == nil {
		p.drop(id)
		n.placeDropped(p.id)
	}
}

// place returns placement id, or nil when it is not held.
func (p *peer) place(id uint64) *peerPlace {
	if e := p.places.Peek(id); e != nil {
		return e.Value
	}
	return nil
}

// drop forgets placement id, if held.
func (p *peer) drop(id uint64) {
	if e := p.places.Peek(id); e != nil {
		p.places.Remove(e)
	}
}

// placedSince counts the peers' live placements on one replica since its
// metrics of time at.
type placedSince struct {
	at time.Time
	n  int64
}

// notePlacedLocked counts a peer's live placement on rep, named name.
func (n *Node) notePlacedLocked(name string, rep *backends.Replica) {
	s := rep.Snapshot()
	if s == nil {
		return
	}
	ps := n.sincePoll[name]
	if ps == nil {
		ps = &placedSince{}
		n.sincePoll[name] = ps
	}
	if !ps.at.Equal(s.At) {
		ps.at, ps.n = s.At, 0
	}
	ps.n++
}

// loadBoundLocked is the most requests in flight the peers together may
// count on rep, named name, while its metrics are fresh: what its engine
// last reported running and waiting, less this instance's own in flight,
// plus the peers' placements on it received since that report. No peer
// makes a replica look busier than its engine does, but for the requests
// sent since. ok is false without fresh metrics (each peer is then held to
// the pool one instance has per replica, Options.MaxConnsPerReplica).
func (n *Node) loadBoundLocked(name string, rep *backends.Replica, now time.Time) (bound int64, ok bool) {
	s, fresh := rep.SnapshotAt(now)
	if !fresh {
		return 0, false
	}
	engine := int64(math.Ceil(max(s.Running, 0) + max(s.Waiting, 0)))
	bound = max(engine-rep.InFlight(), 0)
	if ps := n.sincePoll[name]; ps != nil && ps.at.Equal(s.At) {
		bound += ps.n
	}
	return bound, true
}
