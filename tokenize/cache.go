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

// tokenCache maps text keys to immutable token slices, bounded in bytes with
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
	hits     uint64
	misses   uint64
	_        [64]byte // keep shards' hot fields on separate cache lines
}

type cacheEntry struct {
	key  key128
	toks []uint32   // the tokens, or their first part; never modified once stored
	more [][]uint32 // the rest, in order (see take); usually nil
	cost int64      // entryCost of the above
	prev *cacheEntry
	next *cacheEntry
}

// CacheCounters are one cache's counters.
type CacheCounters struct {
	Hits     uint64 // lookups that found their text
	Misses   uint64 // lookups that did not
	Entries  int    // texts held now
	Bytes    int64  // estimated memory held now, tokens plus per-entry overhead
	MaxBytes int64  // bound on Bytes
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

// get appends the tokens stored under k to dst and reports whether they
// were found.
func (c *tokenCache) get(dst []uint32, k key128) ([]uint32, bool) {
	s := c.shard(k)
	s.mu.Lock()
	e := s.m[k]
	if e == nil {
		s.misses++
		s.mu.Unlock()
		return dst, false
	}
	s.hits++
	if s.lru.next != e {
		e.unlink()
		s.pushFront(e)
	}
	toks, more := e.toks, e.more
	s.mu.Unlock()
	dst = append(dst, toks...)
	for _, part := range more {
		dst = append(dst, part...)
	}
	return dst, true
}

// put stores a copy of toks under k, evicting the least recently used
// entries of its shard to stay within the bound. Token lists larger than the
// shard's bound are not stored.
func (c *tokenCache) put(k key128, toks []uint32) {
	if entryCost(len(toks)) > c.shard(k).maxBytes {
		return
	}
	c.putParts(k, slices.Clone(toks), nil)
}

// putParts stores under k the tokens toks followed by those of each of
// more, without copying them: the cache owns them from now on (see take).
// The entry is charged for their capacity.
func (c *tokenCache) putParts(k key128, toks []uint32, more [][]uint32) {
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
	e := &cacheEntry{key: k, toks: toks, more: more, cost: cost}
	s.m[k] = e
	s.pushFront(e)
	s.bytes += cost
	for s.bytes > s.maxBytes {
		old := s.lru.prev
		old.unlink()
		delete(s.m, old.key)
		s.bytes -= old.cost
	}
}

// take removes the entry stored under k and hands its parts to the caller,
// which may extend the entry by appending a part to more and store it again
// with putParts. Appending is safe while earlier readers still copy the
// entry out: get's callers read more only up to the length they saw, and
// the entry, being out of the cache, has no other owner to append to it.
func (c *tokenCache) take(k key128) (toks []uint32, more [][]uint32, ok bool) {
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e == nil {
		s.misses++
		return nil, nil, false
	}
	s.hits++
	e.unlink()
	delete(s.m, k)
	s.bytes -= e.cost
	return e.toks, e.more, true
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

// counters sums the shards' counters.
func (c *tokenCache) counters() CacheCounters {
	var out CacheCounters
	if c == nil {
		return out
	}
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		out.Hits += s.hits
		out.Misses += s.misses
		out.Entries += len(s.m)
		out.Bytes += s.bytes
		out.MaxBytes += s.maxBytes
		s.mu.Unlock()
	}
	return out
}
