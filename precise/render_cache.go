package precise

import (
	"sync"
	"time"

	"github.com/kvroute/kvroute/lru"
)

// rdKeys are the cache keys of one request. conv names the rendered
// conversation: for a chat request a chained hash of the model, the tools
// and every message's JSON as written, for a completions request a hash of
// the body. body is a hash of the whole body under another seed: an entry
// answers a request only when both match, so any field of the body that
// may shape the render (template arguments, add_generation_prompt, ...)
// is covered. prev are the conversation keys of the request's messages
// without their last one, two, ... rdPrevDepth messages, nearest first (0
// where there are none): where the conversation's earlier turns were
// stored. A turn adds two messages (an answer and a question), more with
// tool calls; and while the previous turn's render is still running in
// the background, the one before it is the latest there is (its tokens
// but the last are a prefix of this turn's as much as the previous turn's
// are).
type rdKeys struct {
	conv, body uint64
	prev       [rdPrevDepth]uint64
}

// rdPrevDepth is how many messages back lookup looks for an earlier turn's
// render: four turns of a plain conversation.
const rdPrevDepth = 8

// rdEntry is one cached render: the tokens of the body hashed to body,
// immutable once stored.
type rdEntry struct {
	conv, body uint64
	toks       []uint32
	expires    int64 // unix nanoseconds
}

// rdEntryOverhead is what an entry costs beyond its tokens, roughly: the
// struct, the cache's entry pointing at it and its map slot.
const rdEntryOverhead = 96

func (e *rdEntry) size() int64 { return int64(len(e.toks))*4 + rdEntryOverhead }

// rdCache holds the last render of each conversation, least recently used
// first out once its entries' size passes limit, and none past its ttl.
type rdCache struct {
	ttl time.Duration

	mu        sync.Mutex
	lru       lru.Cache[uint64, *rdEntry] // by conversation, bounded by the entries' size
	evictions uint64
}

func newRDCache(limit int64, ttl time.Duration) *rdCache {
	c := &rdCache{ttl: ttl}
	c.lru.Init(lru.Options[*rdEntry]{
		MaxCost: max(limit, 1),
		Cost:    (*rdEntry).size,
		Evicted: func(**rdEntry) { c.evictions++ },
	})
	return c
}

// lookup returns the entry that answers k (nil if none) and, when there is
// none, the entry of the conversation's latest earlier turn (nil if none).
// The entries' tokens may be read without the lock: they never change.
func (c *rdCache) lookup(k *rdKeys, now int64) (hit, prev *rdEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.get(k.conv, now); e != nil && e.Value.body == k.body {
		c.lru.Touch(e)
		return e.Value, nil
	}
	for _, p := range k.prev {
		if p == 0 {
			break
		}
		if e := c.get(p, now); e != nil {
			return nil, e.Value
		}
	}
	return nil, nil
}

// get returns the live entry of conv, dropping an expired one.
func (c *rdCache) get(conv uint64, now int64) *lru.Entry[uint64, *rdEntry] {
	e := c.lru.Peek(conv)
	if e != nil && now >= e.Value.expires {
		c.lru.Remove(e)
		return nil
	}
	return e
}

// store records toks (which the cache keeps: the caller must not change
// them) as the render of k, replacing any entry of the same conversation.
// superseded, the entry of the previous turn that the new render was
// compared with, is dropped: the conversation has moved past it.
func (c *rdCache) store(k *rdKeys, toks []uint32, superseded *rdEntry, now int64) {
	e := &rdEntry{conv: k.conv, body: k.body, toks: toks, expires: now + int64(c.ttl)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.size() > c.lru.MaxCost() {
		return
	}
	if superseded != nil {
		if s := c.lru.Peek(superseded.conv); s != nil && s.Value == superseded {
			c.lru.Remove(s)
		}
	}
	c.lru.Put(k.conv, e)
}

// counts returns the number of entries, their size and the evictions so far.
func (c *rdCache) counts() (entries, bytes, evictions uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return uint64(c.lru.Len()), uint64(max(c.lru.Cost(), 0)), c.evictions //nolint:gosec // sizes, not negative
}
