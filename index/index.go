package router

import (
	"math"
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

// IndexOptions configures an Index; KeyBlock and MaxBytes are fixed once
// it is built. See config.Index for units and defaults.
type IndexOptions struct {
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
// keeps it), and is written through methods that name the Source of each
// write. It is safe for concurrent use.
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
	peers  atomic.Int64 // other routers sharing the fleet (SetPeers)
	coord  atomic.Pointer[coordBox]
}

// NewIndex builds an empty Index.
func NewIndex(o IndexOptions) *Index {
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
// of recent prefill work (IndexOptions.TTL).
func (ix *Index) SetTTL(d time.Duration) { ix.ttl.Store(int64(max(d, 0))) }

// TTL returns what SetTTL last set.
func (ix *Index) TTL() time.Duration { return time.Duration(ix.ttl.Load()) }

// defaultBlockSize is the engine block size assumed when neither the
// configuration nor the replica's metrics give one.
const defaultBlockSize = 16

// SetBlockSize sets the engine block size assumed where a replica's
// metrics do not give it (IndexOptions.BlockSize); 0 means 16.
func (ix *Index) SetBlockSize(tokens int) {
	if tokens <= 0 {
		tokens = defaultBlockSize
	}
	ix.blockSize.Store(int64(tokens))
}

// BlockSize returns the engine block size SetBlockSize last set.
func (ix *Index) BlockSize() int { return int(ix.blockSize.Load()) }

// SetPeers records how many other routers share the fleet and this Index's
// placements (cluster peers heard from); 0 without a cluster.
func (ix *Index) SetPeers(n int) { ix.peers.Store(int64(max(n, 0))) }

// Peers returns what SetPeers last recorded.
func (ix *Index) Peers() int { return int(ix.peers.Load()) }

// KeyBlock is the number of prompt tokens one key value stands for.
func (ix *Index) KeyBlock() int { return ix.keyBlock }

// Tree is the prefix tree, for statistics and tests. Writes go through the
// Index's methods.
func (ix *Index) Tree() *radix.Tree { return ix.tree }

// IndexStats is a snapshot of the Index's tree: its size (radix.Stats),
// and what it records each replica as holding, by replica ID, in tokens
// (replicas holding nothing are left out). It is telemetry's type itself,
// so the server registers Index.Stats for /metrics without copying fields.
type IndexStats = telemetry.TreeStats

// Stats returns a snapshot of the Index's tree.
func (ix *Index) Stats() IndexStats {
	st := ix.tree.Stats()
	s := IndexStats{Nodes: st.Nodes, Tokens: st.Tokens, Bytes: st.Bytes, Held: map[int]int64{}, HeldExact: map[int]int64{}}
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

// Match appends to dst[:0] the longest prefix of key each replica holds, in
// tokens, in its exact share (exact: key is an exact key) or its
// approximate one, counting only entries used at or after notBefore (zero:
// all). Each Match's Replica is a replica ID. See radix.Tree.MatchInto.
func (ix *Index) Match(dst []radix.Match, key []uint32, exact bool, notBefore time.Time) []radix.Match {
	dst = ix.tree.MatchInto(dst, key, notBefore)
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
// the continuations past it that each replica holds in its approximate
// share: dst[id] for replica ID id. See radix.Tree.Branches.
func (ix *Index) Branches(dst []int32, key []uint32, depth int, notBefore time.Time) ([]int32, int) {
	dst, n := ix.tree.Branches(dst, key, depth, notBefore)
	// Tree IDs 2·id (approximate) fold down to id; the exact shares' odd
	// IDs drop out.
	for id := 0; 2*id < len(dst); id++ {
		dst[id] = dst[2*id]
	}
	return dst[:(len(dst)+1)/2], n
}

// Placement is one recorded entry of the Index, which Retract takes back.
// Its zero value retracts nothing.
type Placement struct {
	ix   *Index
	key  []uint32
	kb   *keyBuffer // key's owner; the key is valid while kb.gen == gen
	gen  uint64
	id   radix.ReplicaID
	held int
}

// Place records that replica rep holds key's prefix as of now (for
// SourceRouter: it will, once the request is prefilled), written by src,
// in its exact share (exact: key is an exact key, precise mode) or its
// approximate one. It returns the placement, which Retract undoes. key
// must stay unchanged until the placement is retracted or no longer
// needed; a key prepared by Router.Prepare is checked for that (see
// Retract).
func (ix *Index) Place(src Source, key []uint32, exact bool, rep *backends.Replica, now time.Time) Placement {
	return ix.place(src, key, exact, nil, rep, now)
}

func (ix *Index) place(src Source, key []uint32, exact bool, kb *keyBuffer, rep *backends.Replica, now time.Time) Placement {
	if len(key) == 0 || src >= numSources {
		return Placement{}
	}
	ix.applyBudget(rep)
	id := treeID(rep.ID(), exact)
	ix.writes[src].Add(1)
	p := Placement{ix: ix, key: key, kb: kb, id: id, held: ix.tree.Insert(key, id, now)}
	if kb != nil {
		p.gen = kb.gen.Load()
	}
	return p
}

// Retract undoes the placement: the replica no longer counts as holding
// what the placement added (the prefix it held before is kept). A placement
// whose key buffer went back to the pool (Router.Release) is not retracted:
// its key may hold another request's values by then; the entry ages out
// instead. Safe on a zero Placement and more than once.
func (p *Placement) Retract() {
	if p.live() {
		p.ix.tree.Undo(p.key, p.id, p.held)
	}
	*p = Placement{}
}

// live reports whether the placement recorded something and its key is
// still its own (a key buffer back in the pool may hold another request's
// values by then).
func (p *Placement) live() bool {
	return p.ix != nil && (p.kb == nil || p.kb.gen.Load() == p.gen)
}

// replicaSlot is what the Index counts for one replica ID.
type replicaSlot struct {
	pending     atomic.Int64 // prompt tokens sent and not yet prefilled
	peerPending atomic.Int64 // the same, of the other routers (SetPeerPending)
	precise     atomic.Bool  // its entries follow its engine's events (SetPrecise)
	budget      atomic.Int64 // approximate share's budget last applied, in tokens; 0: none yet

	// The prefill tokens placed on the replica, each request's settled to
	// its engine's count once reported (workRec.settle), decayed with a
	// half-life (recentWork), as of workAt (unix nanoseconds).
	workMu sync.Mutex
	work   float64
	workAt int64
}

// Trim follows an engine's report that it found only cachedTokens of the
// placement's prompt in its cache, fewer than the Index predicted: the
// engine evicted what lay beyond, unseen by the router. The replica stops
// counting as holder of anything past that point that shares the prompt
// (other conversations branching from it beyond there), while the
// placement's own prompt, which the engine has just prefilled again, stays
// recorded as used now. It reports whether the Index changed; a placement
// whose key buffer went back to the pool is left alone, as for Retract.
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
// reports whether the Index was written; a placement whose key buffer went
// back to the pool is left alone, as for Retract.
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

// EvictExact records that rep no longer holds the exact key past its
// first keep values (its engine reported those blocks removed); what it
// holds of key up to there, and of other keys, stays. Writes counted to
// src.
func (ix *Index) EvictExact(src Source, key []uint32, rep *backends.Replica, keep int) {
	if len(key) == 0 || keep >= len(key) || src >= numSources {
		return
	}
	ix.tree.Undo(key, treeID(rep.ID(), true), max(keep, 0))
	ix.writes[src].Add(1)
}

// Occupancies appends to dst[:0] what each of reps holds in the Index and
// its share (its budget: its cache's capacity when known), in tokens: of
// a precise replica (SetPrecise), its exact share against its capacity;
// of the others, their approximate share. ids is scratch space for the
// replicas' tree IDs, returned for reuse.
func (ix *Index) Occupancies(dst []radix.Occupancy, ids []radix.ReplicaID, reps []*backends.Replica) ([]radix.Occupancy, []radix.ReplicaID) {
	ids = ids[:0]
	for _, r := range reps {
		ids = append(ids, treeID(r.ID(), ix.slot(r.ID()).precise.Load()))
	}
	dst = ix.tree.Occupancies(dst, ids)
	for i, r := range ids {
		if _, exact := replicaOf(r); exact {
			dst[i].Budget /= exactRoom
		}
	}
	return dst, ids
}

// Pending is the number of prompt tokens sent to rep and not yet
// prefilled, by this router and its peers (SetPeerPending).
func (ix *Index) Pending(rep *backends.Replica) int64 { return ix.slot(rep.ID()).pendingAll() }

// SetPeerPending records the prompt tokens other routers of the cluster
// sent to rep and not yet saw prefilled, as they last reported them.
func (ix *Index) SetPeerPending(rep *backends.Replica, tokens int64) {
	ix.slot(rep.ID()).peerPending.Store(max(tokens, 0))
}

// OwnPending is the number of prompt tokens this router sent to rep and
// not yet saw prefilled (what it reports to its peers).
func (ix *Index) OwnPending(rep *backends.Replica) int64 { return ix.slot(rep.ID()).pending.Load() }

// pendingAll is the slot's pending prefill, own and peers'.
func (s *replicaSlot) pendingAll() int64 { return s.pending.Load() + s.peerPending.Load() }

// addWork counts tokens of prefill placed on rep at now.
func (ix *Index) addWork(rep *backends.Replica, tokens int64, now time.Time, halfLife time.Duration) {
	s := ix.slot(rep.ID())
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

// workRec is the prefill work a decision counted on a replica at its time
// (addWork), kept until it is settled (set).
type workRec struct {
	ix       *Index
	rep      *backends.Replica
	tokens   int64
	at       time.Time
	halfLife time.Duration
}

// set replaces the prefill work counted for the decision with tokens, as of
// the decision's time. Once; a no-op on a zero workRec.
func (w *workRec) set(tokens int64) {
	if w.ix == nil {
		return
	}
	if d := tokens - w.tokens; d != 0 {
		w.ix.addWork(w.rep, d, w.at, w.halfLife)
	}
	w.ix = nil
}

// settle sets the work to what the engine computed: its prompt tokens less
// those it found cached. It returns them, and whether they differ from the
// work counted. A no-op (false) without the engine's prompt count, or once
// set.
func (w *workRec) settle(prompt, cached int) (int64, bool) {
	if prompt <= 0 || w.ix == nil {
		return 0, false
	}
	tokens := int64(max(prompt-cached, 0))
	changed := tokens != w.tokens
	w.set(tokens)
	return tokens, changed
}

// recentWork is the prefill tokens placed on rep, each counting half as
// much every halfLife since (0: never less), at now.
func (ix *Index) recentWork(rep *backends.Replica, now time.Time, halfLife time.Duration) float64 {
	s := ix.slot(rep.ID())
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

// slotsTo returns the slots by replica ID, at least up to maxID, from one
// load (the hot path's view of every candidate's counters).
func (ix *Index) slotsTo(maxID int) []*replicaSlot {
	if s := ix.slots.Load(); s != nil && maxID < len(*s) {
		return *s
	}
	ix.slot(maxID)
	return *ix.slots.Load()
}

// AddPending counts tokens of prompt sent to rep and not yet prefilled,
// until Prefilled is called on the result.
func (ix *Index) AddPending(rep *backends.Replica, tokens int64) PendingPrefill {
	if tokens <= 0 {
		return PendingPrefill{}
	}
	c := &ix.slot(rep.ID()).pending
	c.Add(tokens)
	return PendingPrefill{c: c, n: tokens}
}

// PendingPrefill is prompt tokens counted as pending on a replica.
type PendingPrefill struct {
	c *atomic.Int64
	n int64
}

// Prefilled stops counting the tokens. Safe on a zero PendingPrefill and
// more than once.
func (p *PendingPrefill) Prefilled() {
	if p.c != nil {
		p.c.Add(-p.n)
		p.c = nil
	}
}

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
// they keep within its capacity as the engine evicts (EvictExact), and
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
