package sim

// kvCache is a paged KV cache with prefix caching, in blocks.
//
// Every block is in exactly one of three states:
//   - pinned: referenced by at least one running request (ref > 0);
//   - cached: unreferenced but holding a registered key, on the LRU list,
//     reusable by a hit or evictable;
//   - free: neither (only counted, not materialised).
//
// vLLM's usage metric counts pinned blocks only (cached blocks are in its
// free queue), and so does usage here.
type kvCache struct {
	total  int
	pinned int
	byKey  map[uint64]*kvBlock
	// LRU list of cached (unreferenced) blocks: head is least recently
	// used, evicted first.
	head, tail *kvBlock
	lruLen     int
	// log, when not nil, records every eviction of a keyed block.
	log *eventLog
}

// kvBlock is one KV block.
type kvBlock struct {
	key        uint64
	hashed     bool // registered in byKey under key
	ref        int
	prev, next *kvBlock
	onLRU      bool
}

func newKVCache(total int) *kvCache {
	return &kvCache{total: total, byKey: make(map[uint64]*kvBlock)}
}

// free is the number of blocks neither pinned nor cached.
func (c *kvCache) free() int { return c.total - c.pinned - c.lruLen }

// available is the number of blocks an allocation can get: free plus
// evictable cached ones.
func (c *kvCache) available() int { return c.total - c.pinned }

// usage is the share of pinned blocks (vLLM kv_cache_usage_perc).
func (c *kvCache) usage() float64 {
	if c.total == 0 {
		return 0
	}
	return float64(c.pinned) / float64(c.total)
}

// lookup returns the cached blocks of the unbroken leading run of keys, at
// most limit of them, without pinning them.
func (c *kvCache) lookup(keys []uint64, limit int) []*kvBlock {
	var out []*kvBlock
	for i, k := range keys {
		if i >= limit {
			break
		}
		b := c.byKey[k]
		if b == nil {
			break
		}
		out = append(out, b)
	}
	return out
}

// run is the length of the leading run of keys held: lookup's count,
// without collecting the blocks.
func (c *kvCache) run(keys []uint64) int {
	for i, k := range keys {
		if c.byKey[k] == nil {
			return i
		}
	}
	return len(keys)
}

// unpinnedCount counts the blocks of bs with ref 0 (they sit on the LRU
// list and would stop being evictable once pinned).
func unpinnedCount(bs []*kvBlock) int {
	n := 0
	for _, b := range bs {
		if b.ref == 0 {
			n++
		}
	}
	return n
}

// pin takes a reference on a cached or pinned block.
func (c *kvCache) pin(b *kvBlock) {
	if b.ref == 0 {
		c.lruRemove(b)
		c.pinned++
	}
	b.ref++
}

// alloc returns a new pinned block with no key, evicting the least recently
// used cached block if no block is free. The caller checks available().
func (c *kvCache) alloc() *kvBlock {
	if c.free() <= 0 {
		v := c.head
		if v == nil {
			panic("sim: kv cache allocation without space")
		}
		c.lruRemove(v)
		if v.hashed && c.byKey[v.key] == v {
			delete(c.byKey, v.key)
			if c.log != nil {
				c.log.removed(mediumGPU, v.key)
			}
		}
		v.hashed = false
	}
	c.pinned++
	return &kvBlock{ref: 1}
}

// register gives a computed block its key so later requests can hit it,
// and reports whether it did. If b already has a key, or another block
// already holds the key, b stays as it is (a duplicate stays anonymous).
func (c *kvCache) register(b *kvBlock, key uint64) bool {
	if b.hashed {
		return false
	}
	if _, dup := c.byKey[key]; dup {
		return false
	}
	b.key = key
	b.hashed = true
	c.byKey[key] = b
	return true
}

// reset drops every cached block: their keys go and they become free. The
// caller makes sure no block is pinned.
func (c *kvCache) reset() {
	for b := c.head; b != nil; {
		next := b.next
		b.prev, b.next, b.onLRU, b.hashed = nil, nil, false, false
		b = next
	}
	c.head, c.tail, c.lruLen = nil, nil, 0
	clear(c.byKey)
}

// release drops a reference; an unreferenced keyed block becomes cached at
// the most-recently-used end of the LRU list, an anonymous one free.
func (c *kvCache) release(b *kvBlock) {
	b.ref--
	if b.ref > 0 {
		return
	}
	if b.ref < 0 {
		panic("sim: kv block released twice")
	}
	c.pinned--
	if b.hashed {
		c.lruPush(b)
	}
}

func (c *kvCache) lruPush(b *kvBlock) {
	b.prev, b.next = c.tail, nil
	if c.tail != nil {
		c.tail.next = b
	} else {
		c.head = b
	}
	c.tail = b
	b.onLRU = true
	c.lruLen++
}

func (c *kvCache) lruRemove(b *kvBlock) {
	if !b.onLRU {
		return
	}
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		c.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.prev, b.next, b.onLRU = nil, nil, false
	c.lruLen--
}
