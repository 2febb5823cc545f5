package precise

import (
	"encoding/binary"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/tokenize"
)

// Slot markers of evBlock.parent.
const (
	evNone int32 = -1 // a first block: no parent
	evFree int32 = -2 // a slot on the free list
)

// evBlock is one engine block a replica reported stored, in a slot of
// evState.slots. It is pointer-free so that the slots cost the garbage
// collector nothing to scan; what only blocks of an engine block size other
// than the key block need is in evState.ext.
type evBlock struct {
	parent int32 // slot of the block before, evNone, or evFree
	kids   int32 // slots whose parent this is
	// refs counts the stores of the block's hash not yet removed (one per
	// medium or cache group that reported it); at 0 the engine no longer
	// holds it, and the slot stays only while kids point at it (their
	// paths go through its values).
	refs int32
	nv   int32 // key values on the path up to and including this block
	own  int32 // of them, the ones whose key block ends in this block
	val  uint32
	// alien marks a block keyed by more than its tokens (see add): it and
	// the blocks after it are never placed.
	alien bool
	// chain is the running hash after the last key block that ends on the
	// path up to here.
	chain tokenize.Chain
}

// evExt is what a block needs beyond evBlock when the engine's block size
// differs from the key block.
type evExt struct {
	vals    []uint32 // own values after the first
	pending []uint32 // the path's tokens past its last whole key block
	// below, for a block that completes no key value, holds the distinct
	// values at position nv+1 placed through it (their key block ends in
	// a later block): removing the block evicts each.
	below []uint32
}

// evState is one replica's engine blocks: the map from engine hash to the
// router's own key, and the counters of what was applied. It is owned by
// its evFollow, which serialises access.
type evState struct {
	ix       index.EngineWriter // the Index, as the engines write it
	rep      *backends.Replica
	model    func(*backends.Replica) string
	keyBlock int
	max      int // slots in use past which the state is dropped, whatever the capacity
	// tiers is whether the replica reported blocks in another tier than
	// the GPU's (a CPU offload), which its metrics' capacity leaves out.
	tiers bool

	// byHash maps a block's key (evSlotKey: its engine hash, mixed with its
	// namespace when it has one) to its slot.
	byHash map[uint64]int32
	// spaces holds, for an engine hash that blocks of a namespace other
	// than the default one hold, those namespaces (evSpace), so that a
	// removal, which names the hash alone, finds them.
	spaces map[uint64][]uint64
	slots  []evBlock
	free   []int32
	ext    map[int32]*evExt
	// otherGroups are the cache groups seen storing blocks that are not
	// indexed (Mamba, sliding window): their removals name hashes the
	// attention group may hold too, and are ignored.
	otherGroups map[int]bool

	path, stream []uint32 // scratch
	gone         []int32  // slots removed, to evict (evictGone)

	// The path walked last (see walk): the key up to pcSlot, whose parent
	// is pcParent (pcSlot evNone when none), and its reach, while
	// pcReachOK (no block went since); pcCut is whether a block on it is
	// removed or alien, which a reach of the whole key does not say when
	// that block completes no value.
	pcSlot, pcParent int32
	pcPath           []uint32
	pcReach          int
	pcReachOK        bool
	pcCut            bool

	c *evCounters
}

func newEvState(ix *index.Index, rep *backends.Replica, model func(*backends.Replica) string, keyBlock, maxBlocks int, c *evCounters) *evState {
	return &evState{
		ix: ix.EngineWriter(), rep: rep, model: model, keyBlock: keyBlock, max: maxBlocks,
		byHash: make(map[uint64]int32), spaces: make(map[uint64][]uint64), ext: make(map[int32]*evExt), otherGroups: make(map[int]bool),
		c: c, pcSlot: evNone,
	}
}

// apply plays one batch into the state and the Index.
func (s *evState) apply(b kvevents.Batch, now time.Time) {
	for _, ev := range b.Events {
		if ev, ok := ev.(kvevents.BlockRemoved); ok {
			s.removed(ev)
			continue
		}
		s.evictGone()
		switch ev := ev.(type) {
		case kvevents.BlockStored:
			s.stored(ev, now)
		case kvevents.AllBlocksCleared:
			s.c.clears.Add(1)
			s.clear()
		}
	}
	s.evictGone()
}

// used is the number of slots holding a block.
func (s *evState) used() int { return len(s.slots) - len(s.free) }

// stored records a run of blocks and places the path through its last one.
func (s *evState) stored(ev kvevents.BlockStored, now time.Time) {
	n := uint64(len(ev.BlockHashes))
	if !kvevents.Indexable(ev) {
		if !kvevents.Attention(ev.SpecKind) {
			s.otherGroups[ev.GroupIdx] = true
		}
		s.c.skipped.Add(n)
		return
	}
	at := evNone
	space := evSpace(ev)
	if ev.HasParent {
		p, ok := s.byHash[evSlotKey(ev.ParentHash, space)]
		if !ok {
			// Its parent's store was missed, or dropped by a reset:
			// the run's key is unknown.
			s.c.unplaceable.Add(n)
			return
		}
		at = p
	}
	bs := ev.BlockSize
	if ev.Medium != "" && !strings.EqualFold(ev.Medium, "GPU") {
		s.tiers = true
	}
	limit := s.limit(bs)
	grew := false // a new block completed a key value
	for i, h := range ev.BlockHashes {
		if slot, ok := s.byHash[evSlotKey(h, space)]; ok {
			// Held already (another medium or group, or a second
			// copy): one more store to be removed.
			s.slots[slot].refs++
			at = slot
			continue
		}
		if s.used() >= limit {
			s.c.overflows.Add(1)
			s.c.unplaceable.Add(n - uint64(i)) //nolint:gosec // i < n
			s.clear()
			return
		}
		var extra []byte
		if i < len(ev.ExtraKeys) {
			extra = ev.ExtraKeys[i]
		}
		at = s.add(at, h, space, ev, ev.TokenIDs[i*bs:(i+1)*bs], extra)
		grew = grew || s.slots[at].own > 0
	}
	s.c.stored.Add(n)
	if !grew {
		// Stores of blocks held already, or of blocks smaller than a key
		// block that end none (SGLang's pages): nothing new to place.
		return
	}
	// Only as far as the engine holds every block: a block under one it
	// removed cannot be hit (engine events keep ancestors stored first;
	// this guards against events that do not).
	if key, reach := s.walk(at, true); reach > 0 {
		s.ix.Place(key[:reach], true, s.rep, now)
	}
}

// minCapBlocks is the least limit gives a replica of a known capacity.
const minCapBlocks = 1024

// capRoom is limit's bound as a multiple of the replica's capacity in
// blocks: the state keeps removed blocks whose children the engine still
// holds beside the blocks it holds.
const capRoom = 2

// limit is the most blocks the state keeps for engine blocks of bs
// tokens: capRoom times the replica's capacity in blocks when it is known
// (its configured cache_tokens, of every tier, else the GPU capacity its
// metrics report while it has reported no block of another tier), at
// least minCapBlocks; at most s.max whatever it claims. A replica that
// reports more blocks than it can hold overflows at its own capacity.
func (s *evState) limit(bs int) int {
	// CacheTokens is the configured capacity, else the metrics' one; the
	// configured one alone is read (Spec copies its models) only when the
	// metrics' would leave a tier out.
	var tokens int64
	if s.tiers {
		tokens = s.rep.Spec().CacheTokens
	} else {
		tokens = s.rep.CacheTokens()
	}
	if tokens <= 0 || bs <= 0 {
		return s.max
	}
	blocks := tokens/int64(bs) + 1
	return int(min(int64(s.max), max(minCapBlocks, capRoom*blocks)))
}

// add stores block h of namespace space, holding toks with the extra keys
// extra, after slot parent and returns its slot.
func (s *evState) add(parent int32, h, space uint64, ev kvevents.BlockStored, toks []uint32, extra []byte) int32 {
	var chain tokenize.Chain
	var pending []uint32
	var nv int32
	keys := kvevents.ReadBlockKeys(extra, ev.LoraName, parent == evNone)
	if parent == evNone {
		salt := keys.Salt
		if salt == "" {
			salt = ev.CacheSalt
		}
		chain = tokenize.NewChain(tokenize.SaltedName(evChainName(ev, s.model, s.rep), salt))
	} else {
		p := &s.slots[parent]
		chain, nv = p.chain, p.nv
		if x := s.ext[parent]; x != nil {
			pending = x.pending
		}
	}
	b := evBlock{parent: parent, refs: 1, nv: nv}
	if keys.Other {
		// The engine mixed other inputs into the block (multimodal
		// hashes): its tokens alone do not say what it holds, and no
		// request key made of tokens may match it. It is kept, for the
		// blocks chained to it, and not placed; folding the inputs in
		// keys what follows apart too.
		chain, _ = chain.Next(evWords(extra))
		b.alien = true
	}
	var x *evExt
	if len(pending) == 0 && len(toks) == s.keyBlock {
		b.chain, b.val = chain.Next(toks)
		b.own = 1
	} else {
		// Cut the path's tokens in key blocks: pending ones first.
		st := append(append(s.stream[:0], pending...), toks...)
		s.stream = st
		x = &evExt{}
		for len(st) >= s.keyBlock {
			var v uint32
			chain, v = chain.Next(st[:s.keyBlock])
			st = st[s.keyBlock:]
			if b.own == 0 {
				b.val = v
			} else {
				x.vals = append(x.vals, v)
			}
			b.own++
		}
		b.chain = chain
		if len(st) > 0 {
			x.pending = append([]uint32(nil), st...)
		}
	}
	b.nv += b.own
	slot := s.alloc()
	s.slots[slot] = b
	if x != nil {
		s.ext[slot] = x
	}
	if parent != evNone {
		s.slots[parent].kids++
		if b.own > 0 {
			s.noteBelow(parent, b.nv-b.own, b.val)
		}
	}
	s.byHash[evSlotKey(h, space)] = slot
	if space != 0 {
		s.spaces[h] = append(s.spaces[h], space)
	}
	return slot
}

// noteBelow records value v, at position pos+1 of its path, in the blocks
// from slot up that complete no value of their own and end at pos: the key
// block of v began in them.
func (s *evState) noteBelow(slot int32, pos int32, v uint32) {
	for ; slot != evNone; slot = s.slots[slot].parent {
		b := &s.slots[slot]
		if b.own > 0 || b.nv != pos {
			return
		}
		x := s.ext[slot]
		for _, w := range x.below {
			if w == v {
				return // and so are the blocks above
			}
		}
		x.below = append(x.below, v)
	}
}

// alloc returns a free slot.
func (s *evState) alloc() int32 {
	if n := len(s.free); n > 0 {
		slot := s.free[n-1]
		s.free = s.free[:n-1]
		if slot == s.pcSlot || slot == s.pcParent {
			s.pcSlot = evNone // its path is another block's from now on
		}
		return slot
	}
	s.slots = append(s.slots, evBlock{})
	return int32(len(s.slots) - 1) //nolint:gosec // bounded by max
}

// walk returns the key of the path up to and including slot, valid until
// the next walk, and with needReach its reach: how many of its leading
// values a request can hit (all of them unless a block on the path was
// removed or is alien). It starts from the path walked last when slot is
// that path's last block, its parent or its child (a run stored after it,
// a conversation removed block by block), else walks up from slot.
func (s *evState) walk(slot int32, needReach bool) (key []uint32, reach int) {
	b := &s.slots[slot]
	switch {
	case s.pcSlot == evNone || needReach && !s.pcReachOK:
		return s.pathTo(slot)
	case slot == s.pcSlot:
	case slot == s.pcParent && !s.pcCut:
		s.pcPath = s.pcPath[:b.nv]
		s.pcReach = min(s.pcReach, int(b.nv))
	case b.parent == s.pcSlot:
		if b.own > 0 {
			s.pcPath = append(s.pcPath, b.val)
		}
		if b.own > 1 {
			s.pcPath = append(s.pcPath, s.ext[slot].vals...)
		}
		switch {
		case b.refs == 0 || b.alien:
			s.pcCut = true
		case !s.pcCut:
			s.pcReach = len(s.pcPath)
		}
	default:
		return s.pathTo(slot)
	}
	s.pcSlot, s.pcParent = slot, b.parent
	return s.pcPath, s.pcReach
}

// pathTo is walk from slot up to the first block.
func (s *evState) pathTo(slot int32) (key []uint32, reach int) {
	n := s.slots[slot].nv
	if cap(s.pcPath) < int(n) {
		s.pcPath = make([]uint32, n, max(int(n), 2*cap(s.pcPath)))
	}
	p := s.pcPath[:n]
	r := n
	cut := false
	s.pcSlot, s.pcParent = slot, s.slots[slot].parent
	for ; slot != evNone; slot = s.slots[slot].parent {
		b := &s.slots[slot]
		start := b.nv - b.own
		if b.refs == 0 || b.alien {
			r = min(r, start)
			cut = true
		}
		if b.own == 0 {
			continue
		}
		p[start] = b.val
		if b.own > 1 {
			copy(p[start+1:b.nv], s.ext[slot].vals)
		}
	}
	s.pcPath, s.pcReach, s.pcReachOK, s.pcCut = p, int(r), true, cut
	return p, int(r)
}

// removed drops the removed blocks that no other store holds, and evicts
// their values and everything past them from the Index. A removal names
// an engine hash alone: where blocks of several namespaces share it (an
// engine whose hashes leave the namespace out), it drops the hash from
// every namespace, as the state cannot tell which one the engine evicted;
// a block it still holds is then missed, never one it evicted counted.
func (s *evState) removed(ev kvevents.BlockRemoved) {
	if s.otherGroups[ev.GroupIdx] {
		s.c.skipped.Add(uint64(len(ev.BlockHashes)))
		return
	}
	for _, h := range ev.BlockHashes {
		found := s.drop(h, 0)
		if spaces, ok := s.spaces[h]; ok {
			for _, space := range slices.Clone(spaces) {
				found = s.drop(h, space) || found
			}
		}
		if found {
			s.c.removed.Add(1)
		} else {
			s.c.unknownRemoved.Add(1)
		}
	}
}

// drop takes one store of block h of namespace space away, and queues the
// block for eviction when none is left. It reports whether the state held
// the block.
func (s *evState) drop(h, space uint64) bool {
	k := evSlotKey(h, space)
	slot, ok := s.byHash[k]
	if !ok {
		return false
	}
	b := &s.slots[slot]
	if b.refs--; b.refs > 0 {
		return true
	}
	s.pcReachOK = false // the block may be on the path walked last
	delete(s.byHash, k)
	if space != 0 {
		rest := slices.DeleteFunc(s.spaces[h], func(v uint64) bool { return v == space })
		if len(rest) == 0 {
			delete(s.spaces, h)
		} else {
			s.spaces[h] = rest
		}
	}
	s.gone = append(s.gone, slot)
	return true
}

// evictGone evicts from the Index what the blocks removed since the last
// call held, and frees their slots. Blocks removed together are often a
// whole conversation's, in any order: only those whose parent is still
// held are evicted, each taking out what follows it; a block whose parent
// was removed (with it or earlier) has nothing left in the Index.
func (s *evState) evictGone() {
	if len(s.gone) == 0 {
		return
	}
	for _, slot := range s.gone {
		if p := s.slots[slot].parent; p == evNone || s.slots[p].refs > 0 {
			s.evictFrom(slot)
		}
	}
	for _, slot := range s.gone {
		s.release(slot)
	}
	s.gone = s.gone[:0]
}

// evictFrom takes out of the Index the replica's values from slot's first
// own one on, and all that follows them.
func (s *evState) evictFrom(slot int32) {
	b := s.slots[slot]
	keep := int(b.nv - b.own)
	if b.own > 0 {
		key, _ := s.walk(slot, false)
		s.ix.EvictExact(key[:keep+1], s.rep, keep)
		return
	}
	x := s.ext[slot]
	if x == nil || len(x.below) == 0 {
		return
	}
	key := s.path[:0]
	if b.parent != evNone && keep > 0 {
		p, _ := s.walk(b.parent, false)
		key = append(key, p[:keep]...)
	}
	key = append(key, 0)
	s.path = key
	for _, v := range x.below {
		key[keep] = v
		s.ix.EvictExact(key, s.rep, keep)
	}
}

// release frees slot and, up from it, every slot that only its children
// kept.
func (s *evState) release(slot int32) {
	for slot != evNone {
		b := &s.slots[slot]
		if b.refs > 0 || b.kids > 0 || b.parent == evFree {
			return // held, kept for its children, or freed with one
		}
		parent := b.parent
		*b = evBlock{parent: evFree}
		delete(s.ext, slot)
		s.free = append(s.free, slot)
		if parent != evNone {
			s.slots[parent].kids--
		}
		slot = parent
	}
}

// clear evicts from the Index every path the state placed (from each first
// block on) and empties the state.
func (s *evState) clear() {
	var key [1]uint32
	for i := range s.slots {
		b := &s.slots[i]
		if b.parent != evNone {
			continue // a later block, or free
		}
		if b.own > 0 {
			key[0] = b.val
			s.ix.EvictExact(key[:], s.rep, 0)
		} else if x := s.ext[int32(i)]; x != nil { //nolint:gosec // a slot index
			for _, v := range x.below {
				key[0] = v
				s.ix.EvictExact(key[:], s.rep, 0)
			}
		}
	}
	s.pcSlot = evNone
	clear(s.byHash)
	clear(s.spaces)
	clear(s.ext)
	s.slots = s.slots[:0]
	s.free = s.free[:0]
}

// evChainName is the name the chain of a first block starts from: the
// event's LoRA adapter, else the replica's model. An adapter named only by
// number (SGLang's lora_id) gets a name no request key uses: its blocks
// are tracked, never hit.
func evChainName(ev kvevents.BlockStored, model func(*backends.Replica) string, rep *backends.Replica) string {
	switch {
	case ev.LoraName != "":
		return ev.LoraName
	case ev.LoraID != 0:
		return "\x00lora-id\x00" + strconv.FormatInt(ev.LoraID, 10)
	}
	return model(rep)
}

// evSpace is the namespace of a stored run's blocks: 0 for the default
// one (the replica's model, no salt in the event), else a digest of the
// adapter and of the cache salt that SGLang's metadata names. SGLang's
// block hashes leave both out, so blocks of the base model and of an
// adapter, or of two salts, with equal tokens share a hash; keyed on
// (hash, namespace) they stay apart. vLLM's hashes include the adapter
// and the salt already, and a run it continues names the same adapter as
// its parent's, so the key changes nothing for it.
func evSpace(ev kvevents.BlockStored) uint64 {
	if ev.LoraName == "" && ev.LoraID == 0 && ev.CacheSalt == "" {
		return 0
	}
	const offset, prime = 14695981039346656037, 1099511628211 // FNV-1a
	h := uint64(offset)
	for _, part := range [...]string{ev.LoraName, ev.CacheSalt} {
		for i := range len(part) {
			h = (h ^ uint64(part[i])) * prime
		}
		h = (h ^ 0xff) * prime // a separator no string byte of the parts ends on
	}
	for id := uint64(ev.LoraID); id != 0; id >>= 8 { //nolint:gosec // the id's bits
		h = (h ^ id&0xff) * prime
	}
	return max(h, 1)
}

// evSlotKey is the key of block h of namespace space in evState.byHash: the
// hash itself in the default namespace, else the two mixed (SplitMix64's
// finaliser), so that keys of different namespaces differ.
func evSlotKey(h, space uint64) uint64 {
	if space == 0 {
		return h
	}
	z := h ^ space*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// evWords packs bytes into words for a Chain, with their length first so
// that no two byte strings give the same words.
func evWords(b []byte) []uint32 {
	w := make([]uint32, 1, 1+(len(b)+3)/4)
	w[0] = uint32(len(b)) //nolint:gosec // a msgpack value's length
	for len(b) > 0 {
		var q [4]byte
		n := copy(q[:], b)
		w = append(w, binary.LittleEndian.Uint32(q[:]))
		b = b[n:]
	}
	return w
}
