package precise

import (
	"slices"
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
// immutable once stored. An entry of kind rdSeed or rdShared is keyed by
// the conversation key of the messages its requests share (all but their
// last): see learn.
type rdEntry struct {
	conv, body uint64
	toks       []uint32
	expires    int64 // unix nanoseconds, changed under the cache's lock only
	kind       rdKind
}

// rdKind says what an entry's tokens are.
type rdKind uint8

const (
	// rdTurn: the render of a request (body), for its own repeats and its
	// conversation's next turns.
	rdTurn rdKind = iota
	// rdSeed: the render of the first request seen to start from these
	// messages (body: its own conversation key), kept to learn their
	// tokens from the next one with other messages (learn); never served.
	rdSeed
	// rdShared: the tokens the renders of two or more requests starting
	// from these messages have in common, served as their prefix.
	rdShared
)

// rdSharedMin is the fewest tokens a shared prefix is kept with: below
// that it holds no block worth routing on, and the request waits for its
// render as before.
const rdSharedMin = 16

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
// none, the entry of the conversation's latest earlier turn, or else the
// prefix its messages but the last share with others' (rdShared), nil if
// neither. The entries' tokens may be read without the lock: they never
// change.
func (c *rdCache) lookup(k *rdKeys, now int64) (hit, prev *rdEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.get(k.conv, now); e != nil && e.Value.kind == rdTurn && e.Value.body == k.body {
		c.lru.Touch(e)
		return e.Value, nil
	}
	for _, p := range k.prev {
		if p == 0 {
			break
		}
		if e := c.get(p, now); e != nil && e.Value.kind != rdSeed {
			return nil, e.Value
		}
	}
	return nil, nil
}

// learn notes toks, the render of a request keyed k that started no
// conversation the cache knew of, under the key of its messages but the
// last (k.prev[0]): the first such render is kept as a seed; once a
// second request with another last message starts from the same messages, the
// tokens the two renders have in common (at least rdSharedMin) become a
// shared entry, which every later render from those messages shortens to
// what it has in common with it and keeps alive. A request beginning
// with those messages (a tenant's system prompt, a few-shot template, a
// shared document) is then answered from them at once (lookup, as a
// previous turn is). The common tokens may run a little into the last
// messages where two of them begin alike; the next render that differs
// there takes them back. It reports whether k's render was already
// within a shared entry's tokens but at most its last (stable, as a next
// turn's is within its previous turn's), or no shared entry was there.
func (c *rdCache) learn(k *rdKeys, toks []uint32, now int64) (stable bool) {
	key := k.prev[0]
	if key == 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.get(key, now)
	switch {
	case e == nil:
		c.put(key, &rdEntry{conv: key, body: k.conv, toks: toks, expires: now + int64(c.ttl), kind: rdSeed})
		return true
	case e.Value.kind == rdTurn:
		return true // a request of exactly these messages: its own entry
	case e.Value.kind == rdSeed && e.Value.body == k.conv:
		// The same messages again (other fields of the body, a repeat):
		// their render is no other request's.
		e.Value.expires = now + int64(c.ttl)
		return true
	}
	old := e.Value
	n := commonPrefix(old.toks, toks)
	if old.kind == rdShared && n == len(old.toks) {
		old.expires = now + int64(c.ttl)
		c.lru.Touch(e)
		return true
	}
	stable = old.kind != rdShared || n+1 >= len(old.toks)
	if n < rdSharedMin {
		c.lru.Remove(e)
		return stable
	}
	c.put(key, &rdEntry{conv: key, toks: slices.Clone(toks[:n]), expires: now + int64(c.ttl), kind: rdShared})
	return stable
}

// put keeps e under key, replacing any entry there, unless e alone is
// larger than the cache's bound. c.mu is held.
func (c *rdCache) put(key uint64, e *rdEntry) {
	if e.size() <= c.lru.MaxCost() {
		c.lru.Put(key, e)
	}
}

// commonPrefix returns how many tokens a and b begin with alike.
func commonPrefix(a, b []uint32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
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
	if superseded != nil && superseded.kind == rdTurn {
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
