package index

import (
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/radix"
)

// View is the Index as one decision reads it, taken once per decision
// (Index.View): the time it reads at, the TTL's cut-off (entries last used
// before it no longer count), the block size and peers in force, and every
// replica's counters from one load. It is a value: taking one allocates
// nothing. Its reads see the Index's writes since, but for the settings it
// fixed. Its zero value is no View; use Index.View.
type View struct {
	ix        *Index
	slots     []*replicaSlot
	now       time.Time
	notBefore time.Time // zero: every entry counts
	ttl       time.Duration
	blockSize int
	peers     int
}

// View returns the Index as a decision at now reads it.
func (ix *Index) View(now time.Time) View {
	v := View{ix: ix, now: now, ttl: ix.TTL(), blockSize: ix.BlockSize(), peers: ix.Peers()}
	if v.ttl > 0 {
		v.notBefore = now.Add(-v.ttl)
	}
	if s := ix.slots.Load(); s != nil {
		v.slots = *s
	}
	return v
}

// slot returns the counters of replica id: from the View's load, else
// (a replica the Index counted nothing for then) the Index's.
func (v *View) slot(id int) *replicaSlot {
	if id < len(v.slots) {
		return v.slots[id]
	}
	return v.ix.slot(id)
}

// KeyBlock is the number of prompt tokens one key value stands for.
func (v *View) KeyBlock() int { return v.ix.keyBlock }

// BlockSize is the engine block size assumed where a replica's metrics do
// not give it.
func (v *View) BlockSize() int { return v.blockSize }

// Peers is how many other routers share the fleet (0 without a cluster).
func (v *View) Peers() int { return v.peers }

// Match appends to dst[:0] the longest prefix of key each replica holds, in
// tokens, in its exact share (exact: key is an exact key) or its
// approximate one, counting only entries used within the TTL. Each Match's
// Replica is a replica ID. See radix.Tree.MatchInto.
func (v *View) Match(dst []radix.Match, key []uint32, exact bool) []radix.Match {
	dst = v.ix.tree.MatchInto(dst, key, v.notBefore)
	w := 0
	for _, m := range dst {
		if id, ex := replicaOf(m.Replica); ex == exact {
			dst[w] = radix.Match{Replica: radix.ReplicaID(id), Tokens: m.Tokens} //nolint:gosec // from a ReplicaID
			w++
		}
	}
	return dst[:w]
}

// Branches counts, at the point depth values into the approximate key,
// the continuations past it used within the TTL that each replica holds in
// its approximate share: dst[id] for replica ID id. See
// radix.Tree.Branches.
func (v *View) Branches(dst []int32, key []uint32, depth int) ([]int32, int) {
	dst, n := v.ix.tree.Branches(dst, key, depth, v.notBefore)
	// Tree IDs 2·id (approximate) fold down to id; the exact shares' odd
	// IDs drop out.
	for id := 0; 2*id < len(dst); id++ {
		dst[id] = dst[2*id]
	}
	return dst[:(len(dst)+1)/2], n
}

// Occupancies appends to dst[:0] what each of reps holds in the Index and
// its share (its budget: its cache's capacity when known), in tokens: of
// a precise replica, its exact share against its capacity; of the others,
// their approximate share. ids is scratch space for the replicas' tree
// IDs, returned for reuse.
func (v *View) Occupancies(dst []radix.Occupancy, ids []radix.ReplicaID, reps []*backends.Replica) ([]radix.Occupancy, []radix.ReplicaID) {
	ids = ids[:0]
	for _, r := range reps {
		ids = append(ids, treeID(r.ID(), v.slot(r.ID()).precise.Load()))
	}
	dst = v.ix.tree.Occupancies(dst, ids)
	for i, r := range ids {
		if _, exact := replicaOf(r); exact {
			dst[i].Budget /= exactRoom
		}
	}
	return dst, ids
}

// Precise reports whether rep's entries follow its engine's KV events
// (EngineWriter.SetPrecise).
func (v *View) Precise(rep *backends.Replica) bool { return v.slot(rep.ID()).precise.Load() }

// Pending is the number of prompt tokens sent to rep and not yet
// prefilled, by this router and its peers.
func (v *View) Pending(rep *backends.Replica) int64 { return v.slot(rep.ID()).pendingAll() }

// OwnPending is the number of prompt tokens this router sent to rep and
// not yet saw prefilled.
func (v *View) OwnPending(rep *backends.Replica) int64 { return v.slot(rep.ID()).pending.Load() }

// RecentWork is the prefill work counted on rep, own and peers', each
// token counting half as much every TTL since, at the View's time.
func (v *View) RecentWork(rep *backends.Replica) float64 {
	return v.slot(rep.ID()).recentWork(v.now, v.ttl)
}
