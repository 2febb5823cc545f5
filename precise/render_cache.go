package precise

import (
	"container/list"
	"sync"
	"time"
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
	expires    int64         // unix nanoseconds
	elem       *list.Element // in rdCache.lru
}

// rdEntryOverhead is what an entry costs beyond its tokens, roughly: the
// struct and its map slot.
const rdEntryOverhead = 96

func (e *rdEntry) size() int64 { return int64(len(e.toks))*4 + rdEntryOverhead }

// rdCache holds the last render of each conversation, least recently used
// first out once its entries' size passes limit, and none past its ttl.
type rdCache struct {
	limit int64
	ttl   time.Duration

	mu        sync.Mutex
	byConv    map[uint64]*rdEntry
	lru       list.List // of *rdEntry, most recently used first
	bytes     int64
	evictions uint64
}

func newRDCache(limit int64, ttl time.Duration) *rdCache {
	return &rdCache{limit: limit, ttl: ttl, byConv: make(map[uint64]*rdEntry)}
}

// lookup returns the entry that answers k (nil if none) and, when there is
// none, the entry of the conversation's latest earlier turn (nil if none).
// The entries' tokens may be read without the lock: they never change.
func (c *rdCache) lookup(k *rdKeys, now int64) (hit, prev *rdEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.get(k.conv, now); e != nil && e.body == k.body {
		c.lru.MoveToFront(e.elem)
		return e, nil
	}
	for _, p := range k.prev {
		if p == 0 {
			break
		}
		if e := c.get(p, now); e != nil {
			return nil, e
		}
	}
	return nil, nil
}

// get returns the live entry of conv, dropping an expired one.
func (c *rdCache) get(conv uint64, now int64) *rdEntry {
	e := c.byConv[conv]
	if e != nil && now >= e.expires {
		c.remove(e)
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
	if e.size() > c.limit {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if superseded != nil && c.byConv[superseded.conv] == superseded {
		c.remove(superseded)
	}
	if old := c.byConv[k.conv]; old != nil {
		c.remove(old)
	}
	c.byConv[k.conv] = e
	e.elem = c.lru.PushFront(e)
	c.bytes += e.size()
	for c.bytes > c.limit {
		c.remove(c.lru.Back().Value.(*rdEntry))
		c.evictions++
	}
}

// counts returns the number of entries, their size and the evictions so far.
func (c *rdCache) counts() (entries, bytes, evictions uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return uint64(len(c.byConv)), uint64(max(c.bytes, 0)), c.evictions //nolint:gosec // sizes, not negative
}

func (c *rdCache) remove(e *rdEntry) {
	delete(c.byConv, e.conv)
	c.lru.Remove(e.elem)
	c.bytes -= e.size()
}
