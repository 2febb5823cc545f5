package tokenize

import (
	"slices"
	"sync"

	"github.com/kvroute/kvroute/lru"
)

// cacheShards is the number of independently locked parts of a tokenCache.
const cacheShards = 16

// entryOverhead estimates the bytes an entry costs beyond its tokens: the
// entry itself, its map slot and allocation slack.
const entryOverhead = 128

// key128 identifies a cached text by a randomly seeded 64-bit hash of it and
// its length. A false hit needs a collision of the seeded hash between two
// texts of the same length (about one in 2^64 per pair, and a routing key is
// only a hint: a false hit can misplace a request, never change its answer).
type key128 struct{ a, b uint64 }

// cacheKind is what an entry of the token cache holds. The kinds share the
// cache's bound and recency order, so whichever the traffic uses most gets
// the room; each has its own counters. Keys of different kinds never
// collide (the keys' second words differ in their top bits).
type cacheKind uint8

const (
	kindMessage      cacheKind = iota // a whole message or the tool definitions
	kindChunk                         // a chunk of a long text, or an Encode text
	kindConversation                  // the block key of a chat request of 2+ messages
	numKinds
)

// tokenCache maps text keys to immutable token lists, bounded in bytes with
// least-recently-used eviction in each shard. It is safe for concurrent use.
type tokenCache struct {
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu       sync.Mutex
	lru      lru.Cache[key128, cacheEntry] // bounded by the entries' cost, maxBytes
	maxBytes int64
	kinds    [numKinds]kindCounters
	_        [64]byte // keep shards' hot fields on separate cache lines
}

type kindCounters struct {
	hits, misses uint64
	entries      int
	bytes        int64
}

type cacheEntry struct {
	toks []uint32 // the tokens (the blocks of a conversation); never modified once stored
	conv *convTail
	cost int64 // entryCost of the above
	kind cacheKind
	// claimed: a caller of extend has the room after toks (see extend).
	claimed bool
}

// CacheCounters are the counters of one kind of cache entry.
type CacheCounters struct {
	Hits     uint64 // lookups that found their text
	Misses   uint64 // lookups that did not
	Entries  int    // texts held now
	Bytes    int64  // estimated memory held now, tokens plus per-entry overhead
	MaxBytes int64  // bound on the Bytes of all kinds together (shared)
}

// newTokenCache returns a cache bounded by maxBytes in total.
func newTokenCache(maxBytes int64) *tokenCache {
	c := &tokenCache{}
	for i := range c.shards {
		s := &c.shards[i]
		s.maxBytes = maxBytes / cacheShards
		s.lru.Init(lru.Options[cacheEntry]{
			MaxCost: max(s.maxBytes, 1),
			Cost:    func(e cacheEntry) int64 { return e.cost },
			Evicted: func(e *cacheEntry) { s.account(e, -1) },
		})
	}
	return c
}

func (c *tokenCache) shard(k key128) *cacheShard {
	return &c.shards[k.a>>(64-4)]
}

// convTail is what a conversation entry keeps beside its blocks, to go on
// from them: see AppendBlocks.
type convTail struct {
	chain  uint64   // the chain's state after the last whole block
	tokens int      // the tokens of the whole key
	tail   []uint32 // the tokens after the last whole block, fewer than a block
	// buf holds the tail when it fits, so that an entry, its tail and
	// their tokens are one allocation at the default block size.
	buf [DefaultKeyBlock]uint32
}

// convEntry is a conversation's cache entry with its tail, in one
// allocation.
type convEntry struct {
	lru.Entry[key128, cacheEntry]
	conv convTail
}

// find returns the tokens and tail of the entry stored under k, counting a
// hit or a miss for kind. The entry becomes the most recently used.
func (c *tokenCache) find(kind cacheKind, k key128) (toks []uint32, conv *convTail, ok bool) {
	toks, conv, _, ok = c.lookupEntry(kind, k, false)
	return toks, conv, ok
}

// extend is find for a caller that will store a longer entry whose tokens
// start with the found ones. The first such caller of an entry gets mine:
// it may append to toks in place, within their capacity, and store the
// result with putConversation, since no other entry's tokens extend past
// toks in that backing array, and readers of the found entry (and of any
// shorter entry sharing the array) never read past their own length. Later
// callers must copy toks before appending.
func (c *tokenCache) extend(kind cacheKind, k key128) (toks []uint32, conv *convTail, mine, ok bool) {
	return c.lookupEntry(kind, k, true)
}

func (c *tokenCache) lookupEntry(kind cacheKind, k key128, claim bool) (toks []uint32, conv *convTail, mine, ok bool) {
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	le := s.lru.Get(k)
	if le == nil {
		s.kinds[kind].misses++
		return nil, nil, false, false
	}
	s.kinds[kind].hits++
	e := &le.Value
	if claim && !e.claimed {
		e.claimed, mine = true, true
	}
	return e.toks, e.conv, mine, true
}

// get appends the tokens stored under k to dst and reports whether they
// were found.
func (c *tokenCache) get(dst []uint32, kind cacheKind, k key128) ([]uint32, bool) {
	toks, _, ok := c.find(kind, k)
	return append(dst, toks...), ok
}

// put stores a copy of toks under k, evicting the least recently used
// entries of its shard to stay within the bound. Token lists larger than
// the shard's bound are not stored.
func (c *tokenCache) put(kind cacheKind, k key128, toks []uint32) {
	if entryCost(len(toks)) > c.shard(k).maxBytes {
		return
	}
	c.insert(k, &lru.Entry[key128, cacheEntry]{Value: cacheEntry{toks: slices.Clone(toks), kind: kind, cost: entryCost(len(toks))}})
}

// putConversation stores under k a conversation's blocks, without copying
// them, with its chain state, its length in tokens and a copy of its tail.
// The cache owns blocks from now on, and nothing may modify them (but see
// extend). The entry is charged for their length: entries that share a
// backing array are each charged for their part of it, and the spare
// capacity is not charged.
func (c *tokenCache) putConversation(k key128, blocks []uint32, chain uint64, tokens int, tail []uint32) {
	ce := &convEntry{conv: convTail{chain: chain, tokens: tokens}}
	ce.conv.tail = append(ce.conv.buf[:0], tail...)
	cost := entryCost(len(blocks)) + convTailBytes
	if len(tail) > len(ce.conv.buf) {
		cost += int64(cap(ce.conv.tail)) * 4
	}
	ce.Value = cacheEntry{toks: blocks, conv: &ce.conv, kind: kindConversation, cost: cost}
	c.insert(k, &ce.Entry)
}

// insert stores e under k, evicting the least recently used entries of
// its shard to stay within the bound. An entry larger than the shard's
// bound is not stored.
func (c *tokenCache) insert(k key128, e *lru.Entry[key128, cacheEntry]) {
	s := c.shard(k)
	if e.Value.cost > s.maxBytes {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lru.Peek(k) != nil {
		// Stored meanwhile by another goroutine: the tokens are the same.
		return
	}
	s.account(&e.Value, 1)
	s.lru.PutEntry(k, e)
}

// account adds (sign 1) or removes (sign -1) e's entry and bytes.
func (s *cacheShard) account(e *cacheEntry, sign int) {
	kc := &s.kinds[e.kind]
	kc.entries += sign
	kc.bytes += int64(sign) * e.cost
}

// convTailBytes estimates a conversation entry's tail cost: the convTail,
// its inline tokens and the allocation's slack.
const convTailBytes = 128

func entryCost(n int) int64 { return int64(n)*4 + entryOverhead }

// counters sums the shards' counters of each kind.
func (c *tokenCache) counters() [numKinds]CacheCounters {
	var out [numKinds]CacheCounters
	if c == nil {
		return out
	}
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		for k := range out {
			kc := &s.kinds[k]
			out[k].Hits += kc.hits
			out[k].Misses += kc.misses
			out[k].Entries += kc.entries
			out[k].Bytes += kc.bytes
			out[k].MaxBytes += s.maxBytes
		}
		s.mu.Unlock()
	}
	return out
}
