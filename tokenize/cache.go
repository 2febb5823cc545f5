package tokenize

import (
	"slices"
	"sync"
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
	kindConversation                  // the key of a chat request of 2+ messages
	numKinds
)

// tokenCache maps text keys to immutable token lists, bounded in bytes with
// least-recently-used eviction in each shard. It is safe for concurrent use.
type tokenCache struct {
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu       sync.Mutex
	m        map[key128]*cacheEntry
	lru      cacheEntry // sentinel: lru.next is the most recently used
	bytes    int64
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
	key  key128
	toks []uint32   // the tokens, or their first part; never modified once stored
	more [][]uint32 // the rest, in order (see take); usually nil
	cost int64      // entryCost of the above
	kind cacheKind
	prev *cacheEntry
	next *cacheEntry
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
		s.m = make(map[key128]*cacheEntry)
		s.lru.next, s.lru.prev = &s.lru, &s.lru
		s.maxBytes = maxBytes / cacheShards
	}
	return c
}

func (c *tokenCache) shard(k key128) *cacheShard {
	return &c.shards[k.a>>(64-4)]
}

// find returns the parts of the entry stored under k, counting a hit or a
// miss for kind. The entry becomes the most recently used, or with remove
// it leaves the cache (see take).
func (c *tokenCache) find(kind cacheKind, k key128, remove bool) (toks []uint32, more [][]uint32, ok bool) {
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e == nil {
		s.kinds[kind].misses++
		return nil, nil, false
	}
	s.kinds[kind].hits++
	switch {
	case remove:
		e.unlink()
		delete(s.m, k)
		s.account(e, -1)
	case s.lru.next != e:
		e.unlink()
		s.pushFront(e)
	}
	return e.toks, e.more, true
}

// get appends the tokens stored under k to dst and reports whether they
// were found.
func (c *tokenCache) get(dst []uint32, kind cacheKind, k key128) ([]uint32, bool) {
	toks, more, ok := c.find(kind, k, false)
	return appendParts(dst, toks, more), ok
}

// appendParts appends the tokens of an entry's parts to dst.
func appendParts(dst, toks []uint32, more [][]uint32) []uint32 {
	dst = append(dst, toks...)
	for _, part := range more {
		dst = append(dst, part...)
	}
	return dst
}

// lookup returns the tokens stored under k, which must be a single-part
// entry (a message's), without copying them: they are immutable, and the
// caller may keep them as long as it likes (they stay in memory while
// anything refers to them).
func (c *tokenCache) lookup(kind cacheKind, k key128) ([]uint32, bool) {
	toks, _, ok := c.find(kind, k, false)
	return toks, ok
}

// put stores a copy of toks under k, evicting the least recently used
// entries of its shard to stay within the bound, and returns the copy,
// which is immutable. Token lists larger than the shard's bound are not
// stored (put returns nil).
func (c *tokenCache) put(kind cacheKind, k key128, toks []uint32) []uint32 {
	if entryCost(len(toks)) > c.shard(k).maxBytes {
		return nil
	}
	own := slices.Clone(toks)
	c.putParts(kind, k, own, nil)
	return own
}

// putParts stores under k the tokens toks followed by those of each of
// more, without copying them: the cache owns them from now on (see take).
// The entry is charged for their capacity.
func (c *tokenCache) putParts(kind cacheKind, k key128, toks []uint32, more [][]uint32) {
	s := c.shard(k)
	cost := entryCost(cap(toks)) + partsCost(more)
	if cost > s.maxBytes {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[k]; e != nil {
		// Stored meanwhile by another goroutine: the tokens are the same.
		return
	}
	e := &cacheEntry{key: k, toks: toks, more: more, cost: cost, kind: kind}
	s.m[k] = e
	s.pushFront(e)
	s.account(e, 1)
	for s.bytes > s.maxBytes {
		old := s.lru.prev
		old.unlink()
		delete(s.m, old.key)
		s.account(old, -1)
	}
}

// account adds (sign 1) or removes (sign -1) e's entry and bytes.
func (s *cacheShard) account(e *cacheEntry, sign int) {
	s.bytes += int64(sign) * e.cost
	kc := &s.kinds[e.kind]
	kc.entries += sign
	kc.bytes += int64(sign) * e.cost
}

// take removes the entry stored under k and hands its parts to the caller,
// which may extend the entry by appending a part to more and store it again
// with putParts. Appending is safe while earlier readers still copy the
// entry out: get's callers read more only up to the length they saw, and
// the entry, being out of the cache, has no other owner to append to it.
func (c *tokenCache) take(kind cacheKind, k key128) (toks []uint32, more [][]uint32, ok bool) {
	return c.find(kind, k, true)
}

// partsCost is the cost of the parts of an entry beyond its first.
func partsCost(more [][]uint32) int64 {
	n := int64(cap(more)) * 24 // slice headers
	for _, part := range more {
		n += int64(cap(part)) * 4
	}
	return n
}

func entryCost(n int) int64 { return int64(n)*4 + entryOverhead }

func (s *cacheShard) pushFront(e *cacheEntry) {
	e.prev = &s.lru
	e.next = s.lru.next
	e.next.prev = e
	s.lru.next = e
}

func (e *cacheEntry) unlink() {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
}

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
