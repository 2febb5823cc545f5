// Package index is the fleet's cache state as this router knows it: the
// Index. Its sources (the router's policies, the cluster's peers, the
// engines' KV events) write to it each through a writer bound to their
// Source (RouterWriter, PeerWriter, EngineWriter); a policy reads it through
// a View taken once per decision.
package index

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/radix"
	"github.com/kvroute/kvroute/telemetry"
)

// Source says who wrote an entry of the Index.
type Source uint8

// The sources of Index writes.
const (
	// SourceRouter is this router's own placement of a request.
	SourceRouter Source = iota
	// SourcePeer is another router's placement, shared with this one.
	SourcePeer
	// SourceEngine is an engine's report of what its cache holds.
	SourceEngine

	numSources
)

// Sources returns every Source, in order.
func Sources() []Source { return []Source{SourceRouter, SourcePeer, SourceEngine} }

// String names the source as metrics and /debug/tree show it.
func (s Source) String() string {
	switch s {
	case SourceRouter:
		return "router"
	case SourcePeer:
		return "peer"
	case SourceEngine:
		return "engine"
	}
	return "unknown"
}

// Options configures an Index; KeyBlock and MaxBytes are fixed once it is
// built. See config.Index for units and defaults.
type Options struct {
	// TTL: an entry unused this long no longer counts, and recent prefill
	// work halves every TTL; 0: entries count forever, work never halves
	// (SetTTL changes it).
	TTL time.Duration
	// BlockSize is the engine block size in tokens where a replica's
	// metrics do not give it; 0 means 16 (SetBlockSize changes it).
	BlockSize int
	// KeyBlock is the number of prompt tokens one key value stands for
	// (the tokenizer's key block); 0 means 1.
	KeyBlock int
	// MaxBytes bounds the prefix tree's memory; 0 means radix.DefaultMaxBytes.
	MaxBytes int64
	// DefaultBudget is a replica's share of the tree, in tokens, until
	// SetDefaultBudget or the replica's known capacity says otherwise;
	// 0 means radix.DefaultBudget.
	DefaultBudget int64
}

// Index is the fleet's cache state as this router knows it: which replica
// holds which prompt prefixes and when each was last used (a prefix tree of
// routing keys), each replica's share of the tree (its budget), and the
// prompt tokens sent to each replica and not yet prefilled. It is built
// once, outlives the policies that read it (a reload or a change of policy
// keeps it), and is written through the writers of its sources
// (RouterWriter, PeerWriter, EngineWriter), which count each write to their
// Source, and read by policies through a View. It is safe for concurrent
// use.
//
// A replica has two shares of the tree, each with its own budget: its
// approximate entries (keys of the router's own tokens) and its exact ones
// (keys of its engine's own tokens, precise mode: what its KV events report
// and what the router sent it and no event reported yet). The tree holds
// them under two IDs per replica (treeID), so that neither pushes the
// other's entries out.
type Index struct {
	tree     *radix.Tree
	keyBlock int

	defBudget atomic.Int64 // tokens; see SetDefaultBudget
	ttl       atomic.Int64 // nanoseconds; see SetTTL
	blockSize atomic.Int64 // tokens; see SetBlockSize

	// slots holds each replica's counters by ID. It only grows (IDs are
	// small and dense), copy on write under slotsMu, so the hot path reads
	// it with one atomic load.
	slots   atomic.Pointer[[]*replicaSlot]
	slotsMu sync.Mutex

	writes [numSources]atomic.Uint64
	trims  atomic.Uint64
	peers  atomic.Int64 // other routers sharing the fleet (PeerWriter.SetPeers)
}

// New builds an empty Index.
func New(o Options) *Index {
	ix := &Index{
		tree:     radix.New(radix.Options{MaxBytes: o.MaxBytes, DefaultBudget: o.DefaultBudget, Unit: o.KeyBlock}),
		keyBlock: max(o.KeyBlock, 1),
	}
	ix.defBudget.Store(o.DefaultBudget)
	ix.SetTTL(o.TTL)
	ix.SetBlockSize(o.BlockSize)
	return ix
}

// SetTTL sets how long an unused entry keeps counting, and the half-life
// of recent prefill work (Options.TTL).
func (ix *Index) SetTTL(d time.Duration) { ix.ttl.Store(int64(max(d, 0))) }

// TTL returns what SetTTL last set.
func (ix *Index) TTL() time.Duration { return time.Duration(ix.ttl.Load()) }

// defaultBlockSize is the engine block size assumed when neither the
// configuration nor the replica's metrics give one.
const defaultBlockSize = 16

// SetBlockSize sets the engine block size assumed where a replica's
// metrics do not give it (Options.BlockSize); 0 means 16.
func (ix *Index) SetBlockSize(tokens int) {
	if tokens <= 0 {
		tokens = defaultBlockSize
	}
	ix.blockSize.Store(int64(tokens))
}

// BlockSize returns the engine block size SetBlockSize last set.
func (ix *Index) BlockSize() int { return int(ix.blockSize.Load()) }

// Peers returns how many other routers share the fleet, as
// PeerWriter.SetPeers last recorded.
func (ix *Index) Peers() int { return int(ix.peers.Load()) }

// KeyBlock is the number of prompt tokens one key value stands for.
func (ix *Index) KeyBlock() int { return ix.keyBlock }

// Stats is a snapshot of the Index's tree: its size (radix.Stats),
// and what it records each replica as holding, by replica ID, in tokens
// (replicas holding nothing are left out). It is telemetry's type itself,
// so the server registers Index.Stats for /metrics without copying fields.
type Stats = telemetry.TreeStats

// Stats returns a snapshot of the Index's tree.
func (ix *Index) Stats() Stats {
	st := ix.tree.Stats()
	s := Stats{Nodes: st.Nodes, Tokens: st.Tokens, Bytes: st.Bytes, Held: map[int]int64{}, HeldExact: map[int]int64{}}
	for r, h := range st.Held {
		if id, exact := replicaOf(r); exact {
			s.HeldExact[id] = h
		} else {
			s.Held[id] = h
		}
	}
	return s
}

// Writes returns the number of placements recorded from src.
func (ix *Index) Writes(src Source) uint64 {
	if src >= numSources {
		return 0
	}
	return ix.writes[src].Load()
}

// WritesBySource returns Writes for every Source, by its name.
func (ix *Index) WritesBySource() map[string]uint64 {
	m := make(map[string]uint64, numSources)
	for _, src := range Sources() {
		m[src.String()] = ix.Writes(src)
	}
	return m
}

// Trims returns the number of placements trimmed on an engine's report
// (Placement.Trim).
func (ix *Index) Trims() uint64 { return ix.trims.Load() }

// treeID is the tree's ID of replica id's approximate share, or of its
// exact share.
func treeID(id int, exact bool) radix.ReplicaID {
	r := radix.ReplicaID(2 * id) //nolint:gosec // replica IDs are small and dense
	if exact {
		r++
	}
	return r
}

// replicaOf is the replica ID of tree ID r, and whether r is its exact
// share.
func replicaOf(r radix.ReplicaID) (id int, exact bool) { return int(r / 2), r%2 == 1 }

// replicaSlot is what the Index counts for one replica ID.
type replicaSlot struct {
	pending     atomic.Int64 // prompt tokens sent and not yet prefilled
	peerPending atomic.Int64 // the same, of the other routers (PeerWriter.SetPeerPending)
	precise     atomic.Bool  // its entries follow its engine's events (EngineWriter.SetPrecise)
	budget      atomic.Int64 // approximate share's budget last applied, in tokens; 0: none yet

	// The prefill tokens placed on the replica, each request's settled to
	// its engine's count once reported (Work.Settle), decayed with a
	// half-life (RecentWork), as of workAt (unix nanoseconds).
	workMu sync.Mutex
	work   float64
	workAt int64
}

// pendingAll is the slot's pending prefill, own and peers'.
func (s *replicaSlot) pendingAll() int64 { return s.pending.Load() + s.peerPending.Load() }

// slot returns the counters of replica id.
func (ix *Index) slot(id int) *replicaSlot {
	if s := ix.slots.Load(); s != nil && id < len(*s) {
		return (*s)[id]
	}
	ix.slotsMu.Lock()
	defer ix.slotsMu.Unlock()
	var cur []*replicaSlot
	if s := ix.slots.Load(); s != nil {
		cur = *s
	}
	if id < len(cur) {
		return cur[id]
	}
	grown := make([]*replicaSlot, max(id+1, 2*len(cur)))
	copy(grown, cur)
	for i := len(cur); i < len(grown); i++ {
		grown[i] = new(replicaSlot)
	}
	ix.slots.Store(&grown)
	return grown[id]
}

// SetDefaultBudget changes the share of the tree, in tokens, of replicas
// whose cache capacity is unknown; it applies at their next placement.
func (ix *Index) SetDefaultBudget(tokens int64) { ix.defBudget.Store(tokens) }

// applyBudget sizes rep's shares of the tree from its prefix-cache
// capacity when it is known (configured cache_tokens, else its metrics),
// else from the default budget: the approximate share shareOf it, the
// exact share exactRoom times that.
func (ix *Index) applyBudget(rep *backends.Replica) {
	tokens := rep.CacheTokens()
	if tokens <= 0 {
		tokens = ix.defBudget.Load()
	}
	tokens = shareOf(tokens)
	slot := ix.slot(rep.ID())
	if slot.budget.Load() == tokens || slot.budget.Swap(tokens) == tokens {
		return
	}
	ix.tree.SetBudget(treeID(rep.ID(), false), tokens)
	ix.tree.SetBudget(treeID(rep.ID(), true), exactRoom*tokens)
}

// exactRoom is the exact share's budget as a multiple of the approximate
// one's. The exact share holds what the engine's events report, which
// they keep within its capacity as the engine evicts (EngineWriter.EvictExact), and
// the requests sent to it that no event reported yet. Its budget is only
// a bound against events that stop coming: were it the capacity, the
// tree would evict in batches on its own and forget blocks the engine
// still holds, the long prefixes last used longest ago.
const exactRoom = 2

// shareOf is the tree budget that makes a replica's share hold, on
// average, capacity tokens. An engine's cache, once warm, holds its whole
// capacity, evicting a block at a time; the tree evicts in batches from
// its budget down to 90 % of it (radix), so its share swings between the
// two and averages 95 % of the budget. Were the budget the capacity, the
// Index would forget, on average, the last 5 % of what the engine still
// holds: the long prefixes last used longest ago.
func shareOf(capacity int64) int64 { return capacity * 20 / 19 }

// Forget drops everything the Index holds of a replica that left the fleet.
func (ix *Index) Forget(rep *backends.Replica) {
	ix.tree.RemoveReplica(treeID(rep.ID(), false))
	ix.tree.RemoveReplica(treeID(rep.ID(), true))
	// The budget is applied afresh to a replica that reuses the ID. Its
	// pending prefill is left: requests still in flight to it subtract
	// what they added.
	ix.slot(rep.ID()).budget.Store(0)
}
